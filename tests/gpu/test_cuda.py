"""gpu/cuda: the real GPUs behind the seam. On a host without a GPU or NVIDIA driver (this
suite's machine) the seam says so and never raises for a question; the NVML table's rows read
the driver's "not available" value as unknown."""
from types import SimpleNamespace

import pytest
import torch

from mmddp_ext.gpu import cuda
from mmddp_ext.gpu.cuda import CudaGpus

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason='for a host without a GPU')


@needs_no_gpu
def test_a_host_without_gpus():
    g = CudaGpus()
    assert not g.available() and not g.tensors_on_gpu() and g.count() == 0
    assert not g.initialized()
    g.empty_cache()  # nothing to release: no error


@pytest.mark.skipif(CudaGpus().nvml_available(), reason='for a host without an NVIDIA driver')
def test_without_nvml_the_process_table_names_why():
    with pytest.raises(RuntimeError, match='nvmlInit failed|nvidia-ml-py'):
        CudaGpus().process_table(0)


@pytest.mark.parametrize('used, expected', [(2**30, 2**30), (None, None),
                                            (cuda._NOT_AVAILABLE, None)])
def test_a_rows_memory(used, expected):
    assert cuda._used_bytes(SimpleNamespace(usedGpuMemory=used)) == expected
