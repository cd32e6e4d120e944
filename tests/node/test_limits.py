"""node_figures, pure: the four figures of a node, their counts, and the fix where one does not
fit."""
import pytest

from mmddp_ext.node.limits import BN_MIN_BATCH, NodeFacts, NodeLoad, node_figures

MIB, GIB = 2**20, 2**30


def _by_name(load, facts):
    return {f.name: f for f in node_figures(load, facts)}


def test_eight_ranks_of_four_workers_overflow_dockers_default_shm():
    load = NodeLoad(ranks_per_node=8, num_workers=4, prefetch_factor=2, batch_bytes=24 * MIB)
    shm = _by_name(load, NodeFacts(shm_size=64 * MIB))['shared memory']
    assert shm.need == 8 * 4 * 2 * 24 * MIB and shm.have == 64 * MIB and shm.fits is False
    assert '8 rank(s) × 4 worker(s) × prefetch_factor 2 × 24.00 MiB' in shm.how
    assert '--shm-size' in shm.fix and "set_sharing_strategy('file_system')" in shm.fix


@pytest.mark.parametrize(
    'workers,batch,fits',
    [
        (0, None, True),  # no workers: nothing goes through /dev/shm
        (2, None, None),  # workers, batch not measured: unknown
        (2, MIB, True),
    ])
def test_shared_memory_without_workers_or_a_measured_batch(workers, batch, fits):
    load = NodeLoad(ranks_per_node=2, num_workers=workers, batch_bytes=batch)
    figure = _by_name(load, NodeFacts(shm_size=64 * MIB))['shared memory']
    assert figure.fits is fits and (figure.fix == '')


@pytest.mark.parametrize(
    'ranks,workers,process,worker,ram,fits',
    [
        (8, 2, 3 * GIB, 1 * GIB, 64 * GIB, True),  # 8 × (3 + 2 × 1) = 40 GiB
        (8, 8, 3 * GIB, 1 * GIB, 64 * GIB, False),  # 8 × (3 + 8 × 1) = 88 GiB
        (8, 2, None, 1 * GIB, 64 * GIB, None),  # not measured
        (8, 2, 3 * GIB, 1 * GIB, None, None),  # the node's memory unknown
    ])
def test_host_memory_is_ranks_times_process_and_workers(ranks, workers, process, worker, ram, fits):
    load = NodeLoad(ranks, workers, process_bytes=process, worker_bytes=worker)
    figure = _by_name(load, NodeFacts(host_memory=ram))['host memory']
    assert figure.fits is fits
    if process is not None:
        assert figure.need == ranks * (process + workers * worker)
    assert ('OOM killer' in figure.fix) == (fits is False)


def test_threads_over_the_cores_give_the_per_rank_setting():
    figure = _by_name(NodeLoad(8, 2, threads_per_process=4), NodeFacts(cpus=16))['threads']
    assert (figure.need, figure.have, figure.fits) == (32, 16, False)
    assert 'OMP_NUM_THREADS=2' in figure.fix
    assert _by_name(NodeLoad(8, 2, threads_per_process=2), NodeFacts(cpus=16))['threads'].fits


@pytest.mark.parametrize('bn_batch,fits', [(None, None), (2, False), (BN_MIN_BATCH, True),
                                           (32, True)])
def test_batchnorm_below_the_threshold_names_syncbn(bn_batch, fits):
    figure = _by_name(NodeLoad(4, 2, bn_batch=bn_batch), NodeFacts())['batchnorm batch']
    assert figure.fits is fits and figure.need == BN_MIN_BATCH and figure.have == bn_batch
    assert ("dict(type='SyncBN')" in figure.fix) == (fits is False)


def test_figures_are_plain_data_in_a_fixed_order():
    figures = node_figures(NodeLoad(1, 0), NodeFacts())
    assert [f.name
            for f in figures] == ['host memory', 'shared memory', 'threads', 'batchnorm batch']
    assert set(figures[0].to_dict()) == {'name', 'need', 'have', 'fits', 'how', 'fix'}
