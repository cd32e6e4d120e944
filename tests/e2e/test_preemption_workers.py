"""A stop signal that reaches every process of the job, DataLoader workers included (Slurm's
preemption and ``scancel --signal`` signal every process of the step, a terminal its process
group), with the demo's own workers (2, persistent as in MMPose's recipes): every rank saves
after the iteration they agree on and exits with 75, and ``--resume`` trains every iteration
and sample exactly once, as a run that was never stopped. Before the workers left the stop to
their rank, each rank died in its next batch with torch's ``DataLoader worker (pid …) is
killed by signal: Terminated``, exit 1, and no checkpoint."""
import os.path as osp
import signal

import psutil
import pytest

from conftest import DEMO_WORKERS, demo_options, demo_with_hooks, finish, popen, stop_point_by_hand
from tests.helpers.stop_point_hook import (STOP_OPTIONS, hook_source, job_processes,
                                           trained_iterations, wait_for)

pytestmark = pytest.mark.slow

EPOCHS = 2


def test_a_stop_signal_to_every_process_saves_and_resume_trains_each_batch_once(
        stop_point_reference, demo_data, tmp_path):
    """SIGTERM to the ranks started by hand and their workers. SIGUSR1 to every process:
    ``dist_train.sh`` below and ``tests/slurm/test_preemption.py`` (``scancel --full``)."""
    signum = signal.SIGTERM
    flags, work = str(tmp_path / 'flags'), str(tmp_path / 'w')
    config = demo_with_hooks(tmp_path, hook_source(flags, 10), ['stop_point_hook'])
    procs = stop_point_by_hand(config, work, demo_data, options=DEMO_WORKERS)
    alive = lambda: all(p.poll() is None for p in procs)  # noqa: E731
    wait_for([osp.join(flags, f'paused_rank{r}') for r in (0, 1)], alive=alive)
    everyone = job_processes(procs)
    assert len(everyone) >= 2 * 3, everyone  # each rank and its 2 workers
    for process in everyone:
        process.send_signal(signum)
    wait_for([osp.join(flags, f'received_rank{r}') for r in (0, 1)], alive=alive)
    open(osp.join(flags, 'go'), 'w').close()
    results = finish(procs)
    out = results[0][1]
    assert [rc for rc, _ in results] == [75, 75], out[-3000:]
    assert 'is killed by signal' not in ''.join(o for _, o in results)
    assert f'saved {work}/iter_12.pth' in out, out[-3000:]

    results = finish(stop_point_by_hand(config, work, demo_data, ['--resume'], DEMO_WORKERS))
    out = results[0][1]
    assert [rc for rc, _ in results] == [0, 0], out[-3000:]
    assert 'continuing at batch 5' in out
    trained = trained_iterations(flags, 2)
    for rank in (0, 1):  # the same iterations, with the same samples, each once
        assert trained[rank] == stop_point_reference[rank]


# SIGTERM to every process: by hand above (the ranks and their workers, as here)
@pytest.mark.parametrize('signum, whom, restarts', [(signal.SIGUSR1, 'all', '0'),
                                                    (signal.SIGTERM, 'script', '2')])
def test_dist_train_sh_waits_for_its_ranks_and_exits_with_their_code(stop_point_reference,
                                                                     demo_data, tmp_path, signum,
                                                                     whom, restarts):
    """The signal reaches every process of the job, the script and torchrun included (a
    terminal's process group, ``kill -- -PGID``), or the script alone (a container's stop, whose
    first process it is): the script and torchrun send it on to the ranks, wait while they
    save, exit 75, and ``--resume`` through the same script trains each batch once. With
    ``MAX_RESTARTS``, torchrun restarts the stopped workers: they do not train again."""
    flags, work = str(tmp_path / 'flags'), str(tmp_path / 'w')
    config = demo_with_hooks(tmp_path, hook_source(flags, 10), ['stop_point_hook'])
    cmd = [
        'bash', 'tools/dist_train.sh', config, '2', '--work-dir', work,
        *demo_options(demo_data, EPOCHS, **STOP_OPTIONS, **DEMO_WORKERS)
    ]
    proc = popen(cmd, env=dict(MAX_RESTARTS=restarts))
    alive = lambda: proc.poll() is None  # noqa: E731
    wait_for([osp.join(flags, f'paused_rank{r}') for r in (0, 1)], alive=alive)
    everyone = job_processes([proc])  # the script, torchrun, 2 ranks and their 4 workers
    assert len(everyone) >= 1 + 1 + 2 * 3, everyone
    for process in everyone if whom == 'all' else everyone[:1]:
        process.send_signal(signum)
    wait_for([osp.join(flags, f'received_rank{r}') for r in (0, 1)], alive=alive)
    assert proc.poll() is None  # the script is still there while its ranks have not saved
    open(osp.join(flags, 'go'), 'w').close()
    [(rc, out)] = finish([proc])
    assert rc == 75, out[-3000:]
    assert f'saved {work}/iter_12.pth' in out, out[-3000:]
    assert 'is killed by signal' not in out and '==== mmddp_ext diagnosis' not in out
    assert not [p for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert 'Epoch(train) [2][5/8]' not in out  # not even by a restarted worker
    if restarts != '0':
        assert 'not started again: the job was stopped by SIGTERM' in out

    [(rc, out)] = finish([popen(cmd + ['--resume'])])
    assert rc == 0, out[-3000:]
    assert 'continuing at batch 5' in out
    trained = trained_iterations(flags, 2)
    for rank in (0, 1):  # the same iterations, with the same samples, each once
        assert trained[rank] == stop_point_reference[rank]
