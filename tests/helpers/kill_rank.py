"""Test-only, imported through ``custom_imports``: one rank dies by a signal, as an OOM kill would.

``MMDDP_TEST_KILL_RANK="RANK[:SIGNAL]"`` makes the process whose RANK is that number send
itself the signal (default SIGKILL) while the config is parsed, before any rendezvous. Other
processes (other ranks, the diagnosis reading the config) are left alone.
"""
import os
import signal

_spec = os.environ.get('MMDDP_TEST_KILL_RANK')
if _spec and 'RANK' in os.environ:
    _rank, _, _name = _spec.partition(':')
    if os.environ['RANK'] == _rank:
        os.kill(os.getpid(), getattr(signal, _name or 'SIGKILL'))
