"""The launcher side: how a job is started and what each process reads of its place in it.
The ways a job starts, one module each (``ways/``), the environment's rules (``env.py``,
pure), this process's layout read once (``layout.py``), the store the ranks meet through
(``store.py``), the torchrun front of ``dist_train.sh`` (``torchrun_front.py``) and the
elastic start of ``mmddp_ext.launch()`` (``elastic.py``). The rendezvous checks, the shared
constants and the rest of what the front needs without MMEngine: :mod:`mmddp_launch`."""
