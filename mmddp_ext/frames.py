"""Where a Python exception was raised: the innermost frame, and the innermost frame of the
user's or the model's code when the raise happened deep in a library (pure functions over a
traceback; stored in the failure record by :mod:`mmddp_ext.failures`, shown by
:mod:`mmddp_ext.diagnose`).

A frame is stored as a plain dict, ``{'file', 'line', 'func', 'source'}``, so that the record
stays JSON. Library code is what :mod:`mmddp_ext.stacks` skips when it names a stuck rank's
line (installed packages, the standard library) plus this package itself: the runner's loop
is never the line to fix.
"""
import os.path as osp
import re
import traceback
from types import TracebackType
from typing import Dict, List, Optional

from .stacks import LIBRARY_MARKERS

_PACKAGE = osp.dirname(osp.abspath(__file__)) + osp.sep
# "  File "/x/y.py", line 12, in forward" of a traceback printed as text (a DataLoader worker's)
_TB_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


def is_library(path: str) -> bool:
    """Whether ``path`` is installed library code, the standard library, or this package."""
    return (any(marker in path for marker in LIBRARY_MARKERS)
            or osp.abspath(path).startswith(_PACKAGE))


def _frame(file: str, line: int, func: str, source: Optional[str]) -> Dict:
    return dict(file=file, line=int(line), func=func, source=(source or '').strip())


def frames_of(tb: Optional[TracebackType]) -> List[Dict]:
    """The frames of a traceback, outermost first."""
    return [_frame(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(tb)]


def frames_in_text(text: str) -> List[Dict]:
    """The frames of the last traceback printed in ``text`` (outermost first), e.g. the
    "Original Traceback" a DataLoader worker's error carries into the main process."""
    lines = text.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.lstrip().startswith('Traceback (')),
                default=-1)
    frames = []
    for i, line in enumerate(lines[start + 1:], start + 1):
        m = _TB_LINE.match(line)
        if m:
            nxt = lines[i + 1] if i + 1 < len(lines) else ''
            source = '' if _TB_LINE.match(nxt) else nxt
            frames.append(_frame(m.group('file'), m.group('line'), m.group('func'), source))
    return frames


def raise_sites(frames: List[Dict]) -> Dict[str, Optional[Dict]]:
    """``{'raised_at': innermost frame, 'user_at': innermost frame of the user's code}``.

    ``user_at`` is None when the innermost frame is the user's itself, or when no frame
    besides the outermost one (the entry script) is outside the libraries.
    """
    if not frames:
        return dict(raised_at=None, user_at=None)
    inner = frames[-1]
    mine = next((f for f in reversed(frames[1:]) if not is_library(f['file'])), None)
    return dict(raised_at=inner, user_at=None if mine is inner else mine)


def exception_sites(exc: BaseException) -> Dict[str, Optional[Dict]]:
    """:func:`raise_sites` of an exception; for a DataLoader worker's error re-raised in the
    main process, the worker's own frames (from the traceback text it carries)."""
    frames = frames_of(exc.__traceback__)
    worker = frames_in_text(str(exc)) if 'Original Traceback' in str(exc) else []
    return raise_sites(worker or frames)


def frame_text(frame: Dict) -> str:
    """``/x/model.py:12 in forward: y = self.head(x)``."""
    text = f'{frame.get("file")}:{frame.get("line")} in {frame.get("func")}'
    return f'{text}: {frame["source"]}' if frame.get('source') else text


def raise_site_lines(record: Dict) -> List[str]:
    """The diagnosis lines for a record's ``raised_at`` and ``user_at`` (none if absent)."""
    lines = []
    if record.get('raised_at'):
        lines.append(f'  raised at {frame_text(record["raised_at"])}')
    if record.get('user_at'):
        lines.append(f'  from your code: {frame_text(record["user_at"])}')
    return lines
