"""Pivoted Cholesky of the GRF Gram operator: block reads, and pivots reused across steps."""

from __future__ import annotations

import pytest
import torch
from linear_operator import to_linear_operator

from gp_couple.operators import GRFGramLinearOperator, SparseFeatureLinearOperator
from gp_couple.settings import preconditioner_pivot_reuse

from .mixins import gram_reference, random_pattern, random_values


def _gram(values: torch.Tensor, pattern) -> GRFGramLinearOperator:
    return GRFGramLinearOperator(SparseFeatureLinearOperator(values, pattern=pattern))


@pytest.fixture
def pattern():
    # 40 rows over 200 nodes, 80 of them visited by no walk (a compact inner space).
    return random_pattern(40, 200, density=0.05, seed=21, untouched=80)


def test_outer_product_index_reads_a_block(pattern):
    gram = _gram(random_values(pattern, seed=22, dtype=torch.float64), pattern)
    dense = gram_reference(gram)
    rows, cols = torch.tensor([3, 0, 39, 3]), torch.arange(40)
    torch.testing.assert_close(gram[rows.unsqueeze(-1), cols.unsqueeze(-2)], dense[rows][:, cols])
    torch.testing.assert_close(gram[cols.unsqueeze(-1), torch.tensor([-1, 5]).unsqueeze(-2)], dense[:, [39, 5]])


def test_pivoted_cholesky_and_its_gradient_match_the_dense_matrix(pattern):
    values = random_values(pattern, seed=23, dtype=torch.float64).requires_grad_(True)
    factor, permutation = _gram(values, pattern).pivoted_cholesky(rank=6, return_pivots=True)
    (grad,) = torch.autograd.grad(factor.square().sum(), values)
    dense_values = values.detach().clone().requires_grad_(True)
    reference, reference_permutation = to_linear_operator(
        gram_reference(_gram(dense_values, pattern))).pivoted_cholesky(rank=6, return_pivots=True)
    (reference_grad,) = torch.autograd.grad(reference.square().sum(), dense_values)
    torch.testing.assert_close(permutation[:6], reference_permutation[:6])
    torch.testing.assert_close(factor, reference)
    torch.testing.assert_close(grad, reference_grad)


def test_reused_pivots_give_the_nystrom_factor_and_its_gradient(pattern):
    values = random_values(pattern, seed=24, dtype=torch.float64)
    with preconditioner_pivot_reuse(0.05):
        _, first = _gram(values, pattern).pivoted_cholesky(rank=6, return_pivots=True)
        moved = (values * 1.01).requires_grad_(True)  # a uniform scale keeps the normalised diagonal
        factor, permutation = _gram(moved, pattern).pivoted_cholesky(rank=6, return_pivots=True)
    torch.testing.assert_close(permutation, first)
    (grad,) = torch.autograd.grad(factor.square().sum(), moved)
    dense_values = moved.detach().clone().requires_grad_(True)
    reference = to_linear_operator(gram_reference(_gram(dense_values, pattern))).pivoted_cholesky(rank=6)
    (reference_grad,) = torch.autograd.grad(reference.square().sum(), dense_values)
    torch.testing.assert_close(factor, reference)
    torch.testing.assert_close(grad, reference_grad)


def test_pivots_are_searched_again_when_the_diagonal_moved(pattern, monkeypatch):
    values = random_values(pattern, seed=25, dtype=torch.float64)
    searches = []
    original = GRFGramLinearOperator.__mro__[1].pivoted_cholesky

    def counting(self, *args, **kwargs):
        searches.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GRFGramLinearOperator.__mro__[1], "pivoted_cholesky", counting)
    with preconditioner_pivot_reuse(0.05):
        _gram(values, pattern).pivoted_cholesky(rank=4)
        _gram(values * 2.0, pattern).pivoted_cholesky(rank=4)
        assert len(searches) == 1
        shifted = values.clone()
        shifted[pattern.row_pointer[7]:pattern.row_pointer[8]] *= 3.0  # row 7's diagonal grows 9x
        _gram(shifted, pattern).pivoted_cholesky(rank=4)
        assert len(searches) == 2
    _gram(values, pattern).pivoted_cholesky(rank=4)  # reuse is off outside the context
    assert len(searches) == 3
    assert preconditioner_pivot_reuse.value() is None


def test_reuse_tolerance_is_validated():
    with pytest.raises(ValueError, match="tolerance"):
        preconditioner_pivot_reuse(-0.1)
    with pytest.raises(TypeError, match="tolerance"):
        preconditioner_pivot_reuse("small")


@pytest.mark.parametrize("reuse", [None, 0.05])
def test_a_gram_of_zeros_is_preconditioned_by_the_noise_alone(pattern, reuse):
    # A vanishing kernel (a trial point of a huge range underflows every feature) has no
    # positive pivot: linear_operator's factor would be NaN and CG would warn and drop it.
    import warnings

    import linear_operator
    from linear_operator.operators import DiagLinearOperator

    zeros = torch.zeros_like(random_values(pattern, seed=26, dtype=torch.float64))
    gram = _gram(zeros, pattern)
    with preconditioner_pivot_reuse(reuse):
        factor, permutation = gram.pivoted_cholesky(rank=6, return_pivots=True)
    assert factor.shape == (40, 1) and not factor.any()
    torch.testing.assert_close(permutation, torch.arange(40))
    rhs = torch.linspace(-1.0, 1.0, 40, dtype=torch.float64).unsqueeze(-1)
    covariance = gram + DiagLinearOperator(torch.full((40,), 0.5, dtype=torch.float64))
    with warnings.catch_warnings(), linear_operator.settings.max_cholesky_size(0), \
            linear_operator.settings.min_preconditioning_size(1):
        warnings.simplefilter("error")
        solution = covariance.solve(rhs)
    torch.testing.assert_close(solution, rhs / 0.5)
