"""Tests for fitting sigma-couplings by linear assignment."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from gp_couple.couplings import SigmaCoupling
from gp_couple.couplings.sigma_fit import (
    default_fitting_graph,
    fit_pagerank_sigma_coupling,
    fit_sigma_coupling,
    grf_matching_cost,
    quantile_bin_lengths,
)
from gp_couple.graphs import grid_graph
from gp_couple.modulation import Diffusion, RegularisedLaplacian
from tests.stats import assert_geometric


def test_matching_cost_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    psi = rng.normal(size=(4, 5, 6))
    cost = grf_matching_cost(psi)
    for q, r in itertools.product(range(4), repeat=2):
        total = sum(((psi[q, i] + psi[r, i]) @ (psi[q, j] + psi[r, j])) ** 2
                    for i in range(5) for j in range(5))
        assert cost[q, r] == pytest.approx(total, rel=1e-12)


def test_fit_finds_the_assignment_minimum() -> None:
    graph = grid_graph(4, 4)
    fitted = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.4, 6, graph=graph, samples_per_bin=20, seed=3)
    assert sorted(fitted.permutation.tolist()) == list(range(6))
    # The assignment optimum is no worse than pairing every bin with itself.
    assert fitted.metadata["cost"] <= fitted.metadata["identity_cost"]
    again = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.4, 6, graph=graph, samples_per_bin=20, seed=3)
    np.testing.assert_array_equal(fitted.permutation, again.permutation)


def test_brute_force_agrees_on_small_orders() -> None:
    rng = np.random.default_rng(1)
    cost = grf_matching_cost(rng.normal(size=(5, 4, 4)))
    best = min(itertools.permutations(range(5)), key=lambda p: sum(cost[q, p[q]] for q in range(5)))
    from scipy.optimize import linear_sum_assignment

    rows, columns = linear_sum_assignment(cost)
    assert sum(cost[q, best[q]] for q in range(5)) == pytest.approx(cost[rows, columns].sum())


def test_bin_lengths_cover_their_quantiles() -> None:
    rng = np.random.default_rng(0)
    order, p_halt = 10, 0.3
    pooled = np.concatenate([quantile_bin_lengths(q, order, (5_000,), p_halt, rng) for q in range(order)])
    assert_geometric(pooled, p_halt)  # equal mass per bin: the mixture is the full law
    low = quantile_bin_lengths(0, order, (1000,), p_halt, rng)
    high = quantile_bin_lengths(order - 1, order, (1000,), p_halt, rng)
    assert low.max() < high.min()


def test_fitted_coupling_is_antitone_for_the_regularised_laplacian() -> None:
    # Short walks pair with long ones (fig:permuton_grf insets).
    fitted = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.5, 20, samples_per_bin=30, seed=0)
    correlation = np.corrcoef(np.arange(20), fitted.permutation)[0, 1]
    assert correlation < -0.5
    assert fitted.p_halt == 0.5 and fitted.metadata["objective"] == "grf"


def test_pagerank_fit_and_metadata() -> None:
    fitted = fit_pagerank_sigma_coupling(0.5, 6, samples_per_bin=200, seed=0)
    assert isinstance(fitted, SigmaCoupling) and fitted.order == 6
    assert fitted.metadata["cost"] <= fitted.metadata["identity_cost"]


def test_errors() -> None:
    with pytest.raises(ValueError, match="order"):
        fit_sigma_coupling(Diffusion(), 0.4, 1)
    with pytest.raises(TypeError, match="samples_per_bin"):
        fit_sigma_coupling(Diffusion(), 0.4, 4, samples_per_bin=2.5)
    with pytest.raises(TypeError, match="GraphKernelSeries"):
        fit_sigma_coupling("diffusion", 0.4)
    with pytest.raises(ValueError, match="unbatched"):
        fit_sigma_coupling(Diffusion(batch_shape=torch.Size([2])), 0.4)
    with pytest.raises(TypeError, match="Graph"):
        fit_pagerank_sigma_coupling(0.4, 4, graph=np.eye(3))
    assert default_fitting_graph().num_nodes == 100
