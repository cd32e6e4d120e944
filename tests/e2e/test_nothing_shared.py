"""Two nodes that share only the network: two ``bash tools/dist_train.sh CFG 1`` fronts
(``NNODES=2``, ``NODE_RANK=0/1``), each in a mount namespace of its own with a private tmpfs at
the same path, holding its working directory, its copy of the data and config, and its
work_dir. The demo validates after each of its 2 epochs: the results travel through the
process group (``PatientEvaluator``), not through MMEngine's ``.dist_test/`` folder, which the
other node does not see; the metrics equal one process's on the same checkpoint. Skipped where
mount namespaces cannot be made (not root, no ``unshare``)."""
import os
import os.path as osp
import re
import shutil
import subprocess

import pytest

from mmddp_ext.launcher.rendezvous import find_free_port

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, run

METRIC = re.compile(r'Epoch\(val\) \[(\d+)\]\[\d+/\d+\]\s+(coco/AP: [-0-9.]+)')
ONE_AT_A_TIME = {'val_dataloader.batch_size': '1', 'test_dataloader.batch_size': '1'}


def _namespaces() -> str:
    """Why private mounts cannot be made here ('' where they can)."""
    if shutil.which('unshare') is None:
        return 'no unshare command'
    probe = subprocess.run(
        ['unshare', '-m', '--propagation', 'private', 'sh', '-c', 'mount -t tmpfs none /mnt'],
        capture_output=True, text=True)
    return '' if probe.returncode == 0 else f'unshare -m: {probe.stderr.strip()[:200]}'


def _node(rank: int, private: str, out: str, data: str, port: int, opts: list):
    """One node's front, in its own mount namespace: its tmpfs at ``private``; what it wrote
    is copied to ``out`` before the namespace (and the tmpfs) goes away."""
    script = ('set -u; mount -t tmpfs -o size=1g none "$P" && cp -r "$DATA" "$P/data" && '
              'cp "$CFG" "$P/cfg.py" && cd "$P" && '
              'bash "$ROOT/tools/dist_train.sh" cfg.py 1 --work-dir w "$@"; rc=$?; '
              'ls -a "$P" > "$OUT/listing.txt"; cp -r w "$OUT/w"; exit $rc')
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''), NNODES='2',
               NODE_RANK=str(rank), MASTER_ADDR='127.0.0.1', PORT=str(port), P=private, DATA=data,
               CFG=DEMO_CONFIG, OUT=out, ROOT=ROOT)
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT'):
        env.pop(key, None)
    os.makedirs(out)
    return subprocess.Popen(
        ['unshare', '-m', '--propagation', 'private', 'bash', '-c', script, 'node', *opts], env=env,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_nodes_that_share_nothing_validate_every_epoch(demo_data, tmp_path):
    why = _namespaces()
    if why:
        pytest.skip(f'no private mounts: {why}')
    private = str(tmp_path / 'node')  # each node's own tmpfs is mounted here
    os.makedirs(private)
    opts = demo_options(
        osp.join(private, 'data'), 2, validate=True, **ONE_AT_A_TIME,
        **{'train_cfg.val_interval': '1'})
    port = find_free_port()
    procs = [_node(r, private, str(tmp_path / f'out{r}'), demo_data, port, opts) for r in (0, 1)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-6000:]
    assert os.listdir(private) == []  # nothing was written where the other node could see it
    validated = dict(METRIC.findall(outs[0]))
    assert sorted(validated) == ['1', '2'], outs[0][-4000:]
    # each node's own folder: MMEngine's result folder was never made on either
    for r in (0, 1):
        assert '.dist_test' not in open(tmp_path / f'out{r}' / 'listing.txt').read()

    # one process on node 0's last checkpoint, the same val set: the same metric
    checkpoint = str(tmp_path / 'out0' / 'w' / 'epoch_2.pth')
    cfg = str(tmp_path / 'demo.py')
    shutil.copy(DEMO_CONFIG, cfg)
    one = check_ok(
        run([
            PYTHON,
            _test_py(), cfg, checkpoint, '--work-dir',
            str(tmp_path / 'one'), '--cfg-options', *demo_options(demo_data, 2, **ONE_AT_A_TIME)[1:]
        ], timeout=600))
    alone = re.search(r'(coco/AP: [-0-9.]+)', one)
    assert alone and alone[1] == validated['2'], (alone, validated)


def _test_py() -> str:
    import mmpose
    return osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools', 'test.py')
