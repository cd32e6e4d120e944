"""Real runs made once per test session (:func:`conftest.once`, shared by pytest-xdist's
workers) for the tests that only read what they left: a plugin of the root conftest
(``pytest_plugins``), so every test can ask for them by name."""
import os.path as osp

import pytest

from conftest import (DEMO_CONFIG, check_ok, demo_options, demo_with_hooks, finish, once, popen,
                      stop_point_by_hand)
from preloaded import train


@pytest.fixture(scope='session')
def trained_demo(demo_data, tmp_path_factory):
    """(work dir, output) of one 2-epoch single-process run of the demo (forked from the
    preloaded stack, ``tests/preloaded.py``), validated after its last epoch, made once for the
    session; read only (a test that trains on in it takes a
    :func:`copy_of` it)."""

    def build(work_dir: str) -> None:
        out = check_ok(
            train([
                DEMO_CONFIG, '--work-dir', work_dir,
                *demo_options(demo_data, max_epochs=2, validate=True)
            ], work_dir + '_out'))
        with open(osp.join(work_dir, 'train.log.txt'), 'w') as f:
            f.write(out)

    work_dir = once(tmp_path_factory, 'train_demo', build)
    with open(osp.join(work_dir, 'train.log.txt')) as f:
        return work_dir, f.read()


class HealthyRun:
    """What the shared healthy run left: ``returncode``, ``out`` (stdout and stderr), ``work``
    (its work dir), ``records`` (RankRecordHook's folder), ``beside`` (ReadBesideHook's),
    ``seen`` (``{(pid, ip)}`` of its listening sockets) and ``hostname`` (True when it ran
    under a host name that resolves beyond loopback; else ``why_not``)."""

    def __init__(self, folder: str) -> None:
        import json
        with open(osp.join(folder, 'run.json')) as f:
            got = json.load(f)
        self.returncode, self.out, self.hostname = got['rc'], got['out'], got['hostname']
        self.why_not, self.seen = got['why_not'], {tuple(s) for s in got['seen']}
        self.work, self.records = osp.join(folder, 'w'), osp.join(folder, 'rec')
        self.beside = osp.join(folder, 'beside')


@pytest.fixture(scope='session')
def healthy_run(demo_data, tmp_path_factory) -> HealthyRun:
    """One healthy 2-process ``dist_train.sh`` run of the demo (1 epoch, 2 iterations), made
    once for the tests that read it: RankRecordHook, RankMemoryHook(interval=1) and
    ReadBesideHook (/proc beside each of its readings), ``--resume``
    on an empty work dir, under a host name that resolves to a non-loopback address where the
    machine allows it (``listening.other_hostname_prefix``), its listening sockets read at every
    line it printed."""
    import json

    from listening import finish_watching_sockets, other_hostname_prefix

    def build(folder: str) -> None:
        prefix, why_not = other_hostname_prefix(folder)
        cfg = demo_with_hooks(
            folder, f"dict(type='RankRecordHook', out_dir={osp.join(folder, 'rec')!r}), "
            "dict(type='RankMemoryHook', interval=1), "
            f"dict(type='ReadBesideHook', out_dir={osp.join(folder, 'beside')!r})",
            ['rank_record_hook', 'read_beside_hook'], 'healthy.py')
        proc = popen((prefix or []) + [
            'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
            osp.join(folder, 'w'), '--resume', *demo_options(demo_data, 1)
        ])
        [(rc, out)], seen = finish_watching_sockets([proc])
        with open(osp.join(folder, 'run.json'), 'w') as f:
            json.dump(
                dict(rc=rc, out=out, seen=sorted(seen), hostname=bool(prefix), why_not=why_not), f)

    run_ = HealthyRun(once(tmp_path_factory, 'healthy_run', build))
    check_ok(run_)
    return run_


@pytest.fixture(scope='session')
def stop_point_reference(demo_data, tmp_path_factory) -> dict:
    """What a preemption test's run trains when it is never stopped: ``{rank: [(iter, epoch,
    ids), ...]}``, from one run made once for the session (by hand; the sampler's seed is
    fixed, so the launcher does not change it) and read by the by-hand, torchrun and Slurm
    preemption tests."""
    from tests.helpers.stop_point_hook import hook_source, trained_iterations

    def build(folder: str) -> None:
        flags = osp.join(folder, 'flags')
        config = demo_with_hooks(folder, hook_source(flags, 0), ['stop_point_hook'], 'ref.py')
        results = finish(stop_point_by_hand(config, osp.join(folder, 'w'), demo_data))
        assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]

    return trained_iterations(
        osp.join(once(tmp_path_factory, 'stop_point_reference', build), 'flags'), 2)


@pytest.fixture(scope='session')
def two_jobs(demo_data, tmp_path_factory) -> list:
    """Two 2-process ``dist_train.sh`` jobs of the demo (1 epoch) started at once on this
    machine, neither given a PORT: ``[(returncode, output, work dir), ...]``. The second runs
    with ``MMDDP_QUIET=0`` and ``--resume`` on its empty work dir (the control of the quiet
    filters, ``tests/e2e/test_quiet.py``)."""
    import json

    def build(folder: str) -> None:
        procs = [
            popen([
                'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir',
                osp.join(folder, f'job{i}'), *(['--resume'] if i else []),
                *demo_options(demo_data, 1)
            ], env=dict(MMDDP_QUIET='0') if i else None) for i in range(2)
        ]
        with open(osp.join(folder, 'jobs.json'), 'w') as f:
            json.dump([list(result) for result in finish(procs)], f)

    folder = once(tmp_path_factory, 'two_jobs', build)
    with open(osp.join(folder, 'jobs.json')) as f:
        return [(rc, out, osp.join(folder, f'job{i}')) for i, (rc, out) in enumerate(json.load(f))]
