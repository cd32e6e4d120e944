"""The local Slurm cluster of the Slurm tests (:mod:`tests.slurm.cluster`), started once per
test session. Where Slurm is not installed or does not start, every test that asks for it is
skipped, with the reason."""
import pytest

from .cluster import SlurmCluster, SlurmUnavailable


@pytest.fixture(scope='session')
def slurm():
    """A running :class:`SlurmCluster` (nodes n1, n2; partitions cpu and gpu, no GRES)."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as e:
        cluster.stop()
        pytest.skip(f'no local Slurm cluster: {e}')
    try:
        yield cluster
    finally:
        cluster.stop()
