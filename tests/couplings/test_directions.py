"""Direction couplings (repelling random walks) and proposals: exact marginals and unbiased kernels."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy import stats

from gp_couple.couplings import AntitheticWalkLengthCoupling, IIDWalkLengthCoupling, SigmaCoupling
from gp_couple.couplings.directions import (
    IndependentDirections,
    RepellingDirections,
    direction_coupling_from_dict,
    get_direction_coupling,
)
from gp_couple.exact import exact_kernel_matrix
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.walks import sample_walks, walk_endpoints_with_lengths, walk_with_lengths
from gp_couple.graphs import Graph, grid_graph
from gp_couple.kernel_families import Diffusion, RegularisedLaplacian
from tests.features.test_walks import replicate_grams, replicated
from tests.stats import assert_geometric, assert_unbiased

BLOCK = 8


def lognormal_graph() -> Graph:
    """Weighted 5-node component (log-normal weights), a weighted edge 5-6, isolated node 7."""
    rng = np.random.default_rng(4)
    edges = np.array([[0, 1], [0, 2], [1, 2], [1, 3], [2, 4], [3, 4], [0, 4], [5, 6]])
    return Graph.from_edges(edges, weights=rng.lognormal(0.0, 1.5, len(edges)), num_nodes=BLOCK)


FAMILIES = {"diffusion": Diffusion(0.8).double(), "reg-laplacian": RegularisedLaplacian(1.0, 2).double()}
COUPLINGS = {"iid": IIDWalkLengthCoupling(), "antithetic": AntitheticWalkLengthCoupling(),
             "sigma": SigmaCoupling(np.random.default_rng(0).permutation(10))}
COPIES = 4000
P_HALT = 0.4


@pytest.fixture(scope="module")
def union() -> Graph:
    return replicated(lognormal_graph(), COPIES)


@pytest.mark.parametrize("family_name", list(FAMILIES))
@pytest.mark.parametrize("coupling_name", list(COUPLINGS))
@pytest.mark.parametrize("directions", ["independent", "repelling"])
@pytest.mark.parametrize("proposal", ["uniform", "weighted"])
def test_unbiased_for_every_proposal_direction_and_length_coupling(union: Graph, proposal: str, directions: str,
                                                                  coupling_name: str, family_name: str) -> None:
    family = FAMILIES[family_name]
    graph = lognormal_graph()
    with torch.no_grad():
        exact = exact_kernel_matrix(family, graph).numpy()
    single, two_sets = replicate_grams(graph, COUPLINGS[coupling_name], family, P_HALT, 4, COPIES, seed=11,
                                       union=union, proposal=proposal, directions=directions)
    # Two independent feature sets: unbiased on and off the diagonal (footnote of app:grf_approx).
    assert_unbiased(two_sets.reshape(COPIES, -1), exact.ravel(), z=5.0)
    off_diagonal = ~np.eye(BLOCK, dtype=bool)
    assert_unbiased(single[:, off_diagonal], exact[off_diagonal], z=5.0)


def star_with_weights() -> tuple[Graph, np.ndarray]:
    """Centre 0 with four weighted leaves; the leaves are joined in a cycle."""
    edges = [[0, 1], [0, 2], [0, 3], [0, 4], [1, 2], [2, 3], [3, 4], [4, 1]]
    weights = [1.0, 5.0, 9.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    return Graph.from_edges(edges, weights=weights), np.array(weights[:4]) / 17.0


@pytest.mark.parametrize("proposal", ["uniform", "weighted"])
@pytest.mark.parametrize("walkers", [3, 6])  # fewer and more walkers than neighbours
def test_each_repelling_walker_follows_the_proposal(proposal: str, walkers: int) -> None:
    graph, weighted = star_with_weights()
    probabilities = weighted if proposal == "weighted" else np.full(4, 0.25)
    copies = 3000
    union = replicated(graph, copies)
    starts = np.arange(copies) * graph.num_nodes  # every copy's centre
    lengths = np.full((copies, walkers), 2)
    steps = walk_with_lengths(union, lengths, 0.5, seed=2, start_nodes=starts, proposal=proposal,
                              directions="repelling")
    # Entries per row: step 0, then walker k's two moves at 1 + 2k, 2 + 2k.
    visited = steps.columns.reshape(copies, 1 + 2 * walkers)[:, 1:] % graph.num_nodes
    transition = get_proposal_matrix(graph, proposal)
    for k in range(walkers):
        first, second = visited[:, 2 * k], visited[:, 2 * k + 1]
        observed = np.bincount(first, minlength=5)[1:]
        assert stats.chisquare(observed, copies * probabilities).pvalue > 1e-3
        # The second move, from wherever the first led, follows the proposal too.
        pairs = np.bincount(first * 5 + second, minlength=25).reshape(5, 5)
        expected = transition[0][:, None] * transition * copies
        mask = expected > 0
        assert stats.chisquare(pairs[mask], expected[mask]).pvalue > 1e-3
    # Walkers that share the centre spread out: with k <= deg they never share a first move.
    if walkers <= 4 and proposal == "uniform":
        first_moves = visited[:, 0::2]
        assert all(len(set(row)) == walkers for row in first_moves)


def get_proposal_matrix(graph: Graph, proposal: str) -> np.ndarray:
    from gp_couple.couplings.proposals import get_proposal

    return get_proposal(proposal).transition_matrix(graph).toarray()


def test_repelling_spreads_walkers_and_keeps_lengths_geometric() -> None:
    graph = grid_graph(12, 12)
    spread = {}
    for directions in ("independent", "repelling"):
        steps = sample_walks(graph, 8, 0.3, "antithetic", seed=4, directions=directions)
        assert_geometric(steps.lengths, 0.3)
        first = steps.columns[steps.steps == 1]
        rows = np.repeat(np.arange(steps.num_rows), np.diff(steps.indptr))[steps.steps == 1]
        spread[directions] = np.unique(rows * graph.num_nodes + first).size / first.size
    assert spread["repelling"] > spread["independent"]


def _squared_gram_errors(graph: Graph, family, walkers: int, directions: str, seeds: int) -> np.ndarray:
    exact = exact_kernel_matrix(family, graph).detach().numpy()
    modulation = family.modulation(400).detach()
    errors = []
    for seed in range(seeds):
        features = GraphRandomFeatures.sample(graph, walkers, 0.1, "antithetic", seed=seed, directions=directions)
        phi = features.scipy_feature_matrix(modulation[: features.num_terms])
        errors.append(np.linalg.norm((phi @ phi.T).toarray() - exact) ** 2 / np.linalg.norm(exact) ** 2)
    return np.asarray(errors)


def test_repelling_variance_keeps_falling_like_one_over_m_on_long_range_kernels() -> None:
    """Regression: walkers ranked by length once took consecutive stratified slots, so the
    longest walkers of a node moved as one block and the long-range error stalled
    (gamma = 3: m = 256 repelling was worse than independent walkers)."""
    graph, family, seeds = grid_graph(10, 10), Diffusion(3.0).double(), 12
    independent = _squared_gram_errors(graph, family, 256, "independent", seeds)
    repelling_few = _squared_gram_errors(graph, family, 32, "repelling", seeds)
    repelling = _squared_gram_errors(graph, family, 256, "repelling", seeds)

    def se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / np.sqrt(x.size))

    # Repelling must beat independent walkers by more than 5 standard errors of the difference.
    assert repelling.mean() + 5 * np.hypot(se(repelling), se(independent)) < independent.mean()
    # The mean squared error of an estimator averaging m walkers falls at least like 1/m.
    bound = repelling_few.mean() * 32 / 256
    assert repelling.mean() < bound + 5 * np.hypot(se(repelling), se(repelling_few) * 32 / 256)


def test_repelling_is_thread_count_independent_and_endpoints_match() -> None:
    upper = sp.triu(sp.random(300, 300, density=0.03, random_state=1), 1)
    graph = Graph(upper + upper.T)
    previous = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = GraphRandomFeatures.sample(graph, 6, 0.1, seed=9, directions="repelling")
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = GraphRandomFeatures.sample(graph, 6, 0.1, seed=9, directions="repelling")
    finally:
        numba.set_num_threads(previous)
    assert all(torch.equal(a, b) for a, b in zip(one.tensors().values(), many.tensors().values()))
    lengths = np.random.default_rng(0).integers(0, 5, size=(300, 5))
    steps = walk_with_lengths(graph, lengths, 0.3, seed=9, directions="repelling")
    endpoints = walk_endpoints_with_lengths(graph, lengths, seed=9, directions="repelling")
    walked = steps.lengths
    for row in range(0, 300, 17):
        position = steps.indptr[row] + 1
        for k in range(5):
            position += walked[row, k]
            expected = steps.columns[position - 1] if walked[row, k] else row
            assert endpoints[row, k] == expected


def test_names_round_trip_and_bad_names_are_explained() -> None:
    for directions in (IndependentDirections(), RepellingDirections()):
        assert direction_coupling_from_dict(directions.to_dict()) == directions
        assert get_direction_coupling(directions.name) == directions
    assert get_direction_coupling(None) == IndependentDirections()
    with pytest.raises(ValueError, match="unknown direction coupling 'sideways'.*independent.*repelling"):
        get_direction_coupling("sideways")
    with pytest.raises(TypeError, match="directions must be a str or DirectionCoupling"):
        get_direction_coupling(1)  # type: ignore[arg-type]
