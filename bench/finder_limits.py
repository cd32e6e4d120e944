"""Does a batch the finder picks always train? The issue's scenario over a sweep of limits.

The 128×128 demo on 2 gloo processes, global batch 64, ``max_batch_per_device='auto'`` with
``memory_budget_mib=3000``, and rank 1 limited from start-up to each of ``--limits`` MiB (a
smaller device, ``tests.helpers.limit_rank``). Every run must either train to the end (with a
step down logged when training needed more than the trial), or stop before training with one
line saying that nothing fits; never an out-of-memory crash after the finder said "fits".

For each limit: the outcome, the finder's trials and answer, the plan, whether training
stepped down, the finder's check after the first optimizer step (what rank 1 holds beyond the
trials, against what they kept free), and the exit code. Writes
``bench/results/finder_limits.json``.

Usage: ``python bench/finder_limits.py [--limits 700 850 1000 1150 1300] [--epochs 1] [--reps 3]``
"""
import argparse
import os.path as osp
import re
import tempfile

from common import ROOT, data_options, demo_data, save, watch

CONFIG = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-128x128.py')
LIMITED = "_base_ = [{base!r}]\ncustom_imports = dict(imports=['mmddp_ext', " \
          "'tests.helpers.limit_rank'], allow_failed_imports=False)\n"


def outcome(rc: int, log: str) -> str:
    """'trained', 'trained after a step down', 'nothing fits (clean stop)' or 'crashed'."""
    if rc == 0 and 'Epoch(train)' in log:
        return ('trained after a step down'
                if 'training goes on with per-device batch' in log else 'trained')
    if 'not even a per-device batch of 1 fits' in log and 'Epoch(train)' not in log:
        return 'nothing fits (clean stop)'
    return 'crashed'


def _local(line: str) -> str:
    """A log line without this machine's paths (interpreter, site-packages, temporary dirs)."""
    line = re.sub(r'/\S*/site-packages/', 'site-packages/', line)
    return re.sub(r'/\S*/bin/python\S*', 'python', line)


def run_limit(config: str, options: list, limit: int) -> dict:
    work = tempfile.mkdtemp(prefix=f'mmddp_limit{limit}_')
    r = watch(
        ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', work, '--cfg-options', *options],
        env=dict(MMDDP_TEST_LIMIT=f'1:{limit}'))
    log = r.pop('log')
    trials = re.findall(
        r'batch probe: trial \d+: per-device batch (\d+): (fits|out of memory '
        r'on rank\(s\) \[[\d, ]*\])', log)
    found = re.search(r'batch probe: per-device batch (\d+) fits on every rank', log)
    plan = re.search(r'plan +(per-GPU batch [^\n(]*)', log)
    step = re.findall(r'training goes on with (per-device batch .*? samples)', log)
    check = re.search(r'batch probe check: .*?rank 1 (\d+) MiB of (\d+)', log)
    res = dict(limit_mib=limit, rc=r['rc'], outcome=outcome(r['rc'], log), trials=[
        (int(b), v) for b, v in trials
    ], found=int(found[1]) if found else None, plan=plan[1].strip() if plan else None,
               steps_down=step, rank1_beyond_trials_mib=int(check[1]) if check else None,
               rank1_kept_free_mib=int(check[2]) if check else None, seconds=r.get('seconds'),
               peak_rss_mib=r.get('peak_rss_mib'),
               last_lines=[_local(ln) for ln in log.strip().splitlines()[-12:]])
    print(
        f"limit {limit} MiB: {res['outcome']}; found {res['found']} in {len(trials)} trials; "
        f"plan {res['plan']}; steps down {step or 'none'}; rank 1 holds "
        f"{res['rank1_beyond_trials_mib']} of {res['rank1_kept_free_mib']} MiB kept free; "
        f"rc {r['rc']}", flush=True)
    if res['outcome'] != 'trained':
        print('\n'.join(res['last_lines']), flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--limits', type=int, nargs='+', default=[700, 850, 1000, 1150, 1300])
    parser.add_argument('--epochs', type=int, default=1)
    parser.add_argument('--reps', type=int, default=1, help='runs per limit')
    args = parser.parse_args()
    data = demo_data(num_train=128)
    config = osp.join(tempfile.mkdtemp(prefix='mmddp_limits_'), 'limited.py')
    with open(config, 'w') as f:
        f.write(LIMITED.format(base=CONFIG))
    options = data_options(data, args.epochs) + [
        'scaling.global_batch_size=64', f'train_cfg.val_begin={args.epochs + 1}',
        'scaling.max_batch_per_device=auto', 'scaling.memory_budget_mib=3000'
    ]
    runs = [run_limit(config, options, limit) for _ in range(args.reps) for limit in args.limits]
    print(save('finder_limits', dict(runs=runs, epochs=args.epochs, reps=args.reps)))


if __name__ == '__main__':
    main()
