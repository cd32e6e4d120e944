"""Which errors are out-of-memory errors: :func:`is_oom_error` (a live exception) and
:func:`is_oom` (a failure record's type and message) are the package's only out-of-memory
predicates. Which errors count: docs/memory.md, 'When a rank runs out of memory'.
"""
import resource
from typing import Iterator, Optional

OOM_PATTERNS = ('out of memory', 'OutOfMemoryError', "can't allocate memory", 'DefaultCPUAllocator',
                'CUBLAS_STATUS_ALLOC_FAILED', 'std::bad_alloc', 'MemoryError',
                'Cannot allocate memory')
# Out-of-memory errors only under an address-space limit: oneDNN failing to allocate its
# workspace, and the dynamic loader failing to map a library (a budget too small to import).
LIMITED_PATTERNS = ('could not create a primitive', 'failed to map segment from shared object')
MAP_SEGMENT = LIMITED_PATTERNS[1]


def address_space_limit() -> Optional[int]:
    """This process's ``RLIMIT_AS`` soft limit in bytes, or None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def is_oom(exc_type: str, message: str, address_space_limited: bool = False) -> bool:
    """Whether an error, given by its type name and message, is an out-of-memory error.

    Args:
        exc_type: The exception's class name, e.g. ``'OutOfMemoryError'``.
        message: Its message.
        address_space_limited: Whether the process ran under an address-space limit (then
            :data:`LIMITED_PATTERNS` count too).
    """
    text = f'{exc_type}: {message}'.lower()
    patterns = OOM_PATTERNS + (LIMITED_PATTERNS if address_space_limited else ())
    return any(p.lower() in text for p in patterns)


def exception_chain(exc: Optional[BaseException]) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``),
    each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an out-of-memory error; the
    address-space limit is read now, so call it where the error was raised."""
    limited = address_space_limit() is not None
    return any(
        isinstance(e, MemoryError) or any(
            c.__name__ == 'OutOfMemoryError'
            for c in type(e).__mro__) or is_oom(type(e).__name__, str(e), limited)
        for e in exception_chain(exc))
