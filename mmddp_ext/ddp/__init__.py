"""What every rank runs: the process group (``process_group.py``), the model wrapper of a run
(``wrapper.py``), micro-batching (``microbatch.py``: ``MicrobatchDDP``, registered on import),
its DataLoader workers (``workers.py``), the stragglers' timing (``stragglers.py``) and the
evaluator whose ranks wait for rank 0's metrics with a bound of their own (``evaluator.py``:
``PatientEvaluator``, registered on import)."""
