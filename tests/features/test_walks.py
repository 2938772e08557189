"""Tests for the compiled walk sampler: correctness, unbiasedness, determinism, errors."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gp_couple.couplings import AntitheticWalkLengthCoupling, IIDWalkLengthCoupling, SigmaCoupling
from gp_couple.exact import exact_kernel_matrix
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.sigma_fit import fit_sigma_coupling
from gp_couple.features.walks import (
    expected_walk_bytes,
    sample_walk_endpoints,
    sample_walks,
    walk_endpoints_with_lengths,
    walk_with_lengths,
)
from gp_couple.graphs import Graph, grid_graph
from gp_couple.kernel_families import Diffusion, RegularisedLaplacian
from tests.stats import assert_unbiased
from tests.test_graphs import two_components_and_isolated

BLOCK = 7  # nodes of the small test graph


def replicated(graph: Graph, copies: int) -> Graph:
    """Disjoint union of ``copies`` copies: one sampler call draws independent replicates."""
    return Graph(sp.block_diag([graph.adjacency] * copies, format="csr"))


def replicate_grams(graph: Graph, coupling, family, p_halt: float, walkers: int, copies: int,
                    seed: int, max_length: int | None = None, union: Graph | None = None,
                    **options) -> tuple[np.ndarray, np.ndarray]:
    """Per-replicate Gram estimates: one feature set (Phi Phi^T) and two sets (Phi_A Phi_B^T).

    ``union`` may pass ``replicated(graph, copies)`` built once; ``options`` go to the sampler
    (e.g. ``proposal``, ``directions``).
    """
    union = replicated(graph, copies) if union is None else union
    block = graph.num_nodes
    sets = []
    for offset in range(2):
        features = GraphRandomFeatures.sample(union, walkers, p_halt, coupling, seed=seed + offset,
                                              max_length=max_length, dtype=torch.float64, **options)
        with torch.no_grad():
            phi = features.scipy_feature_matrix(family.modulation(features.num_terms).reshape(-1)).tocoo()
        # Walks stay in their component, so each row's columns lie in its own copy.
        slot = (phi.row // block * block + phi.row % block) * block + phi.col % block
        sets.append(np.bincount(slot, weights=phi.data, minlength=copies * block * block)
                    .reshape(copies, block, block))
    single = sets[0] @ sets[0].transpose(0, 2, 1)
    double = sets[0] @ sets[1].transpose(0, 2, 1)
    return single, 0.5 * (double + double.transpose(0, 2, 1))


FAMILIES = {"diffusion": Diffusion(0.8).double(), "reg-laplacian": RegularisedLaplacian(1.0, 2).double()}
COUPLINGS = {"iid": IIDWalkLengthCoupling(), "antithetic": AntitheticWalkLengthCoupling(),
             "sigma-random": SigmaCoupling(np.random.default_rng(0).permutation(12)),
             "sigma-fitted": fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.4, 12,
                                                samples_per_bin=30, seed=0)}


@pytest.mark.parametrize("family_name", list(FAMILIES))
@pytest.mark.parametrize("coupling_name", list(COUPLINGS))
def test_unbiased_on_graph_with_isolated_node_and_two_components(family_name: str,
                                                                  coupling_name: str) -> None:
    graph = two_components_and_isolated()
    family = FAMILIES[family_name]
    with torch.no_grad():
        exact = exact_kernel_matrix(family, graph).numpy()
    single, two_sets = replicate_grams(graph, COUPLINGS[coupling_name], family, 0.4, 2,
                                       copies=20_000, seed=17)
    off_diagonal = ~np.eye(BLOCK, dtype=bool)
    assert_unbiased(single[:, off_diagonal], exact[off_diagonal], z=5.0)
    # Two independent feature sets are unbiased on the diagonal too (app:grf_approx footnote).
    assert_unbiased(two_sets.reshape(len(two_sets), -1), exact.ravel(), z=5.0)
    # The isolated node's row is exact: K_66 = alpha_0 and no covariance.
    np.testing.assert_allclose(single[:, 6, 6], float(family.coefficients(1).detach().reshape(-1)[0]), rtol=1e-12)
    assert np.all(single[:, 6, :6] == 0)


def test_single_set_diagonal_is_biased_upwards() -> None:
    graph = two_components_and_isolated()
    family = FAMILIES["diffusion"]
    with torch.no_grad():
        exact = exact_kernel_matrix(family, graph).numpy()
    single, _ = replicate_grams(graph, IIDWalkLengthCoupling(), family, 0.4, 2, copies=20_000, seed=3)
    diagonal = single[:, np.arange(6), np.arange(6)]
    mean, se = diagonal.mean(0), diagonal.std(0, ddof=1) / np.sqrt(len(diagonal))
    assert np.all(mean - np.diag(exact)[:6] > 5 * se)


def test_truncation_estimates_the_truncated_series() -> None:
    graph = two_components_and_isolated()
    family = FAMILIES["reg-laplacian"]
    w = graph.normalized_adjacency().toarray()
    with torch.no_grad():
        f = family.modulation(3).reshape(-1).double().numpy()
    half = sum(f[p] * np.linalg.matrix_power(w, p) for p in range(3))
    _, two_sets = replicate_grams(graph, IIDWalkLengthCoupling(), family, 0.3, 4, copies=20_000, seed=5,
                                  max_length=2)
    assert_unbiased(two_sets.reshape(len(two_sets), -1), (half @ half).ravel(), z=5.0)


class TestWalkMechanics:
    @pytest.mark.parametrize("proposal", ["uniform", "weighted"])
    def test_walks_follow_edges_with_importance_weights(self, proposal: str) -> None:
        graph = two_components_and_isolated()
        lengths = np.full((7, 1), 6)
        steps = walk_with_lengths(graph, lengths, 0.25, seed=0, proposal=proposal)
        w = graph.normalized_adjacency().toarray()
        d = graph.weighted_degrees
        for row in range(7):
            entries = slice(steps.indptr[row], steps.indptr[row + 1])
            columns, step, weights = steps.columns[entries], steps.steps[entries], steps.weights[entries]
            if row == 6:  # isolated: cannot move
                assert columns.tolist() == [6] and weights.tolist() == [1.0]
                continue
            assert step.tolist() == list(range(7)) and columns[0] == row
            load = 1.0
            for t in range(1, 7):
                u, v = columns[t - 1], columns[t]
                assert w[u, v] > 0
                # Uniform choice has P(v|u) = 1/deg(u); weighted choice W_uv / d_u, so
                # W~(u, v) / P(v|u) = sqrt(d_u / d_v).
                ratio = w[u, v] * graph.degrees[u] if proposal == "uniform" else np.sqrt(d[u] / d[v])
                load *= ratio / (1 - 0.25)
                assert weights[t] == pytest.approx(load, rel=1e-12)

    def test_row_sizes_follow_lengths(self) -> None:
        graph = grid_graph(5, 5)
        steps = sample_walks(graph, 4, 0.3, seed=1)
        np.testing.assert_array_equal(np.diff(steps.indptr), 1 + steps.lengths.sum(axis=1))
        assert steps.max_step == steps.lengths.max()

    @pytest.mark.parametrize("proposal, probabilities", [("uniform", [1 / 3, 1 / 3, 1 / 3]),
                                                         ("weighted", [1 / 15, 5 / 15, 9 / 15])])
    def test_neighbour_choice_follows_the_proposal(self, proposal: str, probabilities: list) -> None:
        graph = Graph.from_edges([[0, 1], [0, 2], [0, 3]], weights=[1.0, 5.0, 9.0])
        draws = 30_000
        endpoints = walk_endpoints_with_lengths(graph, np.ones((1, draws), dtype=np.int64), seed=0,
                                                start_nodes=[0], proposal=proposal)
        counts = np.bincount(endpoints.ravel(), minlength=4)[1:]
        expected = draws * np.array(probabilities)
        assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected * (1 - np.array(probabilities))))

    def test_endpoints_are_the_last_visited_nodes(self) -> None:
        graph = grid_graph(6, 6)
        lengths = np.random.default_rng(0).integers(0, 5, size=(36, 3))
        steps = walk_with_lengths(graph, lengths, 0.3, seed=9)
        endpoints = walk_endpoints_with_lengths(graph, lengths, seed=9)
        for row in range(36):
            position = steps.indptr[row] + 1
            for walker in range(3):
                position += lengths[row, walker]
                expected = steps.columns[position - 1] if lengths[row, walker] else row
                assert endpoints[row, walker] == expected

    def test_walks_do_not_depend_on_other_start_nodes(self) -> None:
        graph = grid_graph(8, 8)
        lengths = np.full((1, 4), 5)
        alone = walk_with_lengths(graph, lengths, 0.3, seed=4, start_nodes=[10])
        full = walk_with_lengths(graph, np.full((64, 4), 5), 0.3, seed=4)
        np.testing.assert_array_equal(alone.columns, full.columns[full.indptr[10]: full.indptr[11]])


class TestDeterminism:
    def test_same_seed_same_features_different_seed_differs(self) -> None:
        graph = grid_graph(10, 10)
        first = GraphRandomFeatures.sample(graph, 4, 0.3, AntitheticWalkLengthCoupling(), seed=7)
        second = GraphRandomFeatures.sample(graph, 4, 0.3, AntitheticWalkLengthCoupling(), seed=7)
        for name, tensor in first.tensors().items():
            assert torch.equal(tensor, second.tensors()[name]), name
        other = GraphRandomFeatures.sample(graph, 4, 0.3, AntitheticWalkLengthCoupling(), seed=8)
        assert not torch.equal(first.weights, other.weights) or not torch.equal(first.columns, other.columns)

    def test_independent_of_thread_count(self) -> None:
        graph = grid_graph(30, 30)
        threads = numba.get_num_threads()
        try:
            numba.set_num_threads(1)
            serial = GraphRandomFeatures.sample(graph, 8, 0.2, seed=3)
        finally:
            numba.set_num_threads(threads)
        parallel = GraphRandomFeatures.sample(graph, 8, 0.2, seed=3)
        for name, tensor in serial.tensors().items():
            assert torch.equal(tensor, parallel.tensors()[name]), name

    def test_generators_are_accepted(self) -> None:
        graph = grid_graph(4, 4)
        a = sample_walks(graph, 2, 0.5, seed=np.random.default_rng(1))
        b = sample_walks(graph, 2, 0.5, seed=np.random.default_rng(1))
        np.testing.assert_array_equal(a.columns, b.columns)
        c = sample_walks(graph, 2, 0.5, seed=torch.Generator().manual_seed(3))
        d = sample_walks(graph, 2, 0.5, seed=torch.Generator().manual_seed(3))
        np.testing.assert_array_equal(c.weights, d.weights)


class TestErrors:
    graph = grid_graph(3, 3)

    @pytest.mark.parametrize("start_nodes, error, message", [
        ([0, 9], ValueError, r"\[0, 9\)"), ([[0, 1]], ValueError, "1-D"),
        ([0.5], TypeError, "start_nodes must hold node indices as integers, got dtype float64"),
        ([1, 1], ValueError, "start_nodes contains duplicate node index 1")])
    def test_bad_start_nodes(self, start_nodes, error, message) -> None:
        with pytest.raises(error, match=message):
            sample_walks(self.graph, 2, 0.5, start_nodes=start_nodes)

    @pytest.mark.parametrize("lengths, error, message", [
        (np.ones((8, 2), dtype=int), ValueError, "shape"), (-np.ones((9, 2), dtype=int), ValueError, "non-negative"),
        (np.ones((9, 2)), TypeError, "integers"), (np.full((9, 1), 70_000), ValueError, "max_length"),
        (np.ones((9, 0), dtype=int), ValueError, "at least one")])
    def test_bad_lengths(self, lengths, error, message) -> None:
        with pytest.raises(error, match=message):
            walk_with_lengths(self.graph, lengths, 0.5)

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="num_walkers"):
            sample_walks(self.graph, 0, 0.5)
        with pytest.raises(TypeError, match="num_walkers"):
            sample_walks(self.graph, 2.5, 0.5)
        with pytest.raises(ValueError, match="p_halt"):
            sample_walks(self.graph, 2, 1.5)
        with pytest.raises(ValueError, match="max_length"):
            sample_walks(self.graph, 2, 0.5, max_length=-1)
        with pytest.raises(TypeError, match="graph"):
            sample_walks(np.eye(3), 2, 0.5)
        with pytest.raises(ValueError, match="even"):
            sample_walks(self.graph, 3, 0.5, "antithetic")
        with pytest.raises(ValueError, match="modulation"):
            sample_walks(self.graph, 2, 0.5, seed=0, max_length=3).feature_matrix(np.ones(1))

    def test_graphs_beyond_the_packed_node_index_are_refused(self) -> None:
        from gp_couple.features.walks import MAX_WALK_NODES
        from gp_couple.graphs import grid_graph

        huge = grid_graph(3, 3)  # a graph of its own (graphs are immutable, and copies share them)
        huge._num_nodes = MAX_WALK_NODES + 1  # stands in for a graph too large to build here
        for draw in (lambda: sample_walks(huge, 2, 0.5, start_nodes=[0]),
                     lambda: sample_walk_endpoints(huge, 2, 0.5, start_nodes=[0]),
                     lambda: GraphRandomFeatures.sample(huge, 2, 0.5, start_nodes=[0])):
            with pytest.raises(ValueError, match="MAX_WALK_NODES"):
                draw()

    def test_walks_that_cannot_fit_in_memory_are_refused_before_sampling(self) -> None:
        # 9 rows x 10^12 walkers: lengths alone would need 72 TB; refused with the estimate.
        with pytest.raises(ValueError, match=r"needs about .* GiB for the walk lengths, more than"):
            sample_walks(self.graph, 10**12, 0.5)
        with pytest.raises(ValueError, match="GiB"):
            GraphRandomFeatures.sample(self.graph, 10**12, 0.5)
        with pytest.raises(ValueError, match="GiB"):
            sample_walk_endpoints(self.graph, 10**9, 1e-6)
        # max_length bounds the walks and so the estimate.
        assert expected_walk_bytes(9, 1000, 1e-6, max_length=10) < expected_walk_bytes(9, 1000, 1e-6)

    def test_raw_walks_are_refused_by_their_entries_and_features_as_they_grow(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gp_couple import _checks
        from gp_couple.features import graph_random_features as features_module, walks

        # Lengths of 9 x 1000 walkers, and one block's draw of them, fit in 2 MB; their ~9 x 10^6 raw entries
        # (40 bytes each) do not.
        monkeypatch.setattr(walks, "physical_memory", lambda: 2 * 10**6)
        with pytest.raises(ValueError, match=r"GiB for the walk entries, more than"):
            sample_walks(self.graph, 1000, 1e-3, seed=0)
        # Features coalesce the entries chunk by chunk and grow their arrays as they go,
        # checking each growth against the available memory.
        monkeypatch.setattr(features_module._Assembler, "CHUNK_ENTRIES", 1000)
        monkeypatch.setattr(_checks, "ALWAYS_FITS_BYTES", 0)
        monkeypatch.setattr(_checks, "available_memory", lambda: 10**4)
        with pytest.raises(ValueError, match="graph random features of 9 rows .* more than the"):
            GraphRandomFeatures.sample(self.graph, 1000, 1e-3, seed=0)

    def test_endpoint_sampler_matches_walk_sampler_streams(self) -> None:
        endpoints = sample_walk_endpoints(self.graph, 4, 0.4, seed=12)
        assert endpoints.shape == (9, 4) and endpoints.min() >= 0 and endpoints.max() < 9


def test_step_matrices_sum_to_the_feature_matrix() -> None:
    graph = grid_graph(5, 5)
    steps = sample_walks(graph, 4, 0.3, seed=2)
    f = 0.7 ** np.arange(steps.max_step + 1)
    total = sum(f[t] * steps.step_matrix(t) for t in range(steps.max_step + 1))
    np.testing.assert_allclose(total.toarray(), steps.feature_matrix(f).toarray(), rtol=1e-12)
    assert steps.step_matrix(0).nnz == graph.num_nodes  # every row starts at its own node
    with pytest.raises(ValueError, match="step"):
        steps.step_matrix(-1)
