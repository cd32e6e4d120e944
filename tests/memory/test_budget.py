"""``apply_budget`` on a CPU, in a fresh process (the limit cannot be lifted once set).

The child is single-threaded (OMP/MKL, torch's intra- and inter-op pools): every thread's stack is
address space, so with a pool as large as the host's core count a 400 MiB headroom over the
current size would depend on the host."""
import json
import os
import subprocess
import sys

SCRIPT = '''
import json, os, resource, psutil, torch
from mmddp_ext.memory.budget import apply_budget
torch.set_num_threads(1)                                   # before the limit: no pool grows
torch.set_num_interop_threads(1)
threads = (torch.get_num_threads(), torch.get_num_interop_threads())
mkldnn_before = torch.backends.mkldnn.enabled
vms = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (vms + 400 * 2 ** 20, resource.RLIM_INFINITY))
budget = apply_budget(2000, torch.device('cpu'))          # looser than the existing limit
soft = resource.getrlimit(resource.RLIMIT_AS)[0]
try:
    torch.empty(600 * 2 ** 20, dtype=torch.uint8)           # beyond the budget: a real error
    raised = ''
except RuntimeError as e:
    raised = str(e)
small = torch.ones(10 * 2 ** 20, dtype=torch.uint8).sum().item()  # within it: fine
print(json.dumps(dict(room=budget.nbytes, how=budget.how, soft_over_vms=soft - vms,
                      raised=raised, small=small, threads=threads,
                      onednn=os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'),
                      mkldnn=[mkldnn_before, torch.backends.mkldnn.enabled])))
'''


def test_cpu_budget_keeps_a_tighter_limit_and_fails_for_real():
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    out = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got['threads'] == [1, 1]
    assert got['soft_over_vms'] <= 400 * 2**20  # never loosened to 2000 MiB
    assert got['room'] <= 400 * 2**20
    assert 'scaling.memory_budget_mib=2000' in got['how'] and 'tighter existing limit' in got['how']
    assert "can't allocate memory" in got['raised']
    assert got['small'] == 10 * 2**20
    assert got['onednn'] == '0'
    assert got['mkldnn'] == [True, False]  # torch's own convolutions under the budget
    assert "torch's own CPU kernels, not oneDNN's" in got['how']


SAVE_SCRIPT = '''
import io, json, resource, sys, torch
from mmddp_ext.memory.budget import apply_budget, checkpoint_writing
torch.set_num_threads(1)
torch.set_num_interop_threads(1)
user = int(sys.argv[1])  # MiB of a limit the user set before the budget (0: none)
if user:
    import psutil
    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + user * 2 ** 20, resource.RLIM_INFINITY))
before = resource.getrlimit(resource.RLIMIT_AS)[0]
with checkpoint_writing():  # no budget yet: nothing to lift
    untouched = resource.getrlimit(resource.RLIMIT_AS)[0] == before
apply_budget(300, torch.device('cpu'))
state = {'w': torch.ones(40 * 2 ** 20)}  # a 160 MiB checkpoint, held within the budget
budget = resource.getrlimit(resource.RLIMIT_AS)[0]

def save():  # as MMEngine's save_checkpoint: into memory first, then a copy of the bytes
    with io.BytesIO() as f:
        torch.save(state, f)
        return len(f.getvalue())

def attempt():
    try:
        return save()
    except (MemoryError, RuntimeError) as e:
        return type(e).__name__
without = attempt()
with checkpoint_writing():
    lifted = resource.getrlimit(resource.RLIMIT_AS)[0]
    written = attempt()
print(json.dumps(dict(untouched=untouched, without=without, written=written,
                      lifted_to_before=lifted == before,
                      restored=resource.getrlimit(resource.RLIMIT_AS)[0] == budget)))
'''


def _save_under_budget(user_mib: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    out = subprocess.run(
        [sys.executable, '-c', SAVE_SCRIPT, str(user_mib)], capture_output=True, text=True,
        timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_checkpoint_is_written_outside_the_cpu_budget_and_the_budget_comes_back():
    """A checkpoint that fills the budget: serialized into memory as MMEngine does, it fails
    under the budget (the run died there after a whole epoch) and is written inside
    ``checkpoint_writing``, which lifts the limit to what the process had before the budget
    and puts the budget back after."""
    got = _save_under_budget(0)
    assert got['untouched'] is True
    assert got['without'] in ('MemoryError', 'RuntimeError')  # positive control
    assert isinstance(got['written'], int) and got['written'] > 160 * 2**20
    assert got['lifted_to_before'] is True and got['restored'] is True


def test_checkpoint_writing_keeps_the_users_own_limit():
    """With a user's limit (``ulimit -v``) of 1000 MiB set before a 300 MiB budget, the save
    is lifted to the user's limit, not beyond: it still has the room it needs there."""
    got = _save_under_budget(1000)
    assert got['lifted_to_before'] is True and got['restored'] is True
    assert isinstance(got['written'], int) and got['written'] > 160 * 2**20
