"""Where a rank's records go when its work dir refuses them (full, read-only, permission
refused, gone): a folder in this host's temporary directory named after the work dir, which
the diagnosis and the rank's own screen read beside the work dir (docs/failures.md, "When the
work dir refuses the records").

The records written there carry ``work_dir_error``: the work dir, the error it gave and where
the records went, so the screen says why they are not in the work dir.
"""
import hashlib
import os
import os.path as osp
import socket
import tempfile
from typing import Dict, Iterable, List


def spare_dir(work_dir: str) -> str:
    """``$TMPDIR/mmddp_ext-records-<uid>/<work dir's name>-<hash of its absolute path>``:
    the same folder for every rank of a host and every run in that work dir."""
    path = osp.abspath(work_dir)
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    uid = os.getuid() if hasattr(os, 'getuid') else 0
    return osp.join(tempfile.gettempdir(), f'mmddp_ext-records-{uid}',
                    f'{osp.basename(path) or "root"}-{digest}')


def refusal(work_dir: str, error: BaseException) -> Dict[str, str]:
    """What a record kept in the spare folder says of the work dir that refused it."""
    return dict(
        work_dir=osp.abspath(work_dir), error=f'{type(error).__name__}: {error}',
        kept_in=spare_dir(work_dir), host=socket.gethostname())


def refused_lines(states: Iterable[Dict]) -> List[str]:
    """One line per rank whose records the work dir refused (from its failure records and
    progress files, each rank once)."""
    seen: Dict[int, Dict] = {}
    for state in states:
        refused = state.get('work_dir_error')
        if refused and state.get('rank') not in seen:
            seen[state.get('rank')] = refused
    return [
        f'  rank {rank}\'s records: the work dir {r.get("work_dir")} refused them '
        f'({r.get("error")}); kept in {r.get("kept_in")} on host {r.get("host")}'
        for rank, r in sorted(seen.items(), key=lambda kv: str(kv[0]))
    ]
