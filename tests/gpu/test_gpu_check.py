"""The prepared GPU check says in one line that there is no GPU, and exits 2."""
import pytest
import torch

from conftest import run


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is here: run the check itself')
def test_without_a_gpu_one_line_and_exit_2():
    proc = run(['bash', 'bench/gpu_check.sh'], timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stdout.strip().splitlines() == [
        'gpu_check: no NVIDIA GPU visible to torch on this machine; nothing to check'
    ]
