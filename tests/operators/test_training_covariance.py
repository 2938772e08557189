"""An exact GP's training covariance taken apart and formed densely, as its operators would form it."""

from __future__ import annotations

import math

import pytest
import torch
from linear_operator.operators import (
    AddedDiagLinearOperator,
    ConstantMulLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
    LinearOperator,
)

from gp_couple.operators.training_covariance import dense_covariance, scaled_plus_diagonal


def _covariance(batch: tuple[int, ...], scaled: bool) -> LinearOperator:
    """``s K + diag(noise)`` as a Gaussian likelihood adds its noise to a (scaled) kernel matrix."""
    generator = torch.Generator().manual_seed(0)
    root = torch.randn(*batch, 7, 7, dtype=torch.float64, generator=generator)
    kernel: LinearOperator = DenseLinearOperator(root @ root.mT)
    if scaled:
        # ConstantMulLinearOperator, as a ScaleKernel's lazily evaluated output is.
        kernel = ConstantMulLinearOperator(kernel, torch.linspace(1.5, 2.5, math.prod(batch), dtype=torch.float64)
                                           .reshape(batch))
    noise = DiagLinearOperator(torch.full((*batch, 7), 0.3, dtype=torch.float64))
    return AddedDiagLinearOperator(kernel, noise)


@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_dense_covariance_equals_the_operators_own(batch: tuple[int, ...], scaled: bool) -> None:
    covariance = _covariance(batch, scaled)
    parts = scaled_plus_diagonal(covariance)
    assert parts is not None and (parts[1] is not None) == scaled
    torch.testing.assert_close(parts[2], torch.full((*batch, 7), 0.3, dtype=torch.float64))
    expected = covariance.to_dense()
    dense = dense_covariance(covariance)
    torch.testing.assert_close(dense, expected, rtol=1e-15, atol=1e-15)
    # A new tensor the caller may overwrite (the operators keep their own dense matrices).
    dense.zero_()
    torch.testing.assert_close(covariance.to_dense(), expected, rtol=0.0, atol=0.0)
    single = dense_covariance(covariance, torch.float32)
    assert single.dtype == torch.float32
    torch.testing.assert_close(single, expected.float())


@pytest.mark.parametrize("batch, entry", [((3,), (1,)), ((), ())])
def test_a_batch_entry_keeps_its_parts(batch: tuple[int, ...], entry: tuple[int, ...]) -> None:
    # Indexing turns the added diagonal into the sum of the scaled kernel and a diagonal operator.
    part = _covariance(batch, scaled=True)[entry]
    parts = scaled_plus_diagonal(part)
    assert parts is not None and parts[1] is not None
    torch.testing.assert_close(dense_covariance(part), part.to_dense(), rtol=1e-15, atol=1e-15)


def test_other_operators_are_densified_and_copied() -> None:
    matrix = torch.eye(4, dtype=torch.float64) * 2.0
    operator = DenseLinearOperator(matrix)
    assert scaled_plus_diagonal(operator) is None
    dense = dense_covariance(operator, torch.float64)
    torch.testing.assert_close(dense, matrix)
    dense.zero_()
    assert float(matrix[0, 0]) == 2.0


def test_the_dense_covariance_is_differentiable_in_the_scale_the_kernel_and_the_noise() -> None:
    generator = torch.Generator().manual_seed(1)
    root = torch.randn(5, 5, dtype=torch.float64, generator=generator)
    matrix = (root @ root.mT).requires_grad_(True)
    scale = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    noise = torch.full((5,), 0.2, dtype=torch.float64, requires_grad=True)

    def covariance(matrix: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        operator = AddedDiagLinearOperator(ConstantMulLinearOperator(DenseLinearOperator(matrix), scale),
                                           DiagLinearOperator(noise))
        return dense_covariance(operator)

    torch.autograd.gradcheck(covariance, (matrix, scale, noise))
