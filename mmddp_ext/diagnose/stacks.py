"""Read :mod:`faulthandler` dumps and tell a rank that waits in a collective from one that
never arrived (pure functions over text; used by :mod:`mmddp_ext.diagnose`).

A stuck job looks the same from every rank: no progress. The ranks differ in where their main
thread is. Ranks that reached the collective sit in it (``torch.distributed``, the autograd
engine running DDP's gradient all-reduce, DDP's forward synchronising buffers, MMEngine's
``dist`` helpers, a CUDA synchronisation); the rank that did not arrive is anywhere else: its
own forward, the data loader, a file read. The innermost frames of each main thread decide.

Example dump (``faulthandler.dump_traceback_later``)::

    Timeout (0:02:00)!
    Thread 0x00007f22bcc57b80 (most recent call first):
      File "/x/model.py", line 9 in forward
      ...
"""
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

_THREAD = re.compile(r'^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):')
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_TIMEOUT = re.compile(r'^Timeout \((?P<after>[^)]*)\)!')

# Where a rank that reached a collective (or waits for one to finish) sits.
WAIT_SITES = (
    ('torch/distributed/', 'a torch.distributed collective'),
    ('torch/nn/parallel/distributed.py', "DDP's forward (buffer broadcast)"),
    ('torch/autograd/', "backward (DDP's gradient all-reduce)"),
    ('torch/_tensor.py', "backward (DDP's gradient all-reduce)"),
    ('mmengine/dist/', "an MMEngine collective (mmengine.dist)"),
    ('mmddp_ext/ddp/microbatch.py', 'the gradient all-reduce of MicrobatchDDP'),
    ('torch/cuda/', 'a CUDA synchronisation (waiting for queued collectives)'),
)
# Frames that are library code, skipped when naming the user's line.
LIBRARY_MARKERS = ('/site-packages/', '/dist-packages/', '/lib/python3', '<frozen ')


class Frame(NamedTuple):
    """One Python frame of a dump."""
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f'{self.file}:{self.line} in {self.func}'


class Dump(NamedTuple):
    """A parsed dump: the watchdog's timeout (or None for a signal) and each thread's frames,
    innermost first."""
    timeout: Optional[str]
    threads: Dict[int, List[Frame]]


def parse_dump(text: str) -> Dump:
    """Parse a :mod:`faulthandler` dump (several concatenated dumps: the last one wins)."""
    timeout, threads, current = None, {}, None
    for line in text.splitlines():
        m = _TIMEOUT.match(line)
        if m:
            timeout, threads, current = m.group('after'), {}, None
            continue
        m = _THREAD.match(line)
        if m:
            current = int(m.group(2), 16)
            if current in threads:  # a later dump of the same thread: start again
                threads = {}
            threads[current] = []
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            threads[current].append(Frame(m.group('file'), int(m.group('line')), m.group('func')))
    return Dump(timeout, threads)


def main_frames(dump: Dump, main_thread: Optional[int]) -> List[Frame]:
    """The main thread's frames (by id; else the thread running ``<module>``)."""
    if main_thread is not None and main_thread in dump.threads:
        return dump.threads[main_thread]
    for frames in dump.threads.values():
        if frames and frames[-1].func == '<module>':
            return frames
    return []


def wait_site(frames: List[Frame], depth: int = 3) -> Optional[str]:
    """What the thread waits in, when one of its ``depth`` innermost frames is a collective."""
    for frame in frames[:depth]:
        path = frame.file.replace('\\', '/')
        for marker, what in WAIT_SITES:
            if marker in path:
                return what
    return None


def user_frame(frames: List[Frame]) -> Optional[Frame]:
    """The innermost frame outside the installed libraries and the standard library."""
    for frame in frames:
        if not any(marker in frame.file for marker in LIBRARY_MARKERS):
            return frame
    return None


def site_text(frames: List[Frame]) -> str:
    """One line: the innermost frame, and the user's line when that is elsewhere."""
    if not frames:
        return 'no Python frame recorded'
    inner, mine = frames[0], user_frame(frames)
    if mine is None or mine == inner:
        return str(inner)
    return f'{mine} (innermost: {inner})'


def split_ranks(stacks: Dict[int, List[Frame]],
                completed: Dict[int, Optional[int]]) -> Tuple[Dict[int, str], Dict[int, str]]:
    """Split ranks into those that arrived (waiting) and those that did not.

    Args:
        stacks: each rank's main-thread frames, innermost first (ranks without a dump absent).
        completed: each rank's last completed training iteration (None: none yet).

    Returns:
        ``(waiting, not_arrived)``: ``{rank: what it waits in}`` and ``{rank: where it is}``.
        When the stacks do not tell (every rank waits, e.g. on GPUs where collectives are
        asynchronous), the ranks that completed the fewest iterations are the ones that did
        not arrive, if the ranks differ.
    """
    waiting = {r: s for r, s in ((r, wait_site(f)) for r, f in stacks.items()) if s}
    not_arrived = {r: site_text(f) for r, f in stacks.items() if r not in waiting}
    if not not_arrived:
        known = {r: c for r, c in completed.items() if r in stacks}
        values = [(-1 if c is None else c) for c in known.values()]
        if values and min(values) != max(values):
            low = min(values)
            not_arrived = {
                r: site_text(stacks[r])
                for r, c in known.items() if (-1 if c is None else c) == low
            }
            waiting = {r: s for r, s in waiting.items() if r not in not_arrived}
    return waiting, not_arrived
