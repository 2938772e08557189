"""Tests for PageRank estimation with coupled walkers."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from gp_couple.couplings import AntitheticWalkLengthCoupling, IIDWalkLengthCoupling, SigmaCoupling
from gp_couple.graphs import Graph
from gp_couple.pagerank import estimate_pagerank, exact_pagerank
from tests.stats import assert_unbiased
from tests.test_graphs import two_components_and_isolated


@pytest.fixture(scope="module")
def karate() -> Graph:
    return Graph.from_networkx(nx.karate_club_graph(), weight=None)


def test_exact_pagerank_matches_networkx(karate: Graph) -> None:
    expected = nx.pagerank(nx.karate_club_graph(), alpha=0.75, weight=None, tol=1e-13)
    np.testing.assert_allclose(exact_pagerank(karate, 0.25), [expected[i] for i in range(34)], atol=1e-9)


@pytest.mark.parametrize("coupling", [IIDWalkLengthCoupling(), AntitheticWalkLengthCoupling(),
                                      SigmaCoupling(np.random.default_rng(1).permutation(10))],
                         ids=lambda c: c.name)
def test_estimator_is_unbiased(karate: Graph, coupling) -> None:
    estimates = np.stack([estimate_pagerank(karate, 0.3, 2, coupling, seed=seed) for seed in range(3000)])
    assert_unbiased(estimates, exact_pagerank(karate, 0.3), z=5.0)
    np.testing.assert_allclose(estimates.sum(axis=1), 1.0)


@pytest.mark.parametrize("proposal", ["uniform", "weighted"])
@pytest.mark.parametrize("directions", ["independent", "repelling"])
def test_estimator_is_unbiased_for_the_proposal_chain(proposal: str, directions: str) -> None:
    """The proposal is the walk whose PageRank is estimated; repelling walkers keep it unbiased."""
    weighted = nx.karate_club_graph()
    rng = np.random.default_rng(2)
    for u, v in weighted.edges:
        weighted[u][v]["weight"] = rng.lognormal(0.0, 1.0)
    graph = Graph.from_networkx(weighted)
    exact = exact_pagerank(graph, 0.3, proposal)
    if proposal == "weighted":
        expected = nx.pagerank(weighted, alpha=0.7, weight="weight", tol=1e-13)
        np.testing.assert_allclose(exact, [expected[i] for i in range(34)], atol=1e-9)
    estimates = np.stack([estimate_pagerank(graph, 0.3, 4, "antithetic", seed=seed, proposal=proposal,
                                            directions=directions) for seed in range(1500)])
    assert_unbiased(estimates, exact, z=5.0)


def test_errors(karate: Graph) -> None:
    with pytest.raises(ValueError, match="isolated"):
        exact_pagerank(two_components_and_isolated(), 0.3)
    with pytest.raises(TypeError):
        estimate_pagerank(np.eye(3), 0.3)
    with pytest.raises(ValueError, match="even"):
        estimate_pagerank(karate, 0.3, 3, AntitheticWalkLengthCoupling())
