"""Memory units, in one place: bytes to MiB for logs, tables and records."""
from typing import Optional

MIB = 2**20
GIB = 2**30


def format_mib(nbytes: Optional[float], unit: str = ' MiB', missing: str = '-') -> str:
    """``nbytes`` as whole MiB, e.g. ``format_mib(3 * 2 ** 30) == '3072 MiB'``; ``missing``
    when unknown (None)."""
    return missing if nbytes is None else f'{nbytes / MIB:.0f}{unit}'
