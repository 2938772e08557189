"""Tests for GraphRandomFeatures: coalescing, differentiable rebuilds, serialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gp_couple.couplings import AntitheticWalkLengthCoupling
from gp_couple.features import graph_random_features as features_module
from gp_couple.features.graph_random_features import FEATURE_KEYS, GraphRandomFeatures, gram_estimate
from gp_couple.features.walks import BYTES_PER_WALK_LENGTH, expected_walk_entries, sample_walks
from gp_couple.graphs import Graph, grid_graph
from gp_couple.kernel_families import Diffusion, RegularisedLaplacian
from tests.test_graphs import two_components_and_isolated


def assert_same(a: GraphRandomFeatures, b: GraphRandomFeatures) -> None:
    assert a.num_nodes == b.num_nodes and a.num_terms == b.num_terms
    for name, tensor in a.tensors().items():
        assert torch.equal(tensor, b.tensors()[name]), name


def test_fused_build_equals_coalescing_raw_walks() -> None:
    graph = two_components_and_isolated()
    raw = sample_walks(graph, 6, 0.3, AntitheticWalkLengthCoupling(), seed=4)
    columns_before = raw.columns.copy()
    assert_same(GraphRandomFeatures.from_walk_steps(raw, dtype=torch.float64),
                GraphRandomFeatures.sample(graph, 6, 0.3, AntitheticWalkLengthCoupling(), seed=4,
                                           dtype=torch.float64))
    np.testing.assert_array_equal(raw.columns, columns_before)  # input left unchanged


def test_feature_matrix_equals_raw_decomposition() -> None:
    graph = grid_graph(7, 7)
    raw = sample_walks(graph, 5, 0.2, seed=1)
    features = GraphRandomFeatures.from_walk_steps(raw, dtype=torch.float64)
    f = torch.linspace(1.0, 0.1, features.num_terms, dtype=torch.float64)
    np.testing.assert_allclose(features.feature_matrix(f).to_dense().numpy(),
                               raw.feature_matrix(f.numpy()).toarray(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(features.scipy_feature_matrix(f).toarray(),
                               raw.feature_matrix(f.numpy()).toarray(), rtol=1e-12, atol=1e-14)
    # Distinct sorted columns per row, and the step matrix sums the raw entries per step.
    rows = features.row_pointer.numpy()
    columns = features.columns.numpy()
    for r in range(features.num_rows):
        assert np.all(np.diff(columns[rows[r]: rows[r + 1]]) > 0)
    assert features.num_entries <= raw.num_entries
    np.testing.assert_allclose(features.weights.sum().item(), raw.weights.sum(), rtol=1e-12)


def test_chunked_build_equals_single_chunk(monkeypatch) -> None:
    graph = grid_graph(12, 12)
    whole = GraphRandomFeatures.sample(graph, 8, 0.2, seed=2)
    monkeypatch.setattr(features_module._Assembler, "CHUNK_ENTRIES", 50)
    assert_same(whole, GraphRandomFeatures.sample(graph, 8, 0.2, seed=2))


def test_values_are_differentiable_in_hyperparameters() -> None:
    graph = grid_graph(5, 5)
    features = GraphRandomFeatures.sample(graph, 4, 0.3, seed=0, dtype=torch.float64)
    family = Diffusion(0.9).double()

    def loss() -> torch.Tensor:
        return (features.values(family.modulation(features.num_terms)) ** 2).sum()

    value = loss()
    value.backward()
    analytic = family.raw_gamma.grad.item()
    eps = 1e-6
    with torch.no_grad():
        family.raw_gamma += eps
        up = loss().item()
        family.raw_gamma -= 2 * eps
        down = loss().item()
    assert analytic == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_batched_modulation() -> None:
    graph = grid_graph(4, 4)
    features = GraphRandomFeatures.sample(graph, 4, 0.3, seed=0, dtype=torch.float64)
    family = RegularisedLaplacian(torch.tensor([[0.5], [1.0], [2.0]]), batch_shape=torch.Size([3])).double()
    f = family.modulation(features.num_terms + 3)
    values = features.values(f)
    assert values.shape == (3, features.nnz)
    for b in range(3):
        torch.testing.assert_close(values[b], features.values(f[b]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_the_step_products_equal_the_dense_step_matrixs(dtype: torch.dtype, batch: tuple[int, ...]) -> None:
    """The compiled S f and S^T g (the modulation's gradient) equal the dense matrix's products, for the
    whole matrix (the features' own int32 index arrays) and for a slot subset."""
    graph = grid_graph(6, 6)
    features = GraphRandomFeatures.sample(graph, 8, 0.2, seed=3, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    subset = torch.sort(torch.randperm(features.nnz, generator=generator)[:40]).values
    for steps in (features.step_matrix(), features.step_matrix(subset)):
        dense = steps.matrix.to_dense().double()
        tolerance = 1e-12 if dtype == torch.float64 else 1e-4
        f = torch.rand(*batch, features.num_terms, generator=generator, dtype=dtype, requires_grad=True)
        values = steps.values(f)
        torch.testing.assert_close(values.double(), f.double() @ dense.T, rtol=tolerance, atol=tolerance)
        grad = torch.randn(*batch, steps.num_slots, generator=generator, dtype=dtype)
        expected = grad.double() @ dense
        (gradient,) = torch.autograd.grad((values * grad).sum(), f)
        torch.testing.assert_close(gradient.double(), expected, rtol=tolerance, atol=tolerance)


def test_the_modulation_has_second_derivatives() -> None:
    """A double backward pass (``create_graph``) differentiates the transposed product too."""
    features = GraphRandomFeatures.sample(grid_graph(5, 5), 4, 0.3, seed=0, dtype=torch.float64)
    f = torch.rand(features.num_terms, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda f: features.values(f).square(), (f,))


def test_tensors_round_trip_and_dtypes() -> None:
    graph = grid_graph(4, 4)
    features = GraphRandomFeatures.sample(graph, 4, 0.3, seed=0, dtype=torch.float32)
    assert features.dtype == torch.float32 and features.nbytes() > 0
    rebuilt = GraphRandomFeatures.from_tensors(features.tensors(), graph.num_nodes)
    assert_same(features, rebuilt)
    broken = dict(features.tensors(), steps=features.steps[:-1])
    with pytest.raises(ValueError, match="steps and weights"):
        GraphRandomFeatures.from_tensors(broken, graph.num_nodes)
    with pytest.raises(ValueError, match="missing"):
        GraphRandomFeatures.from_tensors({"weights": features.weights}, graph.num_nodes)


def test_features_carry_one_pattern_which_from_tensors_validates() -> None:
    graph = grid_graph(4, 4)
    features = GraphRandomFeatures.sample(graph, 4, 0.3, seed=0)
    assert tuple(features.tensors()) == FEATURE_KEYS
    assert features.pattern.shape == (features.num_rows, graph.num_nodes)
    assert torch.equal(features.pattern.columns, features.columns.long())
    assert features.to("cpu") is features
    unsorted = features.columns.clone()
    unsorted[:2] = unsorted[:2].flip(0)
    with pytest.raises(ValueError, match="sorted"):
        GraphRandomFeatures.from_tensors(dict(features.tensors(), columns=unsorted), graph.num_nodes)


def test_start_node_subset_rows_match_full_build() -> None:
    graph = grid_graph(6, 6)
    full = GraphRandomFeatures.sample(graph, 4, 0.3, seed=5, dtype=torch.float64)
    subset = GraphRandomFeatures.sample(graph, 4, 0.3, seed=5, start_nodes=[3, 20],
                                        dtype=torch.float64)
    f = torch.ones(max(full.num_terms, subset.num_terms), dtype=torch.float64)
    # Lengths are drawn per row, so a subset has its own lengths; the pattern of each
    # row is still a valid feature row of that node.
    assert subset.num_rows == 2 and subset.start_nodes.tolist() == [3, 20]
    assert subset.feature_matrix(f).to_dense()[0, 3] >= 1.0


def test_bad_inputs() -> None:
    graph = grid_graph(3, 3)
    features = GraphRandomFeatures.sample(graph, 2, 0.3, seed=0)
    with pytest.raises(ValueError, match="terms"):
        features.values(torch.ones(0))
    with pytest.raises(TypeError, match="tensor"):
        features.values([1.0, 2.0])
    with pytest.raises(ValueError, match="unbatched"):
        features.feature_matrix(torch.ones(2, features.num_terms))
    with pytest.raises(TypeError, match="dtype"):
        GraphRandomFeatures.sample(graph, 2, 0.3, dtype=torch.int64)
    with pytest.raises(TypeError, match="WalkSteps"):
        GraphRandomFeatures.from_walk_steps("walks")


def test_gram_estimates_from_one_and_two_sets() -> None:
    graph = grid_graph(5, 5)
    first = GraphRandomFeatures.sample(graph, 4, 0.3, seed=0, dtype=torch.float64)
    second = GraphRandomFeatures.sample(graph, 4, 0.3, seed=1, dtype=torch.float64)
    f = torch.linspace(1.0, 0.2, max(first.num_terms, second.num_terms), dtype=torch.float64)
    a = first.scipy_feature_matrix(f).toarray()
    b = second.scipy_feature_matrix(f).toarray()
    np.testing.assert_allclose(gram_estimate(first, f).toarray(), a @ a.T, atol=1e-12)
    np.testing.assert_allclose(gram_estimate(first, f, second).toarray(), 0.5 * (a @ b.T + b @ a.T), atol=1e-12)
    subset = GraphRandomFeatures.sample(graph, 4, 0.3, seed=1, start_nodes=[0, 1])
    with pytest.raises(ValueError, match="same rows"):
        gram_estimate(first, f, subset)


def test_rows_longer_than_the_packed_key_limit_coalesce_correctly() -> None:
    from gp_couple.features.walks import walk_with_lengths

    graph = grid_graph(20, 20)
    raw = walk_with_lengths(graph, np.full((1, 4), 20_000), 0.01, seed=0, start_nodes=[5])
    assert raw.num_entries > 1 << 16
    features = GraphRandomFeatures.from_walk_steps(raw, dtype=torch.float64)
    f = torch.exp(-0.001 * torch.arange(features.num_terms, dtype=torch.float64))
    np.testing.assert_allclose(features.scipy_feature_matrix(f).toarray(),
                               raw.feature_matrix(f.numpy()).toarray(), rtol=1e-10)


@pytest.mark.parametrize("directions, walkers, start_nodes, side, p_halt, scrambled", [
    # 64 walkers at p_halt 0.1 give rows of hundreds of entries: the hash-table path.
    ("independent", 64, None, 10, 0.1, False), ("repelling", 64, None, 10, 0.1, False),
    # 8,192 walkers give rows of about 90,000 raw entries (more than a packed index holds)
    # but a few thousand distinct (column, step) pairs: still the hash table.
    ("repelling", 8192, [0, 55], 10, 0.1, False),
    # Long walks on a large grid revisit few pairs: the table in use doubles several times
    # from an eighth of the row's entries.
    ("independent", 64, [0, 1_275], 50, 0.01, False), ("repelling", 64, [0, 1_275], 50, 0.01, False),
    # Node labels scrambled over 90,000 nodes: each row's columns span most of the labels, so
    # the radix sort of its distinct pairs takes three passes (two on a grid's local labels).
    ("independent", 64, [0, 45_150], 300, 0.01, True), ("repelling", 64, [7], 300, 0.02, True),
])
def test_long_rows_coalesce_like_a_sorted_reference(directions: str, walkers: int, start_nodes: list | None,
                                                     side: int, p_halt: float, scrambled: bool) -> None:
    graph = grid_graph(side, side)
    if scrambled:
        labels = np.random.default_rng(0).permutation(graph.num_nodes)
        graph = Graph.from_scipy(graph.adjacency[labels][:, labels])
    raw = sample_walks(graph, walkers, p_halt, AntitheticWalkLengthCoupling(), seed=7, directions=directions,
                       start_nodes=start_nodes)
    assert np.diff(raw.indptr).min() > 32
    if walkers > 64:
        assert np.diff(raw.indptr).min() > 1 << 16
    features = GraphRandomFeatures.from_walk_steps(raw, dtype=torch.float64)
    if p_halt < 0.1:  # more than a quarter of each row's entries are distinct pairs
        distinct = np.diff(features.slot_pointer.numpy()[features.row_pointer.numpy()])
        assert distinct.min() > np.diff(raw.indptr).max() / 4
    assert_same(features, GraphRandomFeatures.sample(graph, walkers, p_halt, AntitheticWalkLengthCoupling(), seed=7,
                                                     directions=directions, dtype=torch.float64,
                                                     start_nodes=start_nodes))
    rows, slots = features.row_pointer.numpy(), features.slot_pointer.numpy()
    columns, steps, weights = features.columns.numpy(), features.steps.numpy(), features.weights.numpy()
    for r in range(raw.num_rows):
        lo, hi = raw.indptr[r], raw.indptr[r + 1]
        order = np.lexsort((raw.steps[lo:hi], raw.columns[lo:hi]))  # stable: equal pairs in entry order
        pairs = np.stack([raw.columns[lo:hi][order], raw.steps[lo:hi][order]])
        starts = np.flatnonzero(np.r_[True, np.any(np.diff(pairs, axis=1) != 0, axis=0)])
        first, last = slots[rows[r]], slots[rows[r + 1]]
        np.testing.assert_array_equal(steps[first:last], pairs[1, starts])
        # Rounding of a sum of k terms in another order (reduceat sums pairwise): up to k ulps.
        terms = np.diff(np.r_[starts, hi - lo]).max()
        np.testing.assert_allclose(weights[first:last], np.add.reduceat(raw.weights[lo:hi][order], starts),
                                   rtol=max(1e-14, terms * np.finfo(np.float64).eps))
        np.testing.assert_array_equal(np.repeat(columns[rows[r]:rows[r + 1]], np.diff(slots[rows[r]:rows[r + 1] + 1])),
                                      pairs[0, starts])


def test_values_of_selected_slots_equal_the_full_values_and_their_gradients() -> None:
    graph = grid_graph(8, 8)
    features = GraphRandomFeatures.sample(graph, 16, 0.2, seed=3, dtype=torch.float64)
    _, slots = features.pattern.select_rows(torch.tensor([5, 0, 5, 17]))
    f = torch.linspace(1.0, 0.05, features.num_terms, dtype=torch.float64).repeat(2, 1)
    f[1] *= 0.5
    f.requires_grad_(True)
    weights = torch.randn(2, slots.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (selected_grad,) = torch.autograd.grad((features.values(f, slots) * weights).sum(), f)
    full = features.values(f)
    torch.testing.assert_close(features.values(f, slots), full[..., slots], rtol=1e-15, atol=0.0)
    (full_grad,) = torch.autograd.grad((full[..., slots] * weights).sum(), f)
    torch.testing.assert_close(selected_grad, full_grad, rtol=1e-13, atol=1e-13)
    # Reference: S as a dense (slots x steps) matrix from the stored entries.
    dense = torch.zeros(features.nnz, features.num_terms, dtype=torch.float64)
    slot_of_entry = torch.repeat_interleave(torch.arange(features.nnz), features.slot_pointer.diff().long())
    dense.index_put_((slot_of_entry, features.steps.long()), features.weights, accumulate=True)
    torch.testing.assert_close(full.detach(), f.detach() @ dense.T, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(selected_grad, weights @ dense[slots], rtol=1e-13, atol=1e-15)


def test_the_memory_estimate_follows_the_coalesced_features_not_the_raw_walk_steps() -> None:
    graph = grid_graph(20, 20)
    rows = np.arange(graph.num_nodes)
    # Many walkers revisit the same (node, step) pairs: the features coalesce them.
    features = GraphRandomFeatures.sample(graph, 512, 0.1, "antithetic", seed=3, start_nodes=rows,
                                          directions="repelling")
    estimate = features_module.expected_feature_bytes(graph, 512, 0.1, "antithetic", start_nodes=rows,
                                                      directions="repelling", seed=4)
    actual = (features.num_entries * features_module.training_bytes_per_entry(features.weights.dtype)
              + features.nnz * features_module.TRAINING_BYTES_PER_SLOT
              + rows.size * 512 * BYTES_PER_WALK_LENGTH)
    assert features.num_entries < expected_walk_entries(rows.size, 512, 0.1) / 3
    # Two standard errors above the mean of 64 rows: above the actual size, by less than the rows' spread.
    assert actual <= estimate <= 1.2 * actual
    # Entries count their steps' and weights' bytes: double precision costs 4 more per copy.
    double = features_module.expected_feature_bytes(graph, 512, 0.1, "antithetic", start_nodes=rows,
                                                    directions="repelling", seed=4, dtype=torch.float64)
    assert features.weights.dtype == torch.float32
    difference = double - estimate
    assert difference > features.num_entries * features_module.TRAINING_ENTRY_COPIES * 4
    assert difference <= 1.2 * features.num_entries * features_module.TRAINING_ENTRY_COPIES * 4


def test_an_entry_costs_its_step_and_weight_in_every_copy() -> None:
    copies = features_module.TRAINING_ENTRY_COPIES
    assert features_module.training_bytes_per_entry(torch.float32) == copies * 8
    assert features_module.training_bytes_per_entry(torch.float64) == copies * 12
    # Past int32's range the sampler stores the steps as int64.
    assert features_module.training_bytes_per_entry(torch.float64, 2.0**31) == copies * 16
    with pytest.raises(TypeError, match="floating torch dtype"):
        features_module.training_bytes_per_entry(torch.int64)


@pytest.mark.parametrize("call, error, message", [
    (lambda graph, rows: features_module.walkers_within_memory(graph, rows, 0.2, upto=3), ValueError,
     "upto must be even"),
    (lambda graph, rows: features_module.walkers_within_memory(graph, rows, 0.2, upto=2.5), TypeError, "upto"),
    (lambda graph, rows: features_module.walkers_within_memory(graph, rows, 0.2, upto=4, fraction=0), ValueError,
     "fraction"),
    (lambda graph, rows: features_module.expected_feature_bytes(graph, 4, 0.2, start_nodes=rows, pilot_rows=0),
     ValueError, "pilot_rows"),
    (lambda graph, rows: features_module.expected_feature_bytes(graph, 4, 1.5, start_nodes=rows), ValueError, "p_halt"),
])
def test_memory_estimates_refuse_bad_arguments(call, error, message) -> None:  # type: ignore[no-untyped-def]
    graph = grid_graph(5, 5)
    with pytest.raises(error, match=message):
        call(graph, np.arange(graph.num_nodes))
