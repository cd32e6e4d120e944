"""The launch side of mmddp_ext: what runs before the training stack is imported, or without it.

``dist_train.sh``'s torchrun front (:mod:`mmddp_ext.launcher.torchrun_front`) and
``tools/dist_train.py`` import these modules in a fraction of a second, where importing
``mmddp_ext`` (which registers its hooks and runner in MMEngine) takes seconds. Standard
library and psutil only; nothing here imports ``mmddp_ext``, torch or MMEngine
(``tests/launch/test_shared.py`` checks it). ``mmddp_ext`` imports from here.

* :mod:`.shared`: what the front, the script and the ranks agree on (the stop exit code, the
  stop signals, the environment markers between them).
* :mod:`.rendezvous`: checks and waits before the ranks meet (ports, addresses, the bound).
* :mod:`.kubeflow`: a job operator's variables, read by the front.
* :mod:`.files`: the one atomic write.
* :mod:`.start_up`: the garbage collector around start-up.
"""
