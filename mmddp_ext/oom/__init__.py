"""Out-of-memory handling in one place: which errors are out-of-memory errors (``classify.py``),
giving back what a failed attempt left (``release.py``), the ranks' vote on it
(``ranks_out_of_memory.py``), oneDNN switched off after its own allocation failure
(``onednn.py``), and the advice the diagnosis gives: the per-device batch that fits
(``advice.py``)."""
