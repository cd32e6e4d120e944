"""Where a Python exception was raised: the innermost frame, and the innermost frame of the
user's or the model's code when the raise happened deep in a library (pure functions over a
traceback; stored in the failure record by :mod:`mmddp_ext.diagnose.records`, shown by
:mod:`mmddp_ext.diagnose`).

A frame is stored as a plain dict, ``{'file', 'line', 'func', 'source'}``, so that the record
stays JSON. Library code is what :mod:`mmddp_ext.diagnose.stacks` skips when it names a stuck rank's
line (installed packages, the standard library) plus this package itself: the runner's loop
is never the line to fix.
"""
import errno
import os
import os.path as osp
import re
import traceback
from types import TracebackType
from typing import Dict, List, Optional

from .stacks import LIBRARY_MARKERS

_PACKAGE = osp.dirname(osp.dirname(osp.abspath(__file__))) + osp.sep  # mmddp_ext/, all of it
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

    ``user_at`` is the innermost frame outside the installed libraries, else the innermost
    one of a model library (MMPose, MMDetection: not torch, MMEngine, mmcv); None when that
    is the innermost frame itself, or when there is no such frame besides the outermost one
    (the entry script).
    """
    if not frames:
        return dict(raised_at=None, user_at=None)
    inner = frames[-1]
    mine = next((f for f in reversed(frames[1:]) if not is_library(f['file'])), None)
    if mine is None:  # no code of the user's: the model's (MMPose's, MMDetection's) then
        mine = next((f for f in reversed(frames[1:]) if _is_model_library(f['file'])), None)
    return dict(raised_at=inner, user_at=None if mine is inner else mine)


# installed packages that are not the framework: model code (MMPose, MMDetection, timm, ...)
_FRAMEWORK = ('/torch/', '/mmengine/', '/mmcv/', '/numpy/', '/xtcocotools/', '/pycocotools/',
              '/PIL/', '/cv2/')


def _is_model_library(path: str) -> bool:
    path = path.replace('\\', '/')
    return (('/site-packages/' in path or '/dist-packages/' in path)
            and not any(marker in path for marker in _FRAMEWORK))


def exception_sites(exc: BaseException) -> Dict[str, Optional[str]]:
    """:func:`raise_sites` of an exception (for a DataLoader worker's error re-raised in the
    main process, the worker's own frames, from the traceback text it carries),
    ``input_file``: the data file it was reading, if one is named (:func:`input_file`), and
    ``input_missing``: whether that file does not exist (as the rank sees it, from its working
    directory ``cwd``)."""
    frames = frames_of(exc.__traceback__)
    if frames and frames[-1]['file'].startswith(_PACKAGE) and exc.__cause__ is not None:
        frames = frames_of(exc.__cause__.__traceback__) or frames  # we only re-worded it
    worker = frames_in_text(str(exc)) if WORKER in str(exc) else []
    # a write its folder refused names the file written, not an input
    path = None if getattr(exc, 'errno', None) in WRITE_REFUSED else input_file(exc)
    return dict(
        raise_sites(worker or frames), input_file=path, input_missing=path is not None
        and not osp.exists(path), cwd=os.getcwd())


WRITE_REFUSED = (errno.EPERM, errno.EROFS, errno.ENOSPC, getattr(errno, 'EDQUOT', errno.ENOSPC))
WORKER = 'Original Traceback'  # what a DataLoader worker's error carries into the main process
DATA_SUFFIXES = ('.json', '.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp', '.gif', '.txt',
                 '.csv', '.xml', '.pkl', '.npy', '.npz', '.h5', '.mat', '.yaml', '.yml')
# a path as a message quotes it, absolute or relative: from the start of the text or after a
# space, quote, bracket or '=', up to a data file's suffix followed by the end of the path
_PATH_IN_TEXT = re.compile(
    r"(?:^|(?<=[\s`'\"(\[=]))(?P<path>(?:[A-Za-z]:)?[^\s`'\"()\[\]=]+?(?:%s))"
    r"(?=[\s`'\":,.)\]]|$)" % '|'.join(re.escape(s) for s in DATA_SUFFIXES), re.IGNORECASE)


def worker_error_line(message: str) -> str:
    """The worker's own exception line of a DataLoader worker's error re-raised in the main
    process (its last line); the message itself otherwise."""
    if WORKER not in message:
        return message
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[-1] if lines else message


def input_file(exc: BaseException) -> Optional[str]:
    """The data file an exception is about: a path the message names (a DataLoader worker's
    message carries it into the main process), else, from the innermost frame outwards, a
    local variable that names an existing data file or is an open one (the annotation file
    a JSON parser was reading has no name in its error)."""
    m = _PATH_IN_TEXT.search(worker_error_line(str(exc)))
    if m:
        return m.group('path')
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            name = getattr(value, 'name', None) if hasattr(value, 'read') else value
            if (isinstance(name, str) and name.lower().endswith(DATA_SUFFIXES)
                    and osp.isfile(name)):
                return osp.abspath(name)
    return None


def frame_text(frame: Dict) -> str:
    """``/x/model.py:12 in forward: y = self.head(x)``."""
    text = f'{frame.get("file")}:{frame.get("line")} in {frame.get("func")}'
    return f'{text}: {frame["source"]}' if frame.get('source') else text


def raise_site_lines(record: Dict) -> List[str]:
    """The diagnosis lines for a record's ``input_file``, ``raised_at`` and ``user_at``
    (none if absent)."""
    lines = []
    path = record.get('input_file')
    if path:
        lines.append(f'  input file: {path} (rank {record.get("rank")}, host {record.get("host")})')
        lines.append(
            _missing_fix(path, record) if record.get('input_missing') else
            f'  fix: {_corrupt_what(path)}: replace it with a good copy (is the copy '
            'on this node complete?), or remove it and its entry from the annotations')
    if record.get('raised_at'):
        lines.append(f'  raised at {frame_text(record["raised_at"])}')
    mine = record.get('user_at')
    if mine and not mine['file'].startswith(_PACKAGE):  # ours is never the line to fix
        whose = 'outside torch and MMEngine' if is_library(mine['file']) else 'your code'
        lines.append(f'  from {whose}: {frame_text(mine)}')
    return lines


def _corrupt_what(path: str) -> str:
    if path.lower().endswith(('.json', '.xml', '.txt', '.csv', '.pkl', '.yaml', '.yml')):
        return 'the annotation file does not parse or lacks what the dataset reads'
    return 'the file is corrupt, truncated or unreadable'


def _missing_fix(path: str, record: Dict) -> str:
    where = '' if osp.isabs(path) else (f' (a relative path: read from the rank\'s working '
                                        f'directory {record.get("cwd") or "?"})')
    return (f'  fix: no such file on this node{where}: check the path in the config '
            '(data_root + ann_file or data_prefix), or copy the data to this node')
