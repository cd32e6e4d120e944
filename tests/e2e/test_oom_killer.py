"""A rank ended by the OOM killer of the job's memory cgroup: the demo on 2 processes under
``bash tools/dist_train.sh``, with its own DataLoader workers, in a memory cgroup of its own;
at iteration 2 rank 1 limits the cgroup to what the job uses then plus 1 GiB (measured there,
without swap) and fills host memory. The kernel's OOM killer ends rank 1 with SIGKILL; the
screen names the rank, the cgroup's count of OOM kills during the run, its limit and the cause.
Skipped where no memory cgroup can be made (cgroup v1 or v2, as root)."""
import json
import os
import os.path as osp
import time
import uuid

import pytest

from mmddp_ext.node.facts import memory_cgroup
from mmddp_ext.utils.units import format_mib

from conftest import DEMO_WORKERS, demo_options, demo_with_hooks, run


def _make_cgroup() -> str:
    """A child of this process's memory cgroup (the test's hook limits it); '' if none."""
    parent = memory_cgroup()
    if not parent:
        return ''
    folder = osp.join(parent, f'mmddp_test_{uuid.uuid4().hex[:8]}')
    try:
        os.mkdir(folder)
    except OSError:
        return ''
    if not osp.exists(osp.join(folder, 'cgroup.procs')):
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
        proc = run(['bash', '-c', script, 'job', cfg, '2', '--work-dir', work, *opts], timeout=600,
                   env=dict(MMDDP_TEST_CGROUP=folder))
    finally:
        _remove(folder)
    out = proc.stdout
    assert proc.returncode != 0, out[-5000:]
    assert 'held and not killed' not in out, out[-5000:]  # the limit held
    fault = json.load(open(osp.join(work, 'fault_rank1.json')))
    screen = out[out.index('==== mmddp_ext diagnosis'):]
    limit = format_mib(fault['limit'])  # what the job used at iteration 2, plus 1 GiB
    assert f'pid {fault["pid"]}) was killed by SIGKILL after completing iteration 1' in screen, \
        screen
    assert f'memory cgroup {folder} (limit {limit}): its OOM killer ended 1 process(es) during ' \
        'this run (oom_kill 0 -> 1)' in screen, screen
    assert "host RSS" in screen and f"of its memory cgroup's limit, {limit}" in screen, screen
    assert "cause: the out-of-memory killer of the job's memory cgroup chose this rank" in screen
    assert 'fix: if memory: fewer DataLoader workers' in screen
