"""The cause and fix for a rank whose DataLoader worker died by itself, from torch's own message
(its text in torch 2.x: torch/utils/data/_utils/signal_handling.py and dataloader.py)."""
import pytest

from mmddp_ext.diagnose.deaths import (cgroup_count, cgroup_lines, death_lines, shared_memory_lines,
                                       worker_death_lines)


@pytest.mark.parametrize('message, cause, fix', [
    ('DataLoader worker (pid 2762) is killed by signal: Killed.',
     "worker (pid 2762) died of SIGKILL, alone: most often the host's out-of-memory killer",
     'fewer DataLoader workers'),
    ('DataLoader worker (pid 31) is killed by signal: Bus error. It is possible that dataloader'
     "'s workers are out of shared memory. Please try to raise your shared memory limit.",
     'worker (pid 31) died of a bus error: most often shared memory (/dev/shm)',
     'docker run --shm-size=8g'),
    ('DataLoader worker (pid 7) is killed by signal: Segmentation fault.',
     'worker (pid 7) died of a crash in the worker', 'num_workers=0'),
    ('DataLoader worker (pid(s) 12, 13) exited unexpectedly',
     'worker (pid 12, 13) died of a crash in the worker', 'num_workers=0'),
])
def test_a_worker_that_died_by_itself_is_the_cause(message, cause, fix):
    lines = worker_death_lines(message)
    assert len(lines) == 2 and cause in lines[0] and lines[1].startswith('  fix: ')
    assert fix in lines[1]


@pytest.mark.parametrize(
    'message',
    [
        'injected fault on rank 1 at iteration 3',
        'Connection closed by peer [127.0.0.1]:8097',
        "Caught ValueError in DataLoader worker process 0.",  # the worker raised: its own error
    ])
def test_any_other_message_adds_nothing(message):
    assert worker_death_lines(message) == []


@pytest.mark.parametrize('message', [
    'DataLoader worker 0 (pid 9) could not hand its batch to its rank through shared memory: '
    '/dev/shm on host vm has 1.00 MiB, 0 B free, for a batch of 465.06 KiB',
    'unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)',
])
def test_a_full_dev_shm_is_the_cause(message):
    lines = shared_memory_lines(message)
    assert len(lines) == 2 and '/dev/shm is too small' in lines[0]
    assert '--shm-size' in lines[1] and 'num_workers' in lines[1]
    assert shared_memory_lines('Connection closed by peer [127.0.0.1]:8097') == []


STATE = dict(host='node1', memory_cgroup='/cg/job', oom_kills_at_start=3, completed_iter=4)
KILLED = dict(rank=1, pid=77, exitcode=-9, host='node1')


def test_the_cgroups_oom_kills_during_the_run_are_the_cause():
    count = cgroup_count(STATE, 'node1', read=lambda folder: 4)
    assert count['killed'] == 1 and count['before'] == 3 and count['now'] == 4
    lines = death_lines(KILLED, STATE, [], None, cgroup=count)
    text = '\n'.join(lines)
    assert 'memory cgroup /cg/job' in text and 'ended 1 process(es) during this run' in text
    assert "cause: the out-of-memory killer of the job's memory cgroup chose this rank" in text
    assert 'likely:' not in text


def test_no_kill_in_the_cgroup_leaves_the_likely_causes():
    count = cgroup_count(STATE, 'node1', read=lambda folder: 3)
    text = '\n'.join(death_lines(KILLED, STATE, [], None, cgroup=count))
    assert 'no OOM kill during this run (oom_kill 3)' in text and 'likely:' in text


@pytest.mark.parametrize('state, host, why', [
    (STATE, 'node0', 'read on host node1 only'),
    ({
        **STATE, 'memory_cgroup': None
    }, 'node1', 'the rank recorded no memory cgroup'),
    ({
        **STATE, 'oom_kills_at_start': None
    }, 'node1', 'has no oom_kill count'),
])
def test_what_could_not_be_read_is_said(state, host, why):
    count = cgroup_count(state, host, read=lambda folder: 4)
    assert why in count['why']
    assert cgroup_lines(count)[0].startswith(
        '  memory cgroup: its OOM kill count could not be read')
