"""The diagnosis of a failed or stuck run: what each rank left behind (:mod:`.records`) and the
one screen that names the rank, the cause and the fix (:mod:`.summary`), from the stack dumps
(:mod:`.stacks`), the raise sites (:mod:`.frames`), DDP's errors (:mod:`.ddp_errors`) and
deaths by signal (:mod:`.deaths`). ``python -m mmddp_ext.diagnose WORK_DIR`` prints it
(its flags: :mod:`mmddp_ext.diagnose.program`); ``docs/failures.md`` shows it at work.
"""
from .summary import summarize

__all__ = ['summarize']
