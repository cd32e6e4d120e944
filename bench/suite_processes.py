"""Where the test suite's CPU goes: run pytest (the README's command by default) and sample
every process of the machine from /proc twice a second: its command, its parent, its CPU time and
the test that started it (``PYTEST_CURRENT_TEST`` in its environment). Writes
``bench/results/test_suite.json``: the wall time, the CPU of the sampled processes by kind
(``tools/dist_train.py`` ranks, the torchrun front, the diagnosis, ...) with the kind of their
parent, the tests whose processes took the most, and ``floor``: how long the run would take on
these cores if no process paid for starting Python and importing the stack.

The floor is a lower bound. After pytest, on the idle machine, one demo run (one process, one
epoch) is measured in a fresh interpreter and forked from a parent that imported the stack
(``start_up_cpu_s``: the difference of the medians of 3, what a process started from a
preloaded parent saves). Every sampled process started afresh (its command line differs from
its parent's: DataLoader workers and processes forked from a preloaded parent do not count) is
credited that much, or its whole CPU where it took less, and the rest is divided by the cores;
then once more, crediting only the processes that no launcher started (``LAUNCHERS``): those a
test could fork from a preloaded parent.

    python bench/suite_processes.py                      # the README's pytest
    python bench/suite_processes.py -- tests/e2e -n 2    # other pytest arguments

A process's CPU after its last sample (up to half a second) is not counted; its DataLoader
workers count as processes of their own (the same command line)."""
import collections
import json
import os
import os.path as osp
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEFAULT = ['tests', '-n', '2', '--dist', 'load', '--maxschedchunk', '1']
KINDS = ('dist_train.py', 'torchrun_front.py', 'diagnose.py', 'torch.distributed.run', 'srun',
         'slurmstepd', 'mpirun', 'orted', 'execnet', 'forkserver', 'multiprocessing')
HZ = os.sysconf('SC_CLK_TCK')
# a process of these kinds, or started by one, is a launcher's: the tests of launchers need it
LAUNCHERS = ('torchrun_front.py', 'torch.distributed.run', 'srun', 'slurmstepd', 'mpirun', 'orted',
             'bash', 'timeout')
SCRIPT = osp.join(ROOT, 'tools', 'dist_train.py')


def _kind(cmd):
    line = ' '.join(cmd)
    if 'exec(eval(sys.stdin.readline()))' in line:
        return 'pytest worker'
    return next((k for k in KINDS if k in line), osp.basename(cmd[0]) if cmd else '?')


def _sample(seen):
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as f:
                stat = f.read()
            fields = stat[stat.rindex(')') + 2:].split()
            key = (int(pid), int(fields[19]))  # the pid and its start time: one process
            cpu = (int(fields[11]) + int(fields[12])) / HZ
            if key not in seen:
                with open(f'/proc/{pid}/cmdline', 'rb') as f:
                    cmd = [c.decode(errors='replace') for c in f.read().split(b'\0') if c]
                with open(f'/proc/{pid}/environ', 'rb') as f:
                    env = dict(e.split(b'=', 1) for e in f.read().split(b'\0') if b'=' in e)
                test = env.get(b'PYTEST_CURRENT_TEST', b'').decode(errors='replace')
                seen[key] = dict(
                    pid=int(pid), ppid=int(fields[1]), cmd=cmd[:4], test=test.split(' (')[0])
            seen[key]['cpu'] = cpu
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile, or not ours to read


def summarize(procs, args, returncode, wall):
    """The sampled processes by kind (with their parents' kinds) and the tests that took most."""
    by_pid = {p['pid']: p for p in procs}
    kinds = collections.defaultdict(lambda: dict(processes=0, cpu_s=0.0, parents={}))
    tests = collections.Counter()
    for p in procs:
        k = kinds[_kind(p['cmd'])]
        k['processes'] += 1
        k['cpu_s'] += p['cpu']
        parent = _kind(by_pid[p['ppid']]['cmd']) if p['ppid'] in by_pid else '?'
        k['parents'][parent] = k['parents'].get(parent, 0) + 1
        tests[p['test']] += p['cpu']
    return dict(
        pytest_args=args, returncode=returncode, wall_s=round(wall, 1),
        sampled_cpu_s=round(sum(p['cpu'] for p in procs), 1), kinds={
            k: dict(v, cpu_s=round(v['cpu_s'], 1))
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]['cpu_s'])
        }, tests=[dict(test=t, cpu_s=round(c, 1)) for t, c in tests.most_common(30)])


def _busy_cpu() -> float:
    """CPU-s the whole machine has spent busy (all but idle and iowait) since it started."""
    with open('/proc/stat') as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ


def start_up_cpu(runs: int = 3) -> dict:
    """What a process forked from a parent that imported the stack saves: the machine's busy
    CPU-s for one demo run in a fresh interpreter and in a forked one (medians of ``runs``,
    taken on an idle machine, after pytest)."""
    import statistics
    import tempfile

    from common import DEMO, data_options, demo_data
    sys.path[:0] = [ROOT, osp.join(ROOT, 'tests')]
    import preloaded  # the tests' own preloaded parent (tests/preloaded.py)
    preloaded.fork_server()
    env = dict(os.environ, **preloaded.SERVER_ENV)
    opts = ['--cfg-options', *data_options(demo_data(64), 1)]
    taken = dict(fresh=[], forked=[])
    for _ in range(runs):
        work = tempfile.mkdtemp(prefix='mmddp_bench_')
        before = _busy_cpu()
        subprocess.run([sys.executable, SCRIPT, DEMO, '--work-dir', work + '/a', *opts], env=env,
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        taken['fresh'].append(_busy_cpu() - before)
        before = _busy_cpu()
        done = preloaded.train([DEMO, '--work-dir', work + '/b', *opts], work + '/b_out')
        assert done.returncode == 0, done.stdout[-3000:]
        taken['forked'].append(_busy_cpu() - before)
    fresh, forked = (statistics.median(taken[k]) for k in ('fresh', 'forked'))
    return dict(
        fresh_demo_run_cpu_s=round(fresh, 2), forked_demo_run_cpu_s=round(forked, 2),
        start_up_cpu_s=round(fresh - forked, 2))


def floor(procs, measured: dict, wall: float) -> dict:
    """The run's wall time if no process paid for its start, and if only the processes that no
    launcher started (the tests' own) did not (see the module docstring)."""
    by_pid = {p['pid']: p for p in procs}

    def parent(p: dict) -> str:
        return _kind(by_pid[p['ppid']]['cmd']) if p['ppid'] in by_pid else '?'

    fresh = [
        p for p in procs if _kind(p['cmd']) != 'pytest worker' and (
            p['ppid'] not in by_pid or by_pid[p['ppid']]['cmd'] != p['cmd'])
        and osp.basename(p['cmd'][0] if p['cmd'] else '').startswith('python')
    ]
    start_up = measured['start_up_cpu_s']
    # the tests' own processes, less the preloaded parents themselves (forking needs them)
    own = [
        p for p in fresh
        if _kind(p['cmd']) not in LAUNCHERS + ('forkserver', ) and parent(p) not in LAUNCHERS
    ]
    credited = sum(min(p['cpu'], start_up) for p in fresh)
    credited_own = sum(min(p['cpu'], start_up) for p in own)
    cores = len(os.sched_getaffinity(0))
    sampled = sum(p['cpu'] for p in procs)
    out = dict(cores=cores, **measured, fresh_interpreters=len(fresh))
    out['started_by_the_tests_themselves'] = len(own)
    out['start_up_credited_cpu_s'] = round(credited, 1)
    out['wall_s_without_start_up'] = round((sampled - credited) / cores, 1)
    out['wall_s_without_start_up_where_no_launcher_started_it'] = round(
        (sampled - credited_own) / cores, 1)
    out['used_share_of_the_cores'] = round(sampled / (cores * wall), 3)
    out['fresh_cpu_s_and_parent'] = sorted(((round(p['cpu'], 1), parent(p)) for p in fresh),
                                           reverse=True)
    return out


def main(argv):
    args = argv[argv.index('--') + 1:] if '--' in argv else DEFAULT
    seen = {}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, '-m', 'pytest', *args], cwd=ROOT)
    while proc.poll() is None:
        _sample(seen)
        time.sleep(0.5)
    wall = time.monotonic() - start
    result = summarize(list(seen.values()), args, proc.returncode, wall)
    result['floor'] = floor(list(seen.values()), start_up_cpu(), wall)
    os.makedirs(osp.join(ROOT, 'bench', 'results'), exist_ok=True)
    with open(osp.join(ROOT, 'bench', 'results', 'test_suite.json'), 'w') as f:
        json.dump(result, f, indent=1)
    for name, k in list(result['kinds'].items())[:12]:
        print(f'{k["cpu_s"]:8.1f} CPU-s {k["processes"]:5d} processes  {name}')
    print(f'wall {wall:.0f} s, sampled CPU {result["sampled_cpu_s"]:.0f} s')
    low = result['floor']
    print(f'{low["fresh_interpreters"]} fresh interpreters, start-up {low["start_up_cpu_s"]} '
          f'CPU-s each: without it the run would take at least '
          f'{low["wall_s_without_start_up"]:.0f} s on {low["cores"]} cores, and at least '
          f'{low["wall_s_without_start_up_where_no_launcher_started_it"]:.0f} s without it only '
          f'where no launcher started the process')
    return proc.returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
