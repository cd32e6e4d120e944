"""One node's own limits: what its ranks and their DataLoader workers need (``limits.py``, pure)
against what the node has (``facts.py``): host memory, /dev/shm, CPU threads, the BatchNorm
batch."""
