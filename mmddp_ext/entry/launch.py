"""``mmddp_ext.launch()``: training from Python, with torch.distributed.elastic's agent
(``docs/launching.md``)."""
import os
from typing import Optional, Sequence, Union

from mmengine.config import Config

from ..dist.launch import launch_workers
from ..utils.process_state import own_process
from .train import main


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
            start_method: as :func:`mmddp_ext.dist.launch.launch_workers` takes them
            (``nproc_per_node``: one per GPU, any number on a CPU).

    Returns:
        ``{rank: return value}`` of the local workers (0 on success).

    Example::

        >>> import mmddp_ext
        >>> mmddp_ext.launch('configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py',
        ...                  nproc_per_node=2, args=['--work-dir', 'work_dirs/demo'])
    """
    path = _config_path(config)
    try:
        return launch_workers(worker_main, [path, *args], nproc_per_node, nnodes, node_rank,
                              master_addr, master_port, max_restarts, run_id, start_method)
    finally:
        if path is not config:  # the file dumped from a Config object (restarts included)
            os.unlink(path)


def worker_main(argv) -> int:
    """A worker of :func:`launch`: a process of ours, as under ``tools/dist_train.py``."""
    own_process()
    return main(argv)


def _config_path(config) -> str:
    if isinstance(config, str):
        return config
    import tempfile
    tmp = tempfile.NamedTemporaryFile('w', suffix='.py', prefix='mmddp_launch_', delete=False)
    tmp.close()
    config.dump(tmp.name)
    return tmp.name
