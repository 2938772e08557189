"""sparse_products: sparse_matmul / spmm / sampled_dots: the CPU (SciPy, compiled) kernels against torch's CSR
kernels."""

from __future__ import annotations

import pytest
import torch

from gp_couple.operators import SparseFeatureLinearOperator, sparse_products
from gp_couple.operators.sparse_products import sampled_dots, sparse_matmul, spmm

from .mixins import dense_reference, random_pattern, random_values


@pytest.mark.parametrize("transpose", [False, True])
def test_gradcheck_both_orientations_batched_values_and_broadcast_rhs(transpose):
    pattern = random_pattern(4, 6, seed=6)
    inner = pattern.num_rows if transpose else pattern.num_columns
    rhs = torch.randn(3, 1, inner, 2, dtype=torch.float64, requires_grad=True)
    for batch in (torch.Size([2]), torch.Size()):
        values = random_values(pattern, batch, seed=7, dtype=torch.float64).requires_grad_(True)
        assert torch.autograd.gradcheck(lambda v, r: sparse_matmul(pattern, v, r, transpose=transpose),
                                        (values, rhs), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_kernels_match_torch_csr_kernels(monkeypatch, dtype):
    pattern = random_pattern(7, 11, density=0.4, seed=8)
    values = random_values(pattern, torch.Size([2]), seed=9, dtype=dtype)
    rhs = torch.randn(2, 11, 3, dtype=dtype)
    rhs_t = torch.randn(7, 4, dtype=dtype)
    left, right = torch.randn(2, 7, 5, dtype=dtype), torch.randn(11, 5, dtype=dtype)
    with torch.no_grad():
        fast = (spmm(pattern, values, rhs), spmm(pattern, values, rhs_t, transpose=True),
                sampled_dots(pattern, left, right, values.shape), sampled_dots(pattern, left, right, values.shape[1:]))
    monkeypatch.setattr(sparse_products, "on_scipy", lambda values: False)
    with torch.no_grad():
        reference = (spmm(pattern, values, rhs), spmm(pattern, values, rhs_t, transpose=True),
                     sampled_dots(pattern, left, right, values.shape),
                     sampled_dots(pattern, left, right, values.shape[1:]))
    dense = dense_reference(SparseFeatureLinearOperator(values, pattern=pattern))
    torch.testing.assert_close(reference[0], dense @ rhs)
    torch.testing.assert_close(reference[1], dense.mT @ rhs_t)
    for ours, theirs in zip(fast, reference):
        torch.testing.assert_close(ours, theirs)


def test_cached_transposed_values_give_the_same_product():
    pattern = random_pattern(5, 9, seed=10)
    values = random_values(pattern, seed=11, dtype=torch.float64)
    rhs = torch.randn(5, 2, dtype=torch.float64)
    permutation = pattern.transpose()[1]
    torch.testing.assert_close(spmm(pattern, values, rhs, transpose=True, transposed_values=values[permutation]),
                               spmm(pattern, values, rhs, transpose=True))


def test_shape_and_dtype_errors():
    pattern = random_pattern(4, 6, seed=12)
    values = random_values(pattern, dtype=torch.float64)
    with pytest.raises(TypeError, match="dtype"):
        sparse_matmul(pattern, values, torch.zeros(6, 1))
    with pytest.raises(ValueError, match="cannot multiply"):
        sparse_matmul(pattern, values, torch.zeros(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\(6, 4\) matrix"):
        sparse_matmul(pattern, values, torch.zeros(6, 1, dtype=torch.float64), transpose=True)
