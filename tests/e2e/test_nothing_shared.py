"""Two nodes that share only the network: two ``bash tools/dist_train.sh CFG 1`` fronts
(``NNODES=2``, ``NODE_RANK=0/1``), each in a mount namespace of its own, where a folder of its
own is mounted at the same path, holding its working directory, its copy of the data and
config, and its work_dir. Skipped where mount namespaces cannot be made (not root, no
``unshare``).

- Validation after each epoch: the results travel through the process group
  (``PatientEvaluator``), not through MMEngine's ``.dist_test/`` folder, which the other node
  does not see; the metrics equal one process's on the same checkpoint.
- ``--resume`` with the work dir on each node's own disk: the run says the work dir is not
  shared, rank 0 sends its checkpoint to rank 1, and both resume at the same epoch.
"""
import os
import os.path as osp
import re
import shutil
import subprocess

import pytest

from mmddp_launch.rendezvous import find_free_port

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


@pytest.fixture
def nodes(tmp_path, demo_data):
    """``start(options) -> [output of node 0, of node 1]``: one run of the two nodes; node
    ``r``'s own folder ``tmp_path/disk{r}`` is what it sees at ``tmp_path/node``."""
    why = _namespaces()
    if why:
        pytest.skip(f'no private mounts: {why}')
    mount_point = tmp_path / 'node'
    mount_point.mkdir()

    def start(options: list) -> list:
        port = find_free_port()
        procs = [
            _node(r, str(mount_point), str(tmp_path / f'disk{r}'), demo_data, port, options)
            for r in (0, 1)
        ]
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for p, out in zip(procs, outs):
            assert p.returncode == 0, out[-6000:]
        assert os.listdir(mount_point) == []  # nothing was written where both nodes see it
        return outs

    start.mount_point = str(mount_point)
    return start


def _node(rank: int, mount_point: str, disk: str, data: str, port: int, options: list):
    """One node's front, in its own mount namespace: its ``disk`` mounted at ``mount_point``."""
    script = ('set -u; mount --bind "$DISK" "$P" && cd "$P" && '
              '{ [ -d data ] || cp -r "$DATA" data; } && cp "$CFG" cfg.py && '
              'exec bash "$ROOT/tools/dist_train.sh" cfg.py 1 --work-dir w "$@"')
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''), NNODES='2',
               NODE_RANK=str(rank), MASTER_ADDR='127.0.0.1', PORT=str(port), P=mount_point,
               DISK=disk, DATA=data, CFG=DEMO_CONFIG, ROOT=ROOT)
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT'):
        env.pop(key, None)
    os.makedirs(disk, exist_ok=True)
    return subprocess.Popen(
        ['unshare', '-m', '--propagation', 'private', 'bash', '-c', script, 'node', *options],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_nodes_that_share_nothing_validate_every_epoch(nodes, demo_data, tmp_path):
    outs = nodes(
        demo_options(
            osp.join(nodes.mount_point, 'data'), 2, validate=True, **ONE_AT_A_TIME,
            **{'train_cfg.val_interval': '1'}))
    validated = dict(METRIC.findall(outs[0]))
    assert sorted(validated) == ['1', '2'], outs[0][-4000:]
    for r in (0, 1):  # MMEngine's result folder was made on neither node
        assert not osp.exists(tmp_path / f'disk{r}' / '.dist_test')

    # one process on node 0's last checkpoint, the same val set: the same metric
    checkpoint = str(tmp_path / 'disk0' / 'w' / 'epoch_2.pth')
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


@pytest.mark.slow
def test_resume_with_a_work_dir_on_each_nodes_own_disk(nodes, tmp_path):
    data = osp.join(nodes.mount_point, 'data')
    first = nodes(demo_options(data, 1))
    assert 'is not shared: rank 0 writes there, and rank 1 on' in ' '.join(
        first[0].split()), first[0][-4000:]
    saved = tmp_path / 'disk0' / 'w' / 'epoch_1.pth'
    assert saved.is_file() and not (tmp_path / 'disk1' / 'w' / 'epoch_1.pth').exists()

    again = nodes(demo_options(data, 2) + ['--resume'])
    # rank 0's checkpoint reached node 1, byte for byte, and both ranks went on from it
    assert 'from rank 0 to rank 1, which did not have it' in ' '.join(again[0].split())
    assert (tmp_path / 'disk1' / 'w' / 'epoch_1.pth').read_bytes() == saved.read_bytes()
    assert 'Epoch(train) [2]' in again[0] and 'Epoch(train) [1]' not in again[0]
    assert '2 ranks agree' in again[0] and 'starting at epoch 1, iteration 2' in again[0]
    assert (tmp_path / 'disk0' / 'w' / 'epoch_2.pth').is_file()


def _test_py() -> str:
    import mmpose
    return osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools', 'test.py')
