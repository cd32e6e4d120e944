"""What every rank runs: the process group (``process_group.py``) and the model wrapper of a run
(``wrapper.py``), both set up in one call before the Runner is built (``join.py``);
micro-batching (``microbatch.py``: ``MicrobatchDDP``, registered on import) and the
stragglers' timing (``stragglers.py``)."""
