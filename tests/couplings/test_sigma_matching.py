"""Tests for the matching problem of sigma-couplings (costs, assignment, length bins)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gp_couple.couplings import SigmaCoupling
from gp_couple.couplings.sigma_matching import (
    default_fitting_graph,
    grf_matching_cost,
    quantile_bin_lengths,
    sigma_coupling_from_cost,
)
from tests.stats import assert_geometric


@pytest.mark.parametrize("rows, columns", [(5, 6), (6, 3)])   # A A^T and, for tall blocks, A^T A
def test_matching_cost_matches_its_definition(rows: int, columns: int) -> None:
    rng = np.random.default_rng(0)
    psi = rng.normal(size=(4, rows, columns))
    cost = grf_matching_cost(psi)
    for q, r in itertools.product(range(4), repeat=2):
        total = sum(((psi[q, i] + psi[r, i]) @ (psi[q, j] + psi[r, j])) ** 2
                    for i in range(rows) for j in range(rows))
        assert cost[q, r] == pytest.approx(total, rel=1e-12)
    np.testing.assert_array_equal(cost, cost.T)


def test_assignment_agrees_with_brute_force_on_small_orders() -> None:
    rng = np.random.default_rng(1)
    cost = grf_matching_cost(rng.normal(size=(5, 4, 4)))
    best = min(itertools.permutations(range(5)), key=lambda p: sum(cost[q, p[q]] for q in range(5)))
    coupling = sigma_coupling_from_cost(cost, 0.3, {"objective": "test"})
    assert isinstance(coupling, SigmaCoupling) and coupling.p_halt == 0.3
    found = sum(cost[q, coupling.permutation[q]] for q in range(5))
    assert found == pytest.approx(sum(cost[q, best[q]] for q in range(5)))
    assert coupling.metadata == {"objective": "test", "cost": pytest.approx(found),
                                 "identity_cost": pytest.approx(np.trace(cost))}


def test_bin_lengths_cover_their_quantiles() -> None:
    rng = np.random.default_rng(0)
    order, p_halt = 10, 0.3
    pooled = np.concatenate([quantile_bin_lengths(q, order, (5_000,), p_halt, rng) for q in range(order)])
    assert_geometric(pooled, p_halt)  # equal mass per bin: the mixture is the full law
    low = quantile_bin_lengths(0, order, (1000,), p_halt, rng)
    high = quantile_bin_lengths(order - 1, order, (1000,), p_halt, rng)
    assert low.max() < high.min()


def test_default_fitting_graph_is_the_papers_erdos_renyi_graph() -> None:
    graph = default_fitting_graph()
    assert graph.num_nodes == 100
