"""A runner built in a process that is not ours puts back what building and running it changed
process-wide, when its run ends (:mod:`mmddp_ext.utils.process_state`)."""
from typing import Any, Optional

from ..utils.process_state import restore


class PutsBackCallersProcess:
    """Mixin for a ``Runner``: after ``train``, ``val`` or ``test``, the snapshot in
    ``process_state`` (taken by the runner's ``from_cfg`` before it changed anything; None in
    a process of ours) is restored, once."""

    process_state: Optional[dict] = None

    def train(self) -> Any:
        """The runner's training; then the caller's process as it was."""
        try:
            return super().train()
        finally:
            restore(self.process_state)

    def val(self) -> Any:
        """The runner's validation; then the caller's process as it was."""
        try:
            return super().val()
        finally:
            restore(self.process_state)

    def test(self) -> Any:
        """The runner's test; then the caller's process as it was."""
        try:
            return super().test()
        finally:
            restore(self.process_state)
