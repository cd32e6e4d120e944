"""The last screen of real 2-process runs of the demo for the faults of the field that end in a
Python exception or an abort: DDP's own errors (a parameter the loss never uses, a parameter
ready twice, a different model on one rank), a plain exception, a rank that trained on half of
the data, a corrupt annotation file and image read by DataLoader workers, and a full disk while
saving a checkpoint. The ranks are started by hand from the preloaded stack and the diagnosis
runs after them as ``dist_train.sh`` runs it (``tests/preloaded.py``); the full disk runs under
``bash tools/dist_train.sh`` in a mount namespace of its own, and the rank that aborts on a
collective mismatch under it too (an abort leaves no record: the front's report has its words)."""
import os
import os.path as osp
import re
import shutil
import subprocess

import pytest

from conftest import DEMO_WORKERS, PYTHON, demo_options, demo_with_hooks, run
from preloaded import dist_train

SCREEN = 25  # lines a user sees without scrolling


def _train(tmp_path, data, options=(), hooks='', modules=('ddp_faults', ), epochs=2, cmd=None):
    cfg = demo_with_hooks(tmp_path, hooks, list(modules), 'case.py')
    work = str(tmp_path / 'w')
    opts = demo_options(data, epochs, **{'train_dataloader.batch_size': '8', **dict(options)})
    if cmd:  # dist_train.sh itself (its launch report, or the launcher wrapped in a namespace)
        proc = run(
            cmd(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work, *opts]), timeout=600)
    else:
        proc = dist_train([cfg, '--work-dir', work, *opts], 2, str(tmp_path / 'ranks'), timeout=600,
                          diagnose=True)
    screen = '\n'.join(proc.stdout.rstrip().splitlines()[-SCREEN:])
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc, screen


@pytest.mark.slow
def test_a_parameter_the_loss_never_uses_is_named_with_the_fixes(demo_data, tmp_path):
    proc, screen = _train(tmp_path, demo_data, {'model.head.type': 'UnusedParamHead'})
    assert 'parameters that received no gradient' in screen, proc.stdout[-5000:]
    assert '  head.unused_branch.weight, head.unused_branch.bias' in screen
    assert 'every rank raised it: no rank is the culprit' in screen
    assert 'first failing rank' not in screen
    assert 'model_wrapper_cfg.find_unused_parameters=True' in screen
    assert 'remove the unused part' in screen


@pytest.mark.slow
def test_a_parameter_ready_twice_is_named_with_static_graph(demo_data, tmp_path):
    proc, screen = _train(tmp_path, demo_data, {
        'model.head.type': 'ReusedCheckpointHead',
        'model_wrapper_cfg.find_unused_parameters': 'True'
    })
    assert 'got its gradient twice in one iteration' in screen, proc.stdout[-5000:]
    assert '  head.final_layer.weight' in screen
    assert 'model_wrapper_cfg.static_graph=True' in screen and 'use_reentrant=False' in screen


@pytest.mark.slow
def test_a_different_model_on_one_rank_names_the_differing_parameters(demo_data, tmp_path):
    # AgreementHook would stop this run before DDP's check: off, DDP's error is explained
    proc, screen = _train(tmp_path, demo_data, {'model.head.type': 'RankExtraHead'},
                          hooks="dict(type='AgreementHook', enabled=False)")
    assert 'models differ between ranks' in screen, proc.stdout[-5000:]
    assert 'rank 1 has 75 parameters, rank 0 has 71' in screen or \
        'rank 0 has 71 parameters, rank 1 has 75' in screen
    assert 'first difference, parameter 71: rank 1 head.refine.0.weight, rank 0 none' in screen
    assert 'only on rank 1: head.refine.0.weight, head.refine.0.bias' in screen
    assert 'same config and code on every node' in screen


@pytest.mark.slow
def test_an_exception_names_the_file_and_line_that_raised_it(demo_data, tmp_path):
    proc, screen = _train(tmp_path, demo_data, DEMO_WORKERS.items(),
                          hooks="dict(type='FaultHook', rank=1, at_iter=3, fault='raise')",
                          modules=('fault_hook', ))  # with the demo's own workers
    assert 'DataLoader worker (pid' not in screen
    assert 'first failing rank: 1' in screen, proc.stdout[-5000:]
    assert 'ValueError: injected fault on rank 1 at iteration 3' in screen
    hook = osp.join('tests', 'helpers', 'fault_hook.py')
    assert f'{hook}:' in screen and 'in before_train_iter: raise ValueError(' in screen
    assert 'then: rank 0 RuntimeError (peer lost)' in screen


@pytest.mark.slow
def test_a_rank_on_half_of_the_data_is_a_collective_mismatch_not_a_native_crash(
        demo_data, tmp_path):
    """Rank 1 finishes its epoch after half the steps and syncs buffers while rank 0 sends
    its gradients: gloo aborts rank 1 ("Received data size doesn't match expected size").
    Under ``dist_train.sh``: an abort leaves no record, the front's launch report holds its
    words."""
    proc, screen = _train(
        tmp_path,
        demo_data,
        {
            'train_dataloader.dataset.type': 'RankHalfDataset',
            'train_dataloader.batch_size': '4',
            'scaling.global_batch_size': '8'
        },
        hooks="dict(type='AgreementHook', enabled=False)",  # else stopped before step 1
        cmd=lambda argv: argv)
    assert 'ranks ran different collectives' in screen or \
        'every rank waited, in different collectives' in screen, proc.stdout[-5000:]
    assert 'different data lengths' in screen
    assert 'native code' not in screen


def _bad_copy(demo_data, tmp_path, what: str) -> str:
    """A copy of the demo data with a truncated train annotation file or first train image."""
    root = str(tmp_path / 'data')
    shutil.copytree(demo_data, root)
    images = osp.join(root, 'train')
    path = (
        osp.join(root, 'annotations', 'train.json') if what == 'annotation' else osp.join(
            images,
            sorted(os.listdir(images))[0]))
    with open(path, 'rb') as f:
        head = f.read(500 if what == 'annotation' else 100)
    with open(path, 'wb') as f:
        f.write(head)
    return path


@pytest.mark.slow
@pytest.mark.parametrize('what', ['annotation', 'image'])
def test_a_corrupt_input_file_is_named_through_dataloader_workers(demo_data, tmp_path, what):
    bad = _bad_copy(demo_data, tmp_path, what)
    proc, screen = _train(tmp_path, str(tmp_path / 'data'), {
        'train_dataloader.num_workers': '2',
        'train_dataloader.persistent_workers': 'False'
    }, epochs=1)
    assert f'input file: {bad} (rank ' in screen, proc.stdout[-5000:]
    assert ('the annotation file does not parse'
            if what == 'annotation' else 'the file is corrupt, truncated or unreadable') in screen
    assert 'replace it with a good copy' in screen


def _namespace_ok() -> bool:
    try:
        return subprocess.run(['unshare', '-m', 'true'], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


NAMESPACED = '''
mount -t tmpfs -o size=1g mmddp_test "$MNT" || exit 90
"$@"
rc=$?
echo "FILES: $(ls -A "$MNT/w" | tr '\\n' ' ')"
"$PY" -c "import sys, torch; c = torch.load(sys.argv[1]); print('LOADED', 'state_dict' in c)" \
  "$MNT/w/epoch_1.pth"
exit $rc
'''


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_line_and_the_previous_checkpoint_stays(
        demo_data, tmp_path):
    """A real ENOSPC: the work dir is a 1 GiB tmpfs mounted in a private mount namespace of
    the run (``unshare -m``: the mount is never seen outside and goes away with the run), and
    a hook fills it to the last byte before the second save: the ranks' failure records do
    not fit either and are kept in the spare folder under $TMPDIR, which the screen names.
    Skipped where namespaces or mounts are not permitted (not root)."""
    if not _namespace_ok():
        pytest.skip('unshare -m is not permitted here (needs root): no private tmpfs to fill')
    mnt, tmp = tmp_path / 'mnt', tmp_path / 'tmp'
    mnt.mkdir()
    tmp.mkdir()

    def namespaced(argv):
        argv = [a.replace(str(tmp_path / 'w'), str(mnt / 'w')) for a in argv]
        return [
            'env', f'MNT={mnt}', f'PY={PYTHON}', f'TMPDIR={tmp}', 'unshare', '-m', 'bash', '-c',
            NAMESPACED, 'bash', *argv
        ]

    proc, screen = _train(tmp_path, demo_data, {'default_hooks.checkpoint.max_keep_ckpts': '-1'},
                          hooks="dict(type='FillDiskHook')", modules=('fill_disk_hook', ),
                          cmd=namespaced)
    if proc.returncode == 90:
        pytest.skip('mounting a tmpfs is not permitted here')
    files = next(ln for ln in proc.stdout.splitlines() if ln.startswith('FILES: ')).split()[1:]
    assert 'epoch_1.pth' in files and 'epoch_2.pth' not in files, proc.stdout[-5000:]
    assert not [f for f in files if f.endswith('.part')]  # no partial file left
    assert 'LOADED True' in proc.stdout  # the previous checkpoint loads
    prev = osp.join(str(mnt), 'w', 'epoch_1.pth')
    line = next(ln for ln in screen.splitlines() if 'no space left on device' in ln)
    assert f'while saving checkpoint {osp.join(str(mnt), "w", "epoch_2.pth")}: ' in line
    assert ' MiB free of 1024 MiB there' in line
    assert f'the previous checkpoint {prev} is intact, no partial file was left' in line
    assert 'fix: free space there' in screen and 'first failing rank: 0' in screen
    work = osp.join(str(mnt), 'w')
    assert re.search(
        rf"rank 0's records: the work dir {re.escape(work)} refused them \(OSError: \[Errno 28\] "
        rf".*\); kept in {re.escape(str(tmp))}/mmddp_ext-records-\d+/w-[0-9a-f]{{10}} on host",
        screen), screen
    assert 'no rank raised' not in proc.stdout
