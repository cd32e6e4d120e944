"""Memory units, in one place: bytes to MiB for logs, tables and records, bytes with binary
units for findings, and the byte count of a unit name read from a message or an option."""
from typing import Optional

MIB = 2**20
GIB = 2**30


def format_mib(nbytes: Optional[float], unit: str = ' MiB', missing: str = '-') -> str:
    """``nbytes`` as whole MiB, e.g. ``format_mib(3 * 2 ** 30) == '3072 MiB'``; ``missing``
    when unknown (None)."""
    return missing if nbytes is None else f'{nbytes / MIB:.0f}{unit}'


# bytes per unit name (lower case): KiB/MiB/GiB/TiB and K/M/G/T binary, KB/MB/GB/TB decimal
BYTES_PER_UNIT = {
    'b': 1,
    'k': 2**10,
    'kib': 2**10,
    'kb': 10**3,
    'm': 2**20,
    'mib': 2**20,
    'mb': 10**6,
    'g': 2**30,
    'gib': 2**30,
    'gb': 10**9,
    't': 2**40,
    'tib': 2**40,
    'tb': 10**12
}
_BINARY = ('KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB')


def format_bytes(n: Optional[int]) -> str:
    """A byte count with binary units and two decimals: ``'512 B'``, ``'59.25 MiB'``,
    ``'1.89 GiB'``, ... or ``'unknown'`` for None. Raises ValueError for anything but a
    non-negative int."""
    if n is None:
        return 'unknown'
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f'byte count must be a non-negative integer, got {n!r}')
    if n < 1024:
        return f'{n} B'
    value = float(n)
    for unit in _BINARY:
        value /= 1024
        if round(value, 2) < 1024 or unit == _BINARY[-1]:
            return f'{value:.2f} {unit}'
    raise AssertionError('unreachable')  # pragma: no cover
