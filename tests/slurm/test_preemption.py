"""A Slurm batch job (tools/slurm_sbatch.sh, ``--requeue``) with the demo's own DataLoader
workers, told to stop by ``scancel --signal=USR1`` in the middle of an epoch (the job's steps:
every rank and its workers; with ``--full`` the batch script and srun too) saves, requeues
itself, starts again and finishes: every iteration and sample is trained once, as in a run that
was never stopped (``conftest.stop_point_reference``: the same config, seed and world size)."""
import os.path as osp
import signal as signal_module

import psutil
import pytest
import torch

from conftest import DEMO_WORKERS, check_ok, demo_options, demo_with_hooks, run
from tests.helpers.stop_point_hook import STOP_OPTIONS, hook_source, trained_iterations, wait_for

pytestmark = pytest.mark.slow

PER_EPOCH, EPOCHS = 8, 2


@pytest.mark.parametrize('signal, whom', [('USR1', 'steps'), ('USR1', 'all'), ('TERM', 'script')])
def test_a_stop_signal_mid_epoch_saves_requeues_and_the_job_finishes_as_if_never_stopped(
        slurm, stop_point_reference, demo_data, tmp_path, signal, whom):
    """SIGUSR1 to the job's steps (Slurm's ``--signal=USR1@90``) or to every process of the job
    (``--full``); SIGTERM to the batch script alone (``--signal=B:TERM@90``), which sends it on
    to srun as SIGUSR1 (srun itself ends its tasks on a SIGTERM)."""
    options = demo_options(demo_data, EPOCHS, **STOP_OPTIONS, **DEMO_WORKERS)
    flags, work, log = str(tmp_path / 'flags'), str(tmp_path / 'w'), str(tmp_path / 'job.out')
    config = demo_with_hooks(tmp_path, hook_source(flags, 10), ['stop_point_hook'])
    job = check_ok(
        run([
            'sbatch', '--parsable', f'--output={log}', 'tools/slurm_sbatch.sh', config, work,
            *options
        ], env=dict(SLURM_CONF=slurm.conf), timeout=60)).strip().split(';')[0]
    alive = lambda: slurm.job(job).get('JobState') in ('PENDING', 'RUNNING')  # noqa: E731
    wait_for([osp.join(flags, f'paused_rank{r}') for r in (0, 1)], alive=alive)
    if whom == 'script':
        # slurmstepd runs its copy of tools/slurm_sbatch.sh, named slurm_script
        script = next(
            p for p in psutil.process_iter(['cmdline', 'environ'])
            if 'slurm_script' in ' '.join(p.info['cmdline'] or ()) and (
                p.info['environ'] or {}).get('SLURM_JOB_ID') == job)
        script.send_signal(getattr(signal_module, f'SIG{signal}'))
    else:
        check_ok(
            slurm.run('scancel', f'--signal={signal}', *(['--full'] if whom == 'all' else []), job))
    wait_for([osp.join(flags, f'received_rank{r}') for r in (0, 1)], alive=alive)
    open(osp.join(flags, 'go'), 'w').close()
    info = slurm.wait_job(job)
    out = open(log).read()
    assert info['JobState'] == 'COMPLETED' and info['Restarts'] == '1', (info, out[-4000:])
    # the first start: held after iteration 10, signalled then, in the agreement started
    # after 11 and read after 12: stopped after iteration 12
    received = 'USR1'  # a SIGTERM to the script reaches the ranks as SIGUSR1
    assert (
        f'stopped by SIG{received} after epoch 2, iteration 12 (4 of 8 in the epoch): every rank '
        f'finished it; saved {work}/iter_12.pth') in out
    assert (f'requeued Slurm job {job}: it resumes from this checkpoint when it starts again '
            '(exit code 75: stopped, not failed)') in out
    # the second start, by Slurm: resumed from that checkpoint at the next batch
    assert f'[slurm_sbatch] job {job} start 1 on n[1-2]' in out
    assert 'is killed by signal' not in out
    assert 'resuming epoch 2 after batch 4 of 8: continuing at batch 5' in out
    trained = trained_iterations(flags, 2)
    for rank in (0, 1):
        assert [it for it, _, _ in trained[rank]] == list(range(1, PER_EPOCH * EPOCHS + 1))
        assert trained[rank] == stop_point_reference[rank]
    seen = sum(len(ids) for rank in trained for _, _, ids in trained[rank])
    reference = stop_point_reference
    assert seen == sum(len(ids) for rank in reference for _, _, ids in reference[rank]) == 128
    ckpt = torch.load(osp.join(work, 'epoch_2.pth'), map_location='cpu')
    assert ckpt['meta']['iter'] == PER_EPOCH * EPOCHS
