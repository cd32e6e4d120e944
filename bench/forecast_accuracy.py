"""How close the memory forecast (``--explain --memory``) comes to the peaks of a real run.

For each per-device batch (default 8, 16, 32) on the 128×128 demo, 2 gloo processes
(``scaling.global_batch_size`` = 2 × batch):

1. the forecast, ``dist_train.py CONFIG --explain --memory --json --world-size 2``: the
   predicted peak of each rank and how long the forecast took (its own ``seconds`` and the
   whole command's wall time);
2. a real 2-process run of one epoch (``dist_train.sh CONFIG 2``, no validation) with
   ``RankMemoryHook(interval=1)``: the largest ``peak_rss`` each rank logged in
   ``memory/rank{R}.jsonl``, and the peak RSS polled from outside (:func:`common.watch`);
3. the error of the forecast per rank, ``(predicted - measured) / measured``.

With ``--single`` the same for 1 process at the planned batch 32. Writes
``bench/results/forecast_accuracy.json``.

Usage: ``python bench/forecast_accuracy.py [--batches 8 16 32] [--single] [--config PATH]
[--cfg-options KEY=VALUE ...] [--name RESULTS]``, e.g. ResNet-50: ``--cfg-options
model.backbone.depth=50 model.head.in_channels=2048 --batches 4 8 --name
forecast_accuracy_res50``
"""
import argparse
import glob
import json
import os.path as osp
import tempfile
from typing import List

from common import PYTHON, ROOT, data_options, demo_data, save, watch

CONFIG = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-128x128.py')
HOOKED = ("_base_ = [{base!r}]\ncustom_imports = dict(imports=['mmddp_ext'], "
          "allow_failed_imports=False)\ncustom_hooks = [dict(type='RankMemoryHook', interval=1)]\n")


def hooked_config(base: str) -> str:
    """``base`` with a memory sample after every iteration (a file in a temporary folder)."""
    path = osp.join(tempfile.mkdtemp(prefix='mmddp_forecast_'), 'hooked.py')
    with open(path, 'w') as f:
        f.write(HOOKED.format(base=base))
    return path


def forecast(config: str, world: int, options: List[str]) -> dict:
    """The ``memory`` object of ``--explain --memory --json``, plus the command's wall time."""
    r = watch([
        PYTHON, 'tools/dist_train.py', config, '--explain', '--memory', '--json', '--world-size',
        str(world), '--cfg-options', *options
    ])
    log = r.pop('log')
    if r['rc'] != 0:
        raise RuntimeError(f'forecast failed (exit {r["rc"]}): {log[-2000:]}')
    out = json.loads(log.strip().splitlines()[-1])
    return dict(out['memory'], wall_s=r['seconds'],
                per_device_batch_size=out['per_device_batch_size'])


def measure(config: str, world: int, options: List[str]) -> dict:
    """A real run: per-rank largest ``peak_rss`` from RankMemoryHook (MiB) and polled RSS."""
    work = tempfile.mkdtemp(prefix='mmddp_forecast_run_')
    cmd = (['bash', 'tools/dist_train.sh', config,
            str(world)] if world > 1 else [PYTHON, 'tools/dist_train.py', config])
    r = watch(cmd + ['--work-dir', work, '--cfg-options', *options])
    r.pop('log')
    logged = {}
    for path in sorted(glob.glob(osp.join(work, '*', 'memory', 'rank*.jsonl'))):
        rank = int(osp.basename(path)[4:-6])
        logged[rank] = round(max(json.loads(x)['peak_rss'] for x in open(path)) / 2**20, 1)
    return dict(rc=r['rc'], seconds=r['seconds'], logged_peak_rss_mib=logged,
                polled_peak_rss_mib=r['peak_rss_mib'])


def compare(name: str, config: str, world: int, batch: int, data: str, extra: List[str]) -> dict:
    options = data_options(
        data, 1) + [f'scaling.global_batch_size={world * batch}', 'train_cfg.val_begin=2'] + extra
    predicted = forecast(config, world, options)
    assert predicted['per_device_batch_size'] == batch, predicted['per_device_batch_size']
    real = measure(hooked_config(config), world, options)
    errors = {
        r: round((predicted['predicted_peak_mib'][r] - m) / m, 4)
        for r, m in real['logged_peak_rss_mib'].items()
    }
    print(
        f'{name}: batch {batch} x {world}: predicted {predicted["predicted_peak_mib"]} MiB, '
        f'measured {real["logged_peak_rss_mib"]} MiB, error {errors}, forecast '
        f'{predicted["seconds"]} s ({predicted["wall_s"]} s with start-up)', flush=True)
    return dict(world=world, batch=batch, forecast=predicted, run=real, error=errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batches', type=int, nargs='+', default=[8, 16, 32])
    parser.add_argument('--single', action='store_true', help='also 1 process at batch 32')
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument(
        '--cfg-options', nargs='*', default=[],
        help='more config overrides, e.g. model.backbone.depth=50 '
        'model.head.in_channels=2048')
    parser.add_argument('--name', default='forecast_accuracy', help='results file name')
    args = parser.parse_args()
    data = demo_data(num_train=128)
    rows = [compare('ddp', args.config, 2, b, data, args.cfg_options) for b in args.batches]
    if args.single:
        rows.append(compare('single', args.config, 1, 32, data, args.cfg_options))
    worst = max(abs(e) for row in rows for e in row['error'].values())
    print(
        save(
            args.name,
            dict(
                config=osp.relpath(args.config, ROOT), options=args.cfg_options, rows=rows,
                worst_abs_error=worst)))


if __name__ == '__main__':
    main()
