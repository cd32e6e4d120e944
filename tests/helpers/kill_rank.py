"""Test-only, imported through ``custom_imports``: one rank dies by a signal, as an OOM kill would.

``MMDDP_TEST_KILL_RANK="RANK[:SIGNAL]"`` makes the process whose RANK is that number send
itself the signal (default SIGKILL) while the config is parsed, before any rendezvous. Other
processes (other ranks, the diagnosis reading the config) are left alone. With
``MMDDP_TEST_KILL_ATTEMPT=N`` only in the elastic agent's attempt N
(``TORCHELASTIC_RESTART_COUNT``): the restarted workers live.
"""
import os
import signal

_spec = os.environ.get('MMDDP_TEST_KILL_RANK')
_attempt = os.environ.get('MMDDP_TEST_KILL_ATTEMPT')
if _spec and 'RANK' in os.environ and (_attempt is None or os.environ.get(
        'TORCHELASTIC_RESTART_COUNT', '0') == _attempt):
    _rank, _, _name = _spec.partition(':')
    if os.environ['RANK'] == _rank:
        os.kill(os.getpid(), getattr(signal, _name or 'SIGKILL'))
