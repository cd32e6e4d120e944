"""The collector around start-up (:mod:`mmddp_launch.start_up`), in a fresh
interpreter (``gc.freeze`` is for the whole process: not in pytest's). The entry's own use of it is
asserted on the shared 2-process run (``tests/launcher/test_elastic.py``, the ranks' ``gc``)."""
import subprocess

from conftest import PYTHON, ROOT

SCRIPT = r'''
import gc, sys, weakref
from mmddp_launch import start_up
assert 'torch' not in sys.modules                # the launch side imports no training stack

class Node:
    pass

gc.disable()                                     # as tools/dist_train.py does
kept = Node()                                    # a start-up object that lives on
lost = Node(); lost.me = lost; gone = weakref.ref(lost); del lost  # start-up garbage (a cycle)
assert gone() is not None                        # the collector is off: not freed yet
start_up.settle_start_up()
assert gc.isenabled()
assert gone() is None                            # freed by the one collection, not frozen
assert not any(o is kept for o in gc.get_objects())   # frozen: out of the collector's view
later = Node()
assert any(o is later for o in gc.get_objects())      # what training creates is collected
later.me = later; gone = weakref.ref(later); del later
gc.collect()
assert gone() is None
kept.me = kept; gone = weakref.ref(kept); del kept     # the runner, dropped at the end
gc.collect()
assert gone() is not None                        # frozen: a plain collection leaves it
frozen = gc.get_freeze_count()
start_up.collect_all()
assert gone() is None and gc.get_freeze_count() == 0
print('ok', frozen)
'''


def test_start_up_garbage_is_freed_the_rest_frozen_until_collect_all():
    proc = subprocess.run([PYTHON, '-c', SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('ok ') and int(proc.stdout.split()[1]) > 0
