"""``mmddp_ext.launch()``: training from Python, with torch.distributed.elastic's agent
(``docs/launching.md``)."""
import os
import tempfile
from typing import Optional, Sequence, Union

from mmengine.config import Config
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..diagnose.records import WORK_DIR_NOTE_ENV, noted_work_dir, read_failures
from ..diagnose.summary import rank_at_fault, summarize
from ..launcher.elastic import launch_workers
from ..launcher.torchrun_front import failure_records
from ..utils.process_state import own_process, restore, snapshot
from .train import main


class LaunchFailed(ChildFailedError):
    """What :func:`launch` raises when a rank fails: torch's ``ChildFailedError`` with the
    diagnosis of the run's records.

    torch's agent reports the first failed process it sees, and stops the others: often a rank
    that only lost its peer, when the rank at fault took longer to end (its DataLoader workers,
    its failure record). ``failures`` is torch's report as it is; ``rank_at_fault`` is the rank
    the diagnosis blames, ``diagnosis`` its screen (``python -m mmddp_ext.diagnose WORK_DIR``),
    and both lead the message.

    Attributes:
        rank_at_fault: the global rank that failed first by itself (or was killed by a signal).
        diagnosis: the diagnosis text.
        work_dir: the run's work_dir.
    """

    def __init__(self, error: ChildFailedError, work_dir: str):
        launch = failure_records(error.failures)
        records = read_failures(work_dir)
        self.work_dir = work_dir
        self.rank_at_fault = rank_at_fault(records, launch)
        self.diagnosis = summarize(work_dir, records, launch=launch)
        super().__init__(error.name, error.failures)

    def __str__(self) -> str:
        return (f'rank {self.rank_at_fault} failed first; {self.diagnosis}\n'
                f'{super().__str__()}')


def launch(config: Union[str, Config], nproc_per_node: int = 1, nnodes: int = 1, node_rank: int = 0,
           master_addr: str = '127.0.0.1', master_port: Optional[int] = None,
           args: Sequence[str] = (), max_restarts: int = 0, run_id: Optional[str] = None,
           start_method: str = 'spawn') -> dict:
    """Train ``config`` on ``nproc_per_node`` local processes with torch.distributed.elastic.

    The programmatic twin of ``torchrun --nproc_per_node=N tools/dist_train.py CONFIG ARGS``:
    the elastic agent starts, watches and (with ``max_restarts``) restarts the workers.

    Args:
        config: a config path, ``pkg::path``, or an ``mmengine.Config`` (dumped to a
            temporary file first).
        args: further ``dist_train.py`` arguments, e.g. ``['--work-dir', 'w']``.
        nproc_per_node, nnodes, node_rank, master_addr, master_port, max_restarts, run_id,
            start_method: as :func:`mmddp_ext.launcher.elastic.launch_workers` takes them
            (``nproc_per_node``: one per GPU, any number on a CPU).

    Returns:
        ``{rank: return value}`` of the local workers (0 on success).

    Raises:
        LaunchFailed: a rank failed (a ``ChildFailedError`` that names the rank at fault).

    Example::

        >>> import mmddp_ext
        >>> mmddp_ext.launch('configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py',
        ...                  nproc_per_node=2, args=['--work-dir', 'work_dirs/demo'])
    """
    path = _config_path(config)
    fd, note = tempfile.mkstemp(prefix='mmddp_work_dir_', suffix='.txt')
    os.close(fd)
    state = snapshot()  # the caller's environment, without the note's variable
    os.environ[WORK_DIR_NOTE_ENV] = note  # the workers say where their records are
    try:
        return launch_workers(worker_main, [path, *args], nproc_per_node, nnodes, node_rank,
                              master_addr, master_port, max_restarts, run_id, start_method)
    except ChildFailedError as e:
        work_dir = noted_work_dir(note)
        if work_dir is None:  # no rank got as far as its work_dir: torch's report is all
            raise
        raise LaunchFailed(e, work_dir) from None
    finally:
        restore(state)
        os.unlink(note)
        if path is not config:  # the file dumped from a Config object (restarts included)
            os.unlink(path)


def worker_main(argv) -> int:
    """A worker of :func:`launch`: a process of ours, as under ``tools/dist_train.py``."""
    own_process()
    return main(argv)


def _config_path(config) -> str:
    if isinstance(config, str):
        return config
    tmp = tempfile.NamedTemporaryFile('w', suffix='.py', prefix='mmddp_launch_', delete=False)
    tmp.close()
    config.dump(tmp.name)
    return tmp.name
