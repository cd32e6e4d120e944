"""Test-only, imported through ``custom_imports``: a tighter memory budget on one rank.

``MMDDP_TEST_LIMIT="RANK:MIB"`` limits that rank's address space to its size at import (the
config being parsed, before the model is built) + MIB, as a smaller GPU would. mmddp_ext's own
``scaling.memory_budget_mib`` never loosens an existing limit, so this rank stays the tightest.
"""
import os

import torch

from mmddp_ext.memory.budget import apply_budget

_spec = os.environ.get('MMDDP_TEST_LIMIT')
if _spec:
    _rank, _mib = (int(x) for x in _spec.split(':'))
    if int(os.environ.get('RANK', '0')) == _rank:
        apply_budget(_mib, torch.device('cpu'))
