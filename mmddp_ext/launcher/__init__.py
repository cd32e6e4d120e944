"""The launcher side: how a job is started and what each process reads of its place in it.
The environment's rules (``env.py``, pure), what only Slurm knows (``slurm.py``), this
process's layout read once (``layout.py``), the rendezvous checks (``rendezvous.py``, standard
library only) and the store the ranks meet through (``store.py``), the torchrun front of
``dist_train.sh`` (``torchrun_front.py``) and the elastic start of ``mmddp_ext.launch()``
(``elastic.py``)."""
