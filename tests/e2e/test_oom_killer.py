"""A rank ended by the OOM killer of the job's memory cgroup: the demo on 2 processes under
``bash tools/dist_train.sh``, with its own DataLoader workers, in a memory cgroup of its own
(3 GiB, no swap), and rank 1 filling host memory at iteration 2. The kernel's OOM killer ends
rank 1 with SIGKILL; the screen names the rank, the cgroup's count of OOM kills during the run
and the cause. Skipped where no memory cgroup can be made (cgroup v1 or v2, as root)."""
import json
import os
import os.path as osp
import time
import uuid

import pytest

from mmddp_ext.node.facts import memory_cgroup

from conftest import DEMO_WORKERS, demo_options, demo_with_hooks, run

LIMIT = 3 * 2**30


def _make_cgroup() -> str:
    """A child of this process's memory cgroup, limited to LIMIT without swap; '' if none."""
    parent = memory_cgroup()
    if not parent:
        return ''
    folder = osp.join(parent, f'mmddp_test_{uuid.uuid4().hex[:8]}')
    try:
        os.mkdir(folder)
        v2 = osp.exists(osp.join(folder, 'memory.max'))
        settings = ([('memory.max', LIMIT),
                     ('memory.swap.max', 0)] if v2 else [('memory.limit_in_bytes', LIMIT),
                                                         ('memory.memsw.limit_in_bytes', LIMIT)])
        for name, value in settings:
            if osp.exists(osp.join(folder, name)):
                with open(osp.join(folder, name), 'w') as f:
                    f.write(str(value))
    except OSError:
        _remove(folder)
        return ''
    return folder


def _remove(folder: str) -> None:
    deadline = time.monotonic() + 30
    while osp.isdir(folder) and time.monotonic() < deadline:
        try:
            os.rmdir(folder)
        except OSError:
            time.sleep(0.5)  # its last processes are still being reaped


@pytest.mark.slow
def test_a_rank_ended_by_the_cgroups_oom_killer_is_named_with_the_count(demo_data, tmp_path):
    folder = _make_cgroup()
    if not folder:
        pytest.skip('no memory cgroup can be made here (cgroup v1 or v2, as root)')
    try:
        cfg = demo_with_hooks(tmp_path, "dict(type='FaultHook', rank=1, at_iter=2, fault='grow')",
                              ['fault_hook'], 'grow.py')
        work = str(tmp_path / 'w')
        opts = demo_options(demo_data, 2, **DEMO_WORKERS)
        procs = osp.join(folder, 'cgroup.procs')
        script = f'echo $$ > {procs} && exec bash tools/dist_train.sh "$@"'
        proc = run(['bash', '-c', script, 'job', cfg, '2', '--work-dir', work, *opts], timeout=600)
    finally:
        _remove(folder)
    out = proc.stdout
    assert proc.returncode != 0, out[-5000:]
    assert 'held and not killed' not in out, out[-5000:]  # the limit held
    fault = json.load(open(osp.join(work, 'fault_rank1.json')))
    screen = out[out.index('==== mmddp_ext diagnosis'):]
    assert f'pid {fault["pid"]}) was killed by SIGKILL after completing iteration 1' in screen, \
        screen
    assert f'memory cgroup {folder} (limit 3072 MiB): its OOM killer ended 1 process(es) during ' \
        'this run (oom_kill 0 -> 1)' in screen, screen
    assert "host RSS" in screen and "of its memory cgroup's limit, 3072 MiB" in screen, screen
    assert "cause: the out-of-memory killer of the job's memory cgroup chose this rank" in screen
    assert 'fix: if memory: fewer DataLoader workers' in screen
