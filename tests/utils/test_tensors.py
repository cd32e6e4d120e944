"""``nonfinite_indices``: the tensors holding a NaN or Inf, whatever their shapes and dtypes."""
import math

import pytest
import torch

from mmddp_ext.utils.tensors import nonfinite_indices


@pytest.mark.parametrize('values, bad', [
    ([], []),
    ([[1.0], [2.0, 3.0]], []),
    ([[math.nan], [1.0]], [0]),
    ([[1.0], [0.0, -math.inf], [math.inf, math.nan]], [1, 2]),
])
def test_names_exactly_the_tensors_with_a_nan_or_inf(values, bad):
    tensors = [torch.tensor(v) for v in values]
    assert nonfinite_indices(tensors) == bad


def test_mixed_dtypes_and_shapes():
    tensors = [
        torch.ones(2, 3, dtype=torch.float16),
        torch.full((4, ), math.nan),
        torch.zeros(1, dtype=torch.float64)
    ]
    assert nonfinite_indices(tensors) == [1]
