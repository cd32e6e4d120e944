"""Positive-value and True-or-False checks, in one place: the predicates and the ``ValueError``
they back.

``bool`` is never a number here (``True`` would pass as 1 and ``False`` as 0 and hide a
mistake), and nothing is converted: ``'3'`` and ``3.0`` are not ints. Messages read
``<name>=<value!r> must be <what><hint>``, so each caller keeps its own wording, e.g.
``positive_int('upper', 0, hint=', e.g. 64')`` raises ``upper=0 must be a positive int, e.g. 64``.

Standard library only, like the pure cores that use it (``scaling/``).
"""
import difflib
import math
from typing import Any, Optional, Sequence, Type, TypeVar

T = TypeVar('T')


def is_positive_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) that is at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def is_positive_number(value: Any, finite: bool = True) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (not a ``bool``) above 0.

    Args:
        value: The value to check.
        finite: Also require a finite value (inf and nan fail). False skips that test, so
            inf passes and so does nan (it compares false with 0 either way); for callers
            that never excluded them.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not finite:
        return not value <= 0
    # an int is finite however large (math.isfinite would overflow converting it to float)
    return value > 0 and (isinstance(value, int) or math.isfinite(value))


def _must_be(name: str, value: Any, what: str, hint: str, error: Type[Exception]) -> Exception:
    """``error('<name>=<value!r> must be <what><hint>')``."""
    return error(f'{name}={value!r} must be {what}{hint}')


def positive_int(name: str, value: T, what: str = 'a positive int', hint: str = '',
                 error: Type[Exception] = ValueError) -> T:
    """``value`` unchanged when :func:`is_positive_int`; else raise a message naming it.

    Args:
        name: How the message names the value, e.g. ``'RankMemoryHook interval'``.
        value: The value to check.
        what: The constraint as the message words it, e.g. ``'a positive integer'``.
        hint: Appended to the message: what the value is for, a fix or an example.
        error: The exception class to raise.

    Raises:
        error: ``<name>=<value!r> must be <what><hint>``.
    """
    if not is_positive_int(value):
        raise _must_be(name, value, what, hint, error)
    return value


def positive_number(name: str, value: T, what: str = 'a positive number', hint: str = '',
                    finite: bool = True, error: Type[Exception] = ValueError) -> T:
    """``value`` unchanged when :func:`is_positive_number`; else raise a message naming it.

    Args:
        name: How the message names the value, e.g. ``'HangWatchdogHook timeout'``.
        value: The value to check.
        what: The constraint as the message words it, e.g. ``'a positive number of seconds'``.
        hint: Appended to the message: what the value is for, a fix or an example.
        finite: Also require a finite value (see :func:`is_positive_number`).
        error: The exception class to raise.

    Raises:
        error: ``<name>=<value!r> must be <what><hint>``.
    """
    if not is_positive_number(value, finite):
        raise _must_be(name, value, what, hint, error)
    return value


def true_or_false(name: str, value: T, error: Type[Exception] = ValueError) -> T:
    """``value`` unchanged when it is a ``bool``; else raise ``<name>=<value!r> must be True or
    False`` (``0``, ``1`` and ``'false'`` are not taken for one)."""
    if not isinstance(value, bool):
        raise _must_be(name, value, 'True or False', '', error)
    return value


def closest(value: Any, known: Sequence[str]) -> Optional[str]:
    """The entry of ``known`` closest to ``value`` as text, when one is close, else None."""
    close = difflib.get_close_matches(str(value), list(known), n=1)
    return close[0] if close else None


def did_you_mean(value: Any, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the entry of ``known`` closest to ``value``, or ``''``."""
    close = closest(value, known)
    return f' (did you mean {close!r}?)' if close is not None else ''
