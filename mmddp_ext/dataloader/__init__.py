"""A rank's DataLoader workers: tied to their rank's life, leaving the stop signals to it
(``workers.py``), and handing their batches over through shared memory themselves, so that a
full /dev/shm is an error that names it (``shared_batches.py``)."""
