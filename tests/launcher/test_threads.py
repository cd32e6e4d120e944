"""Threads per rank under ``bash tools/dist_train.sh`` (torchrun sets ``OMP_NUM_THREADS=1`` for
several processes per node, which a rank cannot tell from a user's 1): where the user's
environment has none, each rank gets its share of the node's cores, less one per DataLoader
worker, and rank 0 says so; a user's own ``OMP_NUM_THREADS`` is kept as it is, silently."""
import os
import re
import subprocess

import pytest

from conftest import DEMO_WORKERS, ROOT, demo_options, read_records, recording_config

LINE = re.compile(r'threads per process: (\d+) \((\d+) cores shared by 2 processes on this node, '
                  r'less its 2 DataLoader worker\(s\); OMP_NUM_THREADS was not set')


def _dist_train(tmp_path, demo_data, name: str, omp):
    rec = str(tmp_path / f'rec_{name}')
    cfg = recording_config(tmp_path, rec)
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    for key in ('OMP_NUM_THREADS', 'RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR',
                'MASTER_PORT'):
        env.pop(key, None)
    if omp is not None:
        env['OMP_NUM_THREADS'] = omp
    out = subprocess.run([
        'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
        str(tmp_path / f'w_{name}'), *demo_options(demo_data, 1, **DEMO_WORKERS)
    ], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert out.returncode == 0, out.stdout[-5000:]
    return out.stdout, read_records(rec)


@pytest.mark.slow
def test_ranks_share_the_cores_unless_the_user_chose(demo_data, tmp_path):
    from mmddp_ext.node.facts import cpus
    out, records = _dist_train(tmp_path, demo_data, 'unset', None)
    m = LINE.search(out)
    assert m, out[-5000:]  # torchrun's 1 was taken for what it is: no choice of the user's
    expected = max(1, cpus() // 2 - 2)
    assert int(m[1]) == expected and int(m[2]) == cpus()
    assert {r['threads'] for r in records.values()} == {expected} and len(records) == 2
    out, records = _dist_train(tmp_path, demo_data, 'chosen', '2')
    assert 'threads per process:' not in out
    assert {r['threads'] for r in records.values()} == {2}  # the user's, kept
