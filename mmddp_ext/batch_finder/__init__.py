"""The batch finder (``max_batch_per_device='auto'``): the search over per-device batches (pure,
``search.py``), one trial step on every rank (``trials.py``), the finder that runs them before
the Runner is built (``finder.py``), and the stored result (``cache.py``). The memory budget the
trials run under is :mod:`mmddp_ext.memory.budget`, which training and the forecast use too."""
