"""Quiet by default: a real run prints none of the known-harmless messages and one line of ours
for a ``--resume`` that finds nothing, and the same run with the filters off prints the ones
they hide; in-process, the filters of
:mod:`mmddp_ext.utils.quiet` hide exactly those messages and let everything else from the same
modules through."""
import logging
import multiprocessing as mp
import os
import os.path as osp
import warnings

import torch

from mmddp_ext.utils import quiet

# What every 2-process demo run printed before (MMEngine 0.10.7, MMPose 1.3.2, torch 2.14.1):
# messages the filters of mmddp_ext.utils.quiet hide, and messages our code no longer causes
# (the wrapper spells the buffer setting as torch 2.13+ does; DDPRunner answers a --resume that
# finds nothing itself, instead of calling MMEngine's resume).
FILTERED = ('"FileClient" will be deprecated', '"HardDiskBackend" is the alias',
            'The metainfo config file', 'Setting MKL_NUM_THREADS')
AVOIDED = ('`broadcast_buffers` is deprecated', 'Did not find last_checkpoint',
           'Auto resumed from the latest checkpoint None')
NOISE = FILTERED + AVOIDED


def test_demo_run_is_quiet_and_says_what_resume_found(healthy_run):
    """The shared healthy run (``conftest.healthy_run``): 2 processes, ``--resume`` on an empty
    work dir."""
    out, work = healthy_run.out, healthy_run.work
    assert [n for n in NOISE if n in out] == []
    line = f'[mmddp_ext] --resume: no checkpoint in {work} yet: starting from scratch'
    assert out.count(line) == 1, out[-3000:]
    assert osp.exists(osp.join(work, 'epoch_1.pth'))  # it trained and saved, as before


def test_with_quiet_off_the_filtered_messages_come_back(two_jobs):
    """The control of the test above: the same run with ``MMDDP_QUIET=0`` (the second of the
    shared pair of jobs, ``shared_runs.two_jobs``) prints every message the filters hide (so
    their absence above is the filters' doing), and still none of those our code avoids at
    their source."""
    rc, out, work = two_jobs[1]
    assert rc == 0, out[-4000:]
    # (MMEngine sets MKL_NUM_THREADS, and says so, only where the environment has not)
    expected = [n for n in FILTERED if 'MKL' not in n or 'MKL_NUM_THREADS' not in os.environ]
    assert [n for n in expected if n not in out] == []
    assert [n for n in AVOIDED if n in out] == []
    assert f'[mmddp_ext] --resume: no checkpoint in {work} yet: starting from scratch' in out


def _warnings_from(fn, *args, **kwargs):
    """The messages of the warnings ``fn`` emits with our filters on (all others: always)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        quiet.quiet_warnings()
        fn(*args, **kwargs)
    return [str(w.message) for w in caught]


def test_mkl_notice_is_hidden_and_the_omp_one_from_the_same_function_is_not(monkeypatch):
    from mmengine.utils.dl_utils import set_multi_processing
    monkeypatch.delenv('MKL_NUM_THREADS', raising=False)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    got = _warnings_from(set_multi_processing, mp_start_method=mp.get_start_method(),
                         opencv_num_threads=0, distributed=True)
    assert not [m for m in got if 'MKL_NUM_THREADS' in m]
    assert [m for m in got if m.startswith('Setting OMP_NUM_THREADS environment variable')]


def test_mmpose_metainfo_fallback_is_hidden_other_warnings_there_are_not(monkeypatch, tmp_path):
    from mmpose.datasets.datasets.utils import parse_pose_metainfo
    monkeypatch.chdir(tmp_path)  # configs/_base_/datasets/coco.py does not exist here
    got = _warnings_from(parse_pose_metainfo, dict(from_file='configs/_base_/datasets/coco.py'))
    assert got == []

    def others():
        module = 'mmpose.datasets.datasets.utils'
        warnings.warn_explicit('something else is wrong with the metainfo', UserWarning, 'utils.py',
                               1, module=module)
        warnings.warn_explicit(  # the same text as a category we do not know to be harmless
            'The metainfo config file "configs/_base_/datasets/coco.py" does not exist. A '
            'matched config file "/x/mmpose/.mim/configs/_base_/datasets/coco.py" will be used '
            'instead.', DeprecationWarning, 'utils.py', 2, module=module)
        warnings.warn_explicit(  # another file than the one asked for: shown
            'The metainfo config file "configs/_base_/datasets/mine.py" does not exist. A '
            'matched config file "/x/mmpose/.mim/configs/_base_/datasets/coco.py" will be used '
            'instead.', UserWarning, 'utils.py', 3, module=module)

    assert len(_warnings_from(others)) == 3


def test_quiet_off_with_the_environment_variable(monkeypatch):
    from mmengine.utils.dl_utils import set_multi_processing
    monkeypatch.setenv(quiet.QUIET_ENV, '0')
    monkeypatch.delenv('MKL_NUM_THREADS', raising=False)
    got = _warnings_from(set_multi_processing, mp_start_method=mp.get_start_method(),
                         opencv_num_threads=0, distributed=True)
    assert [m for m in got if 'MKL_NUM_THREADS' in m]


class _Records(logging.Handler):

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_unused_file_client_is_hidden_a_used_one_is_not(tmp_path):
    from mmengine.fileio import FileClient
    from mmengine.logging import MMLogger
    from mmengine.runner.checkpoint import save_checkpoint
    logger = quiet.quiet_logger(MMLogger.get_instance(f'quiet_{id(tmp_path)}'))  # current
    records = _Records()
    logger.addHandler(records)
    try:
        save_checkpoint({'w': torch.zeros(1)}, str(tmp_path / 'a.pth'))  # client unused
        assert [m for m in records.messages if 'FileClient' in m] == []
        save_checkpoint({'w': torch.zeros(1)}, str(tmp_path / 'b.pth'),
                        file_client_args=dict(backend='disk'))  # the client writes the file
        FileClient(backend='disk')  # user code
        shown = [m for m in records.messages if 'FileClient' in m]
        assert len(shown) == 2 and shown[0].startswith('"FileClient" will be deprecated')
        assert osp.exists(tmp_path / 'a.pth') and osp.exists(tmp_path / 'b.pth')
    finally:
        logger.removeHandler(records)
