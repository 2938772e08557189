"""The structural facts the graph's lean memory relies on (issue 20): no RSS or timing here.

* :func:`grid_graph` and :meth:`Graph.from_edges` write the CSR arrays directly, and they
  are the arrays of the old construction (a scipy COO matrix of both orientations, summed,
  symmetrised as ``(A + A^T) / 2``), value for value;
* the index arrays are int32 below ``2**31 - 1`` nodes and entries, and scipy views of the
  graph share them (no int64 copies);
* the walk tables share the graph's degrees, the uniform ratios are bit for bit
  ``normalized_weights() * degrees`` without keeping :math:`\\widetilde W`, and walks are the
  same, bit for bit, on int32 and int64 index arrays;
* an unweighted graph holds no weights (a read-only zero-stride view of 1.0), and everything
  computed from it (adjacency, degrees, :math:`\\widetilde W`, proposal tables, walks,
  fingerprints, pickles) is what stored unit weights gave, bit for bit.
"""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from gp_couple import graphs
from gp_couple.couplings.proposals import DEFAULT_PROPOSAL, UniformProposal, WeightedProposal, uniform_ratios
from gp_couple.features.walks import walk_endpoints_with_lengths, walk_with_lengths
from gp_couple.graphs import Graph, _index_dtype, erdos_renyi_graph, grid_graph, icosphere_graph


def old_csr(edges: np.ndarray, weights: np.ndarray, num_nodes: int) -> sp.csr_matrix:
    """The CSR matrix the builders made before: COO of both orientations, summed, ``(A + A^T) / 2``."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    mirrored = edges[:, 0] != edges[:, 1]
    rows = np.concatenate([edges[:, 0], edges[mirrored, 1]])
    cols = np.concatenate([edges[:, 1], edges[mirrored, 0]])
    data = np.concatenate([weights, weights[mirrored]])
    matrix = sp.coo_matrix((data, (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    matrix = ((matrix + matrix.T) * 0.5).tocsr()
    matrix.sort_indices()
    return matrix


def grid_edges(rows: int, cols: int) -> np.ndarray:
    index = np.arange(rows * cols).reshape(rows, cols)
    return np.concatenate([np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], axis=1),
                           np.stack([index[:-1, :].ravel(), index[1:, :].ravel()], axis=1)])


def assert_same_csr(graph: Graph, matrix: sp.csr_matrix) -> None:
    np.testing.assert_array_equal(graph.indptr, matrix.indptr)
    np.testing.assert_array_equal(graph.indices, matrix.indices)
    assert graph.weights.tobytes() == matrix.data.astype(np.float64).tobytes()


def with_int64_indices(graph: Graph) -> Graph:
    """The same graph holding int64 index arrays (those of a graph past 2**31 entries)."""
    wide = Graph.__new__(Graph)
    wide._indptr, wide._indices = graph.indptr.astype(np.int64), graph.indices.astype(np.int64)
    wide._weights, wide._num_nodes = graph.weights, graph.num_nodes
    return wide


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 6), (6, 1), (2, 2), (3, 7), (16, 9)])
def test_grid_csr_is_the_old_construction(rows: int, cols: int) -> None:
    graph = grid_graph(rows, cols)
    edges = grid_edges(rows, cols)
    assert_same_csr(graph, old_csr(edges, np.ones(len(edges)), rows * cols))
    assert graph == Graph.from_edges(edges.reshape(-1, 2), num_nodes=rows * cols)


@pytest.mark.parametrize("seed", range(8))
def test_edge_lists_build_the_old_csr(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_nodes = int(rng.integers(2, 30))
    edges = rng.integers(0, num_nodes, size=(int(rng.integers(1, 120)), 2))
    # Both orientations, repeats, zero weights and self-loops; dyadic weights sum exactly in any order.
    weights = rng.integers(0, 5, size=len(edges)) / 4.0
    for self_loops in ("drop", "keep"):
        graph = Graph.from_edges(edges, weights=weights, num_nodes=num_nodes + 2, self_loops=self_loops)
        kept = edges[:, 0] != edges[:, 1] if self_loops == "drop" else np.ones(len(edges), dtype=bool)
        assert_same_csr(graph, old_csr(edges[kept], weights[kept], num_nodes + 2))
        assert graph == Graph(graph.adjacency, self_loops="keep")


def test_repeated_edges_with_arbitrary_weights_are_exactly_symmetric() -> None:
    # Weights are summed in list order: the same sum for (u, v) and (v, u), so W is symmetric
    # without averaging (an edge listed three or more times may differ from the old
    # construction in the last bit).
    rng = np.random.default_rng(1)
    edges, weights = rng.integers(0, 6, size=(80, 2)), rng.random(80)
    graph = Graph.from_edges(edges, weights=weights, self_loops="keep")
    adjacency = graph.adjacency
    assert (adjacency != adjacency.T).nnz == 0
    reference = old_csr(edges, weights, 6)
    np.testing.assert_array_equal(graph.indptr, reference.indptr)
    np.testing.assert_array_equal(graph.indices, reference.indices)
    np.testing.assert_allclose(graph.weights, reference.data, rtol=1e-15)


def test_edge_list_checks_are_those_of_matrices() -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        Graph.from_edges([[0, 1]], weights=[np.nan])
    with pytest.raises(ValueError, match="negative weights"):
        Graph.from_edges([[0, 1], [1, 2]], weights=[1.0, -2.0])
    with pytest.raises(ValueError, match=r"2 self-loop\(s\) \(e.g. node 1\)"):
        Graph.from_edges([[3, 3], [1, 1], [1, 1], [0, 1], [2, 2]], weights=[1.0, 1.0, 1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="node 1 has weighted degree"):
        Graph.from_edges([[0, 1], [2, 1]], weights=[0.6e300, 0.6e300])
    with pytest.raises(ValueError, match="graph is empty"):
        Graph.from_edges(np.zeros((0, 2), dtype=np.int64))
    assert Graph.from_edges([], num_nodes=3).degrees.tolist() == [0, 0, 0]
    only_zero = Graph.from_edges([[0, 1], [1, 2]], weights=[0.0, 1.0])
    assert only_zero.num_edges == 1 and only_zero.degrees.tolist() == [0, 1, 1]


def test_exactly_symmetric_matrices_are_kept_and_round_off_is_averaged() -> None:
    rng = np.random.default_rng(2)
    upper = sp.random(20, 20, density=0.3, random_state=3, format="csr")
    symmetric = (upper + upper.T).tocsr()
    graph = Graph(symmetric, self_loops="keep")
    symmetric.sort_indices()
    assert_same_csr(graph, symmetric)
    noisy = symmetric.copy()
    noisy.data = noisy.data * (1 + 1e-15 * rng.standard_normal(noisy.nnz))
    averaged = ((noisy + noisy.T) * 0.5).tocsr()
    averaged.sort_indices()
    assert_same_csr(Graph(noisy, self_loops="keep"), averaged)


def test_index_arrays_are_int32_and_shared_with_scipy_views() -> None:
    graph = grid_graph(5, 4)
    assert graph.indptr.dtype == graph.indices.dtype == graph.degrees.dtype == np.int32
    for matrix in (graph.adjacency, graph.normalized_adjacency()):
        assert np.shares_memory(matrix.indptr, graph.indptr) and np.shares_memory(matrix.indices, graph.indices)
    for other in (Graph.from_edges([[0, 1], [1, 2]]), Graph(np.ones((3, 3)) - np.eye(3))):
        assert other.indptr.dtype == other.indices.dtype == np.int32
    assert _index_dtype(10, 2**31 - 2) is np.int32
    assert _index_dtype(10, 2**31 - 1) is np.int64 and _index_dtype(2**31 - 1, 4) is np.int64


def test_fingerprint_hashes_int64_indices_whatever_their_dtype() -> None:
    graph = grid_graph(3, 5)
    digest = hashlib.sha256()
    for array in (np.int64(graph.num_nodes), graph.indptr.astype(np.int64), graph.indices.astype(np.int64),
                  graph.weights):
        digest.update(array.tobytes())
    assert graph.fingerprint() == digest.hexdigest() == with_int64_indices(graph).fingerprint()


def test_walk_tables_share_the_graph_and_keep_no_normalised_weights() -> None:
    graph = grid_graph(6, 7)
    for proposal in (DEFAULT_PROPOSAL, UniformProposal()):
        tables = proposal.tables(graph)
        # Unit weights: per-node scales instead of a per-edge ratio table.
        assert tables.choice_degrees is graph.degrees and tables.ratios.size == 0
        assert tables.node_scales.shape == (graph.num_nodes,) and tables.cumulative.size == 0
    # Neither W~, the weighted degrees nor the per-edge ratios are kept for the walks' sake.
    assert not {"normalized_weights", "weighted_degrees", "walk_ratios"} & set(graph.__dict__["_derived"])
    rows = np.repeat(np.arange(graph.num_nodes), graph.degrees)
    on_the_fly = (tables.node_scales[rows] * tables.node_scales[graph.indices]) * graph.degrees[rows].astype(float)
    assert on_the_fly.tobytes() == uniform_ratios(graph).tobytes()
    weighted = Graph.from_edges(np.array([[0, 1], [1, 2]]), weights=[1.0, 3.0])
    tables = UniformProposal().tables(weighted)
    assert tables.node_scales.size == 0 and tables.ratios is uniform_ratios(weighted)
    expected = graph.normalized_weights() * np.repeat(graph.degrees, graph.degrees)
    assert uniform_ratios(graph).tobytes() == expected.tobytes()


def test_weighted_tables_keep_the_old_values() -> None:
    # Node 0 has unequal weights (cumulative table, ratio sqrt(d_u / d_v)); the others are uniform.
    edges = np.array([[0, 1], [0, 2], [0, 3], [3, 4]])
    graph = Graph.from_edges(edges, weights=[1.0, 2.0, 0.5, 0.5])
    tables = WeightedProposal().tables(graph)
    d, degrees = graph.weighted_degrees, graph.degrees
    rows = np.repeat(np.arange(graph.num_nodes), degrees)
    uniform = np.array([False, True, True, True, True])
    expected = np.where(uniform[rows], graph.normalized_weights() * degrees[rows],
                        np.sqrt(d[rows] / d[graph.indices]))
    assert tables.ratios.tobytes() == expected.tobytes()
    assert tables.choice_degrees.tolist() == [-3, 1, 1, 2, 1]
    np.testing.assert_allclose(tables.cumulative[:3], np.cumsum(graph.weights[:3]) / d[0])
    assert "walk_ratios" not in graph.__dict__["_derived"]


@pytest.mark.parametrize("directions", ["independent", "repelling"])
@pytest.mark.parametrize("proposal", ["weighted", "uniform"])
def test_walks_are_the_same_on_int32_and_int64_indices(proposal: str, directions: str) -> None:
    # A weighted star (a long row, searched by bisection) joined to a grid (uniform rows).
    grid = grid_graph(5, 6)
    hub = np.c_[np.full(20, 30), np.arange(20)]
    edges = np.concatenate([np.column_stack(sp.triu(grid.adjacency).nonzero()), hub])
    weights = np.concatenate([np.ones(grid.num_edges), 0.3 + np.arange(20) * 0.37])
    graph = Graph.from_edges(edges, weights=weights)
    wide = with_int64_indices(graph)
    assert graph.indices.dtype == np.int32 and wide.degrees.dtype == np.int64
    lengths = np.random.default_rng(4).integers(0, 25, size=(graph.num_nodes, 6))
    narrow_walks = walk_with_lengths(graph, lengths, 0.1, seed=9, proposal=proposal, directions=directions)
    wide_walks = walk_with_lengths(wide, lengths, 0.1, seed=9, proposal=proposal, directions=directions)
    for name in ("indptr", "columns", "steps", "weights"):
        np.testing.assert_array_equal(getattr(narrow_walks, name), getattr(wide_walks, name))
    assert narrow_walks.weights.tobytes() == wide_walks.weights.tobytes()
    np.testing.assert_array_equal(
        walk_endpoints_with_lengths(graph, lengths, seed=9, proposal=proposal, directions=directions),
        walk_endpoints_with_lengths(wide, lengths, seed=9, proposal=proposal, directions=directions))


# ------------------------------------------------------------------ unit weights
def with_stored_unit_weights(graph: Graph) -> Graph:
    """The same graph holding its weights as before: a contiguous read-only array of ones."""
    stored = Graph.__new__(Graph)
    stored._indptr, stored._indices, stored._num_nodes = graph.indptr, graph.indices, graph.num_nodes
    stored._weights = np.ones(len(graph.indices))
    stored._weights.setflags(write=False)
    return stored


def unweighted_graphs() -> dict[str, Graph]:
    return {"grid": grid_graph(9, 7), "icosphere": icosphere_graph(1), "erdos_renyi": erdos_renyi_graph(40, 0.15, 2),
            "edges": Graph.from_edges([[0, 1], [1, 2], [2, 0], [2, 3]], num_nodes=6),
            "loops": Graph.from_edges([[0, 1], [1, 1], [1, 2], [3, 3]], num_nodes=5, self_loops="keep"),
            "matrix": Graph(np.ones((5, 5)) - np.eye(5)),
            "explicit_ones": Graph.from_edges([[0, 1], [1, 2]], weights=[1.0, 1.0]),
            "no_edges": Graph.from_edges([], num_nodes=3)}


@pytest.mark.parametrize("name", sorted(unweighted_graphs()))
def test_unweighted_graphs_hold_no_weights(name: str) -> None:
    graph = unweighted_graphs()[name]
    weights = graph.weights
    assert graph.has_unit_weights and weights.strides == (0,) and weights.dtype == np.float64
    assert weights.shape == graph.indices.shape and np.all(weights == 1.0)
    assert not weights.flags.writeable
    if weights.size:
        with pytest.raises(ValueError):
            weights[0] = 2.0
    assert graph.nbytes() == graph.indptr.nbytes + graph.indices.nbytes


def test_weighted_graphs_store_their_weights() -> None:
    graph = Graph.from_edges([[0, 1], [1, 2]], weights=[1.0, 3.0])
    assert not graph.has_unit_weights and graph.weights.flags.c_contiguous and not graph.weights.flags.writeable
    assert graph.weights.tolist() == [1.0, 1.0, 3.0, 3.0]
    assert graph.nbytes() == graph.indptr.nbytes + graph.indices.nbytes + 32


def test_a_large_grid_holds_no_weights() -> None:
    graph = grid_graph(300, 400)
    entries = len(graph.indices)
    assert graph.has_unit_weights and graph.nbytes() == 4 * (graph.num_nodes + 1) + 4 * entries
    tables = DEFAULT_PROPOSAL.tables(graph)
    assert tables.ratios.size == 0 and tables.cumulative.size == 0
    # Nothing the walks need is kept per edge.
    kept = [value for value in graph.__dict__["_derived"].values() if isinstance(value, np.ndarray)]
    assert all(array.size < entries for array in kept)


@pytest.mark.parametrize("name", sorted(unweighted_graphs()))
def test_unit_weights_give_what_stored_ones_gave(name: str) -> None:
    graph = unweighted_graphs()[name]
    stored = with_stored_unit_weights(graph)
    assert stored.has_unit_weights == (graph.weights.size == 0)  # an empty array has stride 0
    assert graph.fingerprint() == stored.fingerprint() and graph == stored
    new, old = graph.adjacency, stored.adjacency
    assert np.asarray(new.data).tobytes() == old.data.tobytes() and (new != old).nnz == 0
    assert graph.num_edges == stored.num_edges
    for member in ("weighted_degrees", "normalized_weights"):
        value = getattr(graph, member)
        assert (value() if callable(value) else value).tobytes() == \
            (getattr(stored, member)() if callable(value) else getattr(stored, member)).tobytes()
    assert graph.compute_normalized_weights(times_degree=True).tobytes() == \
        stored.compute_normalized_weights(times_degree=True).tobytes()
    assert (graph.normalized_laplacian() != stored.normalized_laplacian()).nnz == 0
    np.testing.assert_array_equal(graph.connected_components()[1], stored.connected_components()[1])
    for proposal in (DEFAULT_PROPOSAL, UniformProposal()):
        tables = proposal.tables(graph)
        assert tables.choice_degrees.tobytes() == proposal.tables(stored).choice_degrees.tobytes()
        assert (proposal.transition_matrix(graph) != proposal.transition_matrix(stored)).nnz == 0
    rows = np.repeat(np.arange(graph.num_nodes), graph.degrees)
    scales = DEFAULT_PROPOSAL.tables(graph).node_scales
    on_the_fly = (scales[rows] * scales[graph.indices]) * graph.degrees[rows].astype(float)
    assert on_the_fly.tobytes() == uniform_ratios(stored).tobytes()
    lengths = np.random.default_rng(5).integers(0, 15, size=(graph.num_nodes, 4))
    for proposal in ("weighted", "uniform"):
        for directions in ("independent", "repelling"):
            new_walks, old_walks = (walk_with_lengths(g, lengths, 0.1, seed=3, proposal=proposal, directions=directions)
                                    for g in (graph, stored))
            for field in ("indptr", "columns", "steps", "weights"):
                assert getattr(new_walks, field).tobytes() == getattr(old_walks, field).tobytes()
            np.testing.assert_array_equal(
                walk_endpoints_with_lengths(graph, lengths, seed=3, proposal=proposal, directions=directions),
                walk_endpoints_with_lengths(stored, lengths, seed=3, proposal=proposal, directions=directions))


def test_fingerprints_of_unweighted_graphs_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fingerprints of saved kernels: the values from before unit weights were dropped.
    assert grid_graph(3, 5).fingerprint() == "ec986d92eb0f6d102207c2190fdf345cd588ded69e6e533d5c9eb1269c942500"
    assert icosphere_graph(1).fingerprint() == "8f2320ba8c10571c9f425fa66dd99b38477c692a94ff04491d7080d520da6b09"
    assert Graph.from_edges([[0, 1], [1, 2]], weights=[1.0, 3.0]).fingerprint() == \
        "423fb42c817fae2a34bccaa772da40f1cf5183bc0bb5c1a135bab86f0883453a"
    # Hashed in chunks that do not divide the number of entries: the same digest.
    monkeypatch.setattr(graphs, "_HASH_CHUNK", 7)
    graph = grid_graph(4, 6)
    digest = hashlib.sha256()
    for array in (np.int64(graph.num_nodes), graph.indptr.astype(np.int64), graph.indices.astype(np.int64),
                  np.ones(len(graph.indices))):
        digest.update(array.tobytes())
    assert graph.fingerprint() == digest.hexdigest()


def test_pickles_keep_unit_weights_unstored() -> None:
    graph = grid_graph(60, 50)
    data = pickle.dumps(graph)
    assert len(data) < graph.indptr.nbytes + graph.indices.nbytes + 4096
    clone = pickle.loads(data)
    assert clone.has_unit_weights and clone == graph and not clone.weights.flags.writeable
    assert not clone.indptr.flags.writeable and not clone.indices.flags.writeable
    # A graph pickled with stored unit weights (before they were dropped) loads without them.
    assert pickle.loads(pickle.dumps(with_stored_unit_weights(graph))).has_unit_weights
    weighted = Graph.from_edges([[0, 1], [1, 2]], weights=[1.0, 3.0])
    clone = pickle.loads(pickle.dumps(weighted))
    assert clone == weighted and clone.weights.tolist() == weighted.weights.tolist()
