"""What every rank runs: the process group (``process_group.py``), the model wrapper of a run
(``wrapper.py``), micro-batching (``microbatch.py``: ``MicrobatchDDP``, registered on import)
and the stragglers' timing (``stragglers.py``)."""
