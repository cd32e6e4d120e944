"""How our lines reach the user: through MMEngine's current logger, each starting with
``[mmddp_ext]`` (one grep finds them all), optionally from rank 0 only."""
import logging

from mmengine.dist import get_rank
from mmengine.logging import print_log

TAG = '[mmddp_ext]'


def log_line(message: str, level: int = logging.INFO, rank0_only: bool = False) -> None:
    """``[mmddp_ext] message`` to MMEngine's current logger at ``level`` (on rank 0 only when
    ``rank0_only``: for a fact every rank shares)."""
    if not rank0_only or get_rank() == 0:
        print_log(f'{TAG} {message}', logger='current', level=level)
