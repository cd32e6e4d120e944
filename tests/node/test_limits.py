"""node_figures, pure: the four figures of a node, their counts, and the fix where one does not
fit."""
import pytest

from mmddp_ext.node.limits import BN_MIN_BATCH, NodeFacts, NodeLoad, batchnorm_warning, node_figures

MIB, GIB = 2**20, 2**30


def _by_name(load, facts):
    return {f.name: f for f in node_figures(load, facts)}


def test_eight_ranks_of_four_workers_overflow_dockers_default_shm():
    load = NodeLoad(ranks_per_node=8, num_workers=4, prefetch_factor=2, batch_bytes=24 * MIB)
    shm = _by_name(load, NodeFacts(shm_size=64 * MIB))['shared memory']
    assert shm.need == 8 * 4 * 2 * 24 * MIB and shm.have == 64 * MIB and shm.fits is False
    assert '8 rank(s) × 4 worker(s) × prefetch_factor 2 × 24.00 MiB' in shm.how
    assert '--shm-size' in shm.fix and 'prefetch_factor' in shm.fix
    assert 'file_system' not in shm.fix  # that strategy keeps the batches in /dev/shm too


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


@pytest.mark.parametrize(
    'ranks,threads,workers,cores,fits,fix',
    [
        (8, 4, 0, 16, False, 'OMP_NUM_THREADS=2'),  # 32 threads on 16 cores: 2 each
        (8, 1, 2, 16, False, None),  # 8 x 3 = 24: OMP_NUM_THREADS=1 and 1 worker each
        (2, 1, 2, 16, True, ''),
        (8, 1, 0, 2, False, 'more ranks than cores on this node (8 > 2)'),
    ])
def test_busy_threads_against_the_cores(ranks, threads, workers, cores, fits, fix):
    figure = _by_name(NodeLoad(ranks, workers, threads_per_process=threads),
                      NodeFacts(cpus=cores))['threads']
    assert (figure.need, figure.have, figure.fits) == (ranks * (threads + workers), cores, fits)
    if fix is None:
        assert 'OMP_NUM_THREADS=1' in figure.fix
        assert 'train_dataloader.num_workers=1' in figure.fix
    else:
        assert fix in figure.fix and (fix or figure.fix == '')


@pytest.mark.parametrize('bn_batch,fits', [(None, None), (2, False), (BN_MIN_BATCH, True),
                                           (32, True)])
def test_batchnorm_below_the_threshold_names_syncbn(bn_batch, fits):
    figure = _by_name(NodeLoad(4, 2, bn_batch=bn_batch), NodeFacts())['batchnorm batch']
    assert figure.fits is fits and figure.need == BN_MIN_BATCH and figure.have == bn_batch
    assert ("sync_bn='torch'" in figure.fix) == (fits is False)


def test_figures_are_plain_data_in_a_fixed_order():
    figures = node_figures(NodeLoad(1, 0), NodeFacts())
    assert [f.name
            for f in figures] == ['host memory', 'shared memory', 'threads', 'batchnorm batch']
    assert set(figures[0].to_dict()) == {'name', 'need', 'have', 'fits', 'how', 'fix'}


@pytest.mark.parametrize(
    'layers, samples, why, warned',
    [
        (20, 4, 'the batch finder chose per-device batch 4', True),
        (20, 7, '', True),
        (20, 8, '', False),  # enough
        (0, 1, '', False),  # no BatchNorm that trains
    ])
def test_the_batchnorm_warning(layers, samples, why, warned):
    text = batchnorm_warning(layers, samples, why)
    assert (text is not None) == warned
    if warned:
        assert f'{layers} layer(s) that train normalise over {samples} sample(s)' in text
        assert "sync_bn='torch'" in text and (why in text)
