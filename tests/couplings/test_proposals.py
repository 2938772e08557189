"""Neighbour proposals: tables, exact agreement with uniform walks on unweighted graphs, registration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gp_couple.couplings.proposals import (
    NEIGHBOUR_PROPOSALS,
    NeighbourProposal,
    UniformProposal,
    WeightedProposal,
    get_proposal,
    proposal_from_dict,
)
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.walks import sample_walk_endpoints, sample_walks, walk_endpoints_with_lengths
from gp_couple.graphs import Graph, grid_graph


def features_equal(a: GraphRandomFeatures, b: GraphRandomFeatures) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.tensors().values(), b.tensors().values()))


@pytest.mark.parametrize("directions", ["independent", "repelling"])
def test_weighted_proposal_reproduces_uniform_walks_on_unweighted_graphs(directions: str) -> None:
    graph = grid_graph(6, 7)
    for coupling in ("iid", "antithetic"):
        uniform = GraphRandomFeatures.sample(graph, 4, 0.2, coupling, seed=3, proposal="uniform",
                                             directions=directions)
        weighted = GraphRandomFeatures.sample(graph, 4, 0.2, coupling, seed=3, proposal="weighted",
                                              directions=directions)
        default = GraphRandomFeatures.sample(graph, 4, 0.2, coupling, seed=3, directions=directions)
        assert features_equal(uniform, weighted) and features_equal(uniform, default)
    raw = [sample_walks(graph, 3, 0.3, seed=5, proposal=name, directions=directions)
           for name in ("uniform", "weighted")]
    assert np.array_equal(raw[0].columns, raw[1].columns) and np.array_equal(raw[0].weights, raw[1].weights)
    ends = [sample_walk_endpoints(graph, 3, 0.3, seed=5, proposal=name, directions=directions)
            for name in ("uniform", "weighted")]
    assert np.array_equal(*ends)


def test_equal_weight_rows_use_the_uniform_draw() -> None:
    # Node 0 has equal weights (uniform row), node 1 does not.
    graph = Graph.from_edges([[0, 1], [0, 2], [1, 2], [1, 3]], weights=[2.0, 2.0, 1.0, 4.0])
    tables = WeightedProposal().tables(graph)
    assert tables.choice_degrees[0] == 2 and tables.choice_degrees[1] == -3
    uniform = UniformProposal().tables(graph)
    rows = np.repeat(np.arange(graph.num_nodes), graph.degrees)
    uniform_edges = tables.choice_degrees[rows] > 0
    np.testing.assert_array_equal(tables.ratios[uniform_edges], uniform.ratios[uniform_edges])
    d = graph.weighted_degrees
    np.testing.assert_allclose(tables.ratios[~uniform_edges],
                               np.sqrt(d[rows] / d[graph.indices])[~uniform_edges], rtol=1e-15)
    # Row-wise cumulative probabilities end at exactly one.
    last = graph.indptr[1:][graph.degrees > 0] - 1
    assert np.all(tables.cumulative[last[tables.choice_degrees[graph.degrees > 0] < 0]] == 1.0)
    assert WeightedProposal().tables(graph) is tables  # cached on the graph


@pytest.mark.parametrize("proposal", [UniformProposal(), WeightedProposal()])
def test_transition_matrix_is_stochastic_and_ratios_are_unbiased(proposal: NeighbourProposal) -> None:
    rng = np.random.default_rng(0)
    graph = Graph.from_edges([[0, 1], [1, 2], [2, 0], [2, 3], [4, 5]], weights=rng.lognormal(0, 1, 5),
                             num_nodes=7)
    transition = proposal.transition_matrix(graph).toarray()
    connected = graph.degrees > 0
    np.testing.assert_allclose(transition.sum(axis=1)[connected], 1.0, rtol=1e-12)
    # E[ratio * 1{next = v}] = W~(u, v): importance weighting undoes the proposal.
    tables = proposal.tables(graph)
    ratios = np.zeros((7, 7))
    rows = np.repeat(np.arange(7), graph.degrees)
    ratios[rows, graph.indices] = tables.ratios
    np.testing.assert_allclose(transition * ratios, graph.normalized_adjacency().toarray(), rtol=1e-12)


def test_names_round_trip_and_bad_names_are_explained() -> None:
    for proposal in (UniformProposal(), WeightedProposal()):
        assert proposal_from_dict(proposal.to_dict()) == proposal
        assert get_proposal(proposal.name) == proposal
    assert get_proposal(None) == WeightedProposal()
    with pytest.raises(ValueError, match="unknown neighbour proposal 'nope'.*uniform.*weighted"):
        get_proposal("nope")
    with pytest.raises(TypeError, match="proposal must be a str or NeighbourProposal"):
        get_proposal(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown neighbour proposal type"):
        proposal_from_dict({"type": "nope"})


class SquareRootProposal(NeighbourProposal):
    """A user's proposal: probabilities proportional to the square root of the weights."""

    name = "test-sqrt-weight"

    def edge_probabilities(self, graph: Graph) -> np.ndarray:
        root = np.sqrt(graph.weights)
        rows = np.repeat(np.arange(graph.num_nodes), graph.degrees)
        return root / np.bincount(rows, root, graph.num_nodes)[rows]


class BrokenProposal(NeighbourProposal, register=False):
    name = "test-broken"

    def edge_probabilities(self, graph: Graph) -> np.ndarray:
        return np.full(graph.weights.shape, 0.5)


def test_user_proposal_registers_walks_and_is_checked() -> None:
    assert "test-sqrt-weight" in NEIGHBOUR_PROPOSALS
    graph = Graph.from_edges([[0, 1], [0, 2], [0, 3]], weights=[1.0, 4.0, 16.0])
    assert proposal_from_dict({"type": "test-sqrt-weight"}) == SquareRootProposal()
    draws = 20_000
    ends = walk_endpoints_with_lengths(graph, np.ones((1, draws), dtype=np.int64), seed=1, start_nodes=[0],
                                       proposal="test-sqrt-weight")
    probabilities = np.array([1.0, 2.0, 4.0]) / 7.0
    counts = np.bincount(ends.ravel(), minlength=4)[1:]
    expected = draws * probabilities
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - probabilities)))
    with pytest.raises(ValueError, match="must sum to 1"):
        BrokenProposal().tables(graph)


@pytest.mark.parametrize("degree", [2, 3, 4, 7, 16, 17, 40])  # unrolled, counted and bisected rows
@pytest.mark.parametrize("directions", ["independent", "repelling"])
def test_weighted_choice_follows_the_weights_at_every_degree(degree: int, directions: str) -> None:
    from scipy import stats

    weights = np.random.default_rng(degree).lognormal(0.0, 1.0, degree)
    graph = Graph.from_edges([[0, leaf] for leaf in range(1, degree + 1)], weights=weights)
    draws = 20_000
    ends = walk_endpoints_with_lengths(graph, np.ones((1, draws), dtype=np.int64), seed=degree,
                                       start_nodes=[0], proposal="weighted", directions=directions)
    counts = np.bincount(ends.ravel(), minlength=degree + 1)[1:]
    assert stats.chisquare(counts, draws * weights / weights.sum()).pvalue > 1e-3
