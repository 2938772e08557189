"""Tests for gp_couple.graphs: builders, validation and normalised operators."""

from __future__ import annotations

import warnings

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
import trimesh

from gp_couple.graphs import Graph, erdos_renyi_graph, grid_graph, icosphere_graph


def two_components_and_isolated() -> Graph:
    """Path 0-1-2 (weighted), triangle 3-4-5, isolated node 6."""
    edges = np.array([[0, 1], [1, 2], [3, 4], [4, 5], [3, 5]])
    return Graph.from_edges(edges, weights=[1.0, 2.0, 1.0, 0.5, 3.0], num_nodes=7)


class TestBuilders:
    def test_all_builders_agree(self) -> None:
        nx_graph = nx.Graph()
        nx_graph.add_nodes_from(range(7))
        nx_graph.add_weighted_edges_from([(0, 1, 1.0), (1, 2, 2.0), (3, 4, 1.0), (4, 5, 0.5), (3, 5, 3.0)])
        reference = two_components_and_isolated()
        from_nx = Graph.from_networkx(nx_graph)
        from_scipy = Graph.from_scipy(nx.to_scipy_sparse_array(nx_graph, nodelist=range(7)))
        from_dense = Graph(nx.to_numpy_array(nx_graph, nodelist=range(7)))
        from_torch = Graph(torch.tensor(nx.to_numpy_array(nx_graph, nodelist=range(7))))
        for graph in (from_nx, from_scipy, from_dense, from_torch):
            assert graph == reference
            np.testing.assert_array_equal(graph.indptr, reference.indptr)
            np.testing.assert_array_equal(graph.weights, reference.weights)

    def test_duplicate_edges_and_multigraph_weights_sum(self) -> None:
        graph = Graph.from_edges([[0, 1], [1, 0], [1, 2]], weights=[1.0, 2.0, 1.0])
        assert graph.adjacency[0, 1] == 3.0 and graph.num_edges == 2
        multi = nx.MultiGraph([(0, 1), (0, 1), (1, 2)])
        assert Graph.from_networkx(multi).adjacency[0, 1] == 2.0

    def test_unweighted_networkx_and_nodelist(self) -> None:
        graph = Graph.from_networkx(nx.Graph([("a", "b", {"weight": 5.0}), ("b", "c")]),
                                    weight=None, nodelist=["c", "b", "a"])
        np.testing.assert_array_equal(graph.adjacency.toarray(), [[0, 1, 0], [1, 0, 1], [0, 1, 0]])

    def test_directed_graph_needs_explicit_symmetrisation(self) -> None:
        directed = nx.DiGraph([(0, 1), (1, 2)])
        with pytest.raises(ValueError, match="directed"):
            Graph.from_networkx(directed)
        graph = Graph.from_networkx(directed, symmetrize=True)
        assert graph.num_edges == 2 and graph.adjacency[1, 0] == 1.0

    def test_scipy_symmetrize_uses_maximum(self) -> None:
        matrix = sp.csr_matrix(np.array([[0, 2.0], [0.5, 0]]))
        with pytest.raises(ValueError, match="not symmetric"):
            Graph.from_scipy(matrix)
        assert Graph.from_scipy(matrix, symmetrize=True).adjacency[1, 0] == 2.0

    def test_trimesh_faces_and_vertices(self) -> None:
        mesh = trimesh.creation.icosphere(subdivisions=1)
        faces = Graph.from_trimesh(mesh)
        assert faces.num_nodes == 80 and np.all(faces.degrees == 3) and np.all(faces.weights == 1.0)
        vertices = Graph.from_trimesh(mesh, nodes="vertices")
        assert vertices.num_nodes == 42 and vertices.num_edges == 120
        with pytest.raises(ValueError, match="faces"):
            Graph.from_trimesh(mesh, nodes="edges")
        with pytest.raises(TypeError):
            Graph.from_trimesh("not a mesh")

    def test_trimesh_duplicate_faces_are_merged_with_a_warning(self) -> None:
        mesh = trimesh.creation.box()
        doubled = trimesh.Trimesh(mesh.vertices, np.vstack([mesh.faces, mesh.faces[:, ::-1]]), process=False)
        with pytest.warns(UserWarning, match="12 faces repeat the vertices of an earlier face"):
            graph = Graph.from_trimesh(doubled)
        assert graph == Graph.from_trimesh(mesh)
        assert np.all(graph.weights == 1.0)

    def test_procedural_graphs(self) -> None:
        grid = grid_graph(3, 4)
        assert grid.num_nodes == 12 and grid.num_edges == 17
        assert sorted(np.unique(grid.degrees)) == [2, 3, 4]
        assert icosphere_graph(2).num_nodes == 320
        with pytest.raises(ValueError):
            grid_graph(0, 3)


class TestValidation:
    @pytest.mark.parametrize("matrix, message", [
        (np.ones((2, 3)), "square"),
        (np.array([[0, 1.0], [2.0, 0]]), "not symmetric"),
        (np.array([[0, -1.0], [-1.0, 0]]), "negative"),
        (np.array([[0, np.nan], [np.nan, 0]]), "NaN"),
        (np.array([[0, np.inf], [np.inf, 0]]), "infinite"),
        (np.zeros((0, 0)), "empty"),
        (np.ones(3), "2-D"),
    ])
    def test_bad_matrices(self, matrix: np.ndarray, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            Graph(matrix)

    def test_bad_types(self) -> None:
        with pytest.raises(TypeError):
            Graph("adjacency")
        with pytest.raises(TypeError):
            Graph(np.array([["a", "b"], ["b", "a"]]))
        with pytest.raises(TypeError):
            Graph.from_networkx(np.eye(2))

    def test_empty_networkx_graph(self) -> None:
        with pytest.raises(ValueError, match="no nodes"):
            Graph.from_networkx(nx.Graph())

    def test_self_loop_policies(self) -> None:
        matrix = np.array([[1.0, 1.0], [1.0, 0.0]])
        with pytest.raises(ValueError, match="self-loop"):
            Graph(matrix)
        assert Graph(matrix, self_loops="drop").adjacency[0, 0] == 0
        kept = Graph(matrix, self_loops="keep")
        assert kept.adjacency[0, 0] == 1.0 and kept.num_edges == 2
        with pytest.raises(ValueError, match="self_loops"):
            Graph(matrix, self_loops="ignore")
        assert Graph.from_edges([[0, 0], [0, 1]], self_loops="keep").adjacency[0, 0] == 1.0

    def test_edge_list_errors(self) -> None:
        with pytest.raises(ValueError, match=r"\(E, 2\)"):
            Graph.from_edges([[0, 1, 2]])
        with pytest.raises(ValueError, match="negative"):
            Graph.from_edges([[0, -1]])
        with pytest.raises(ValueError, match="num_nodes"):
            Graph.from_edges([[0, 5]], num_nodes=3)
        with pytest.raises(ValueError, match="weights"):
            Graph.from_edges([[0, 1]], weights=[1.0, 2.0])
        with pytest.raises(TypeError, match="integer"):
            Graph.from_edges([[0.5, 1.0]])
        with pytest.raises(ValueError, match="negative"):
            Graph.from_edges([[0, 1]], weights=[-1.0])

    def test_zero_weights_are_not_edges(self) -> None:
        graph = Graph(np.array([[0, 0.0, 1], [0, 0, 0], [1, 0, 0]]))
        assert graph.num_edges == 1 and graph.degrees.tolist() == [1, 0, 1]


class TestNormalisedOperators:
    def test_normalised_adjacency_and_laplacian(self) -> None:
        graph = two_components_and_isolated()
        w = graph.adjacency.toarray()
        d = w.sum(axis=1)
        inv = np.where(d > 0, 1 / np.sqrt(np.where(d > 0, d, 1)), 0.0)
        expected = inv[:, None] * w * inv[None, :]
        np.testing.assert_allclose(graph.normalized_adjacency().toarray(), expected)
        np.testing.assert_allclose(graph.normalized_laplacian().toarray(), np.eye(7) - expected)
        assert graph.normalized_laplacian()[6, 6] == 1.0
        eigenvalues = np.linalg.eigvalsh(expected)
        assert eigenvalues.min() >= -1 - 1e-12 and eigenvalues.max() <= 1 + 1e-12

    def test_degrees(self) -> None:
        graph = two_components_and_isolated()
        assert graph.degrees.tolist() == [1, 2, 1, 2, 2, 2, 0]
        np.testing.assert_allclose(graph.weighted_degrees, [1, 3, 2, 4, 1.5, 3.5, 0])
        assert graph.isolated_nodes.tolist() == [6]


class TestStructure:
    def test_components_and_subgraphs(self) -> None:
        graph = two_components_and_isolated()
        count, labels = graph.connected_components()
        assert count == 3 and len(set(labels[:3])) == 1
        largest, nodes = graph.largest_component()
        assert largest.num_nodes == 3 and nodes.tolist() in ([0, 1, 2], [3, 4, 5])
        sub = graph.subgraph(np.array([5, 3]))
        assert sub.adjacency[0, 1] == 3.0
        with pytest.raises(ValueError, match="duplicates"):
            graph.subgraph(np.array([1, 1]))
        with pytest.raises(ValueError):
            graph.subgraph(np.array([9]))

    def test_immutable_and_fingerprint(self) -> None:
        graph = two_components_and_isolated()
        with pytest.raises(ValueError):
            graph.weights[0] = 5.0
        other = Graph.from_edges([[0, 1]])
        assert graph != other and graph.fingerprint() != other.fingerprint()
        assert hash(graph) == hash(two_components_and_isolated())
        assert "Graph(num_nodes=7" in repr(graph)

    def test_networkx_round_trip(self) -> None:
        graph = two_components_and_isolated()
        assert Graph.from_networkx(graph.to_networkx()) == graph


# ------------------------------------------------------------------ extreme weights, Erdős–Rényi
def test_weights_whose_degree_sums_overflow_are_rejected() -> None:
    from gp_couple.graphs import MAX_WEIGHTED_DEGREE

    with pytest.raises(ValueError, match=r"node 0 has weighted degree .* above the limit 1e\+300.*rescale"):
        Graph.from_edges([[0, 1], [1, 2]], weights=[1e308, 1e308])
    with pytest.raises(ValueError, match="weighted degree"):
        Graph.from_edges([[0, 1], [1, 2]], weights=[0.6 * MAX_WEIGHTED_DEGREE, 0.6 * MAX_WEIGHTED_DEGREE])


def test_scaled_weights_give_the_same_normalised_adjacency() -> None:
    # W~ depends only on weight ratios; huge (below the bound) and tiny weights stay exact.
    edges, weights = [[0, 1], [1, 2], [2, 0], [2, 3]], np.array([1.0, 2.0, 3.0, 0.5])
    reference = Graph.from_edges(edges, weights=weights).normalized_weights()
    for scale in (1e290, 1e-300):
        scaled = Graph.from_edges(edges, weights=weights * scale).normalized_weights()
        np.testing.assert_allclose(scaled, reference, rtol=1e-12)


@pytest.mark.parametrize("args, error, message", [
    ((10, 2.0), ValueError, r"edge_probability must lie in \[0, 1\], got 2.0"),
    ((10, -0.1), ValueError, "edge_probability"),
    ((10, float("nan")), ValueError, "edge_probability"),
    ((0, 0.5), ValueError, "num_nodes"),
    ((10.0, 0.5), TypeError, "num_nodes"),
    ((10, "0.5"), TypeError, "edge_probability"),
    ((10, 0.5, -1), ValueError, "seed"),
])
def test_erdos_renyi_validates_its_arguments(args, error, message) -> None:
    from gp_couple.graphs import erdos_renyi_graph

    with pytest.raises(error, match=message):
        erdos_renyi_graph(*args)


def test_erdos_renyi_graph_and_its_spec() -> None:
    from gp_couple.couplings.sigma_matching import default_fitting_graph
    from gp_couple.datasets.graph_specs import resolve_graph
    from gp_couple.graphs import erdos_renyi_graph

    graph = erdos_renyi_graph(30, 0.2, 3)
    assert graph == resolve_graph("erdos-renyi:30:0.2:3") == default_fitting_graph(30, 0.2, 3)
    assert erdos_renyi_graph(5, 1.0).num_edges == 10
    with pytest.raises(ValueError, match=r"malformed graph spec 'erdos-renyi:10:2.0' \(edge_probability"):
        resolve_graph("erdos-renyi:10:2.0")


# ------------------------------------------------------------------ hardening: meshes
def box_with_extra_faces(extra: list[list[int]]) -> trimesh.Trimesh:
    box = trimesh.creation.box()
    return trimesh.Trimesh(box.vertices, np.vstack([box.faces, np.array(extra, dtype=np.int64).reshape(-1, 3)]),
                           process=False)


class TestFaceGraph:
    def test_one_duplicated_face_keeps_the_box_connected(self) -> None:
        # Its three edges are shared by three faces: trimesh's face_adjacency drops them.
        box = trimesh.creation.box()
        with pytest.warns(UserWarning, match=r"1 faces repeat .* face 12 those of face 3"):
            graph = Graph.from_trimesh(box_with_extra_faces([box.faces[3].tolist()]))
        assert graph.num_nodes == 12 and graph.connected_components()[0] == 1
        assert np.all(graph.degrees == 3)

    def test_non_manifold_edge_joins_its_faces_pairwise(self) -> None:
        # A fin on the box's edge (0, 1): that edge is shared by three faces.
        box = trimesh.creation.box()
        mesh = trimesh.Trimesh(np.vstack([box.vertices, [[5.0, 5.0, 5.0]]]),
                               np.vstack([box.faces, [[0, 1, 8]]]), process=False)
        graph = Graph.from_trimesh(mesh)
        owners = [face for face in range(12) if {0, 1} <= set(box.faces[face].tolist())]
        assert len(owners) == 2 and graph.connected_components()[0] == 1
        assert sorted(graph.adjacency[12].indices.tolist()) == owners
        assert graph.adjacency[owners[0], owners[1]] == 1.0

    def test_mesh_of_five_faces_around_one_edge_is_complete(self) -> None:
        vertices = [[0, 0, 0], [0, 0, 1]] + [[np.cos(a), np.sin(a), 0] for a in np.linspace(0, 6, 5)]
        mesh = trimesh.Trimesh(vertices, [[0, 1, k] for k in range(2, 7)], process=False)
        graph = Graph.from_trimesh(mesh)
        assert graph.num_nodes == 5 and graph.num_edges == 10

    @pytest.mark.parametrize("face, message", [
        ([0, 0, 1], r"face 12 has vertices \[0, 0, 1\], repeating a vertex"),
        ([2, 5, 2], "face 12 .* repeating a vertex"),
        ([0, 1, 8], r"face 12 has vertices \[0, 1, 8\], but the mesh has 8 vertices"),
    ])
    def test_bad_faces_are_refused(self, face: list[int], message: str) -> None:
        for nodes in ("faces", "vertices"):
            with pytest.raises(ValueError, match=message):
                Graph.from_trimesh(box_with_extra_faces([face]), nodes=nodes)

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_non_finite_vertices_are_refused(self, bad: float) -> None:
        box = trimesh.creation.box()
        vertices = np.array(box.vertices)
        vertices[6, 2] = bad
        with pytest.raises(ValueError, match="vertex 6 has a NaN or infinite coordinate"):
            Graph.from_trimesh(trimesh.Trimesh(vertices, box.faces, process=False))

    def test_zero_area_faces_with_distinct_vertices_are_nodes(self) -> None:
        mesh = trimesh.Trimesh([[0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1, 0]], [[0, 1, 2], [0, 1, 3]], process=False)
        assert Graph.from_trimesh(mesh).num_edges == 1

    def test_empty_mesh(self) -> None:
        with pytest.raises(ValueError, match="no faces"):
            Graph.from_trimesh(trimesh.Trimesh(np.zeros((3, 3)), np.zeros((0, 3), dtype=np.int64), process=False))


# ------------------------------------------------------------------ hardening: sizes and types
@pytest.fixture
def memory_16_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 16 GiB available, so that refusals do not depend on this one."""
    monkeypatch.setattr("gp_couple._checks.available_memory", lambda: 16 * 2 ** 30)


@pytest.mark.parametrize("build, error, message", [
    (lambda: icosphere_graph(-1), ValueError, "subdivisions must be >= 0, got -1"),
    (lambda: icosphere_graph(2.5), TypeError, "subdivisions must be an int, got float"),
    (lambda: icosphere_graph("2"), TypeError, "subdivisions must be an int"),
    (lambda: grid_graph(3, 2.5), TypeError, "cols must be an int, got float"),
    (lambda: grid_graph(-3, 2), ValueError, "rows must be >= 1, got -3"),
    (lambda: grid_graph(True, 2), TypeError, "rows must be an int"),
    (lambda: Graph.from_edges([[0, 1]], num_nodes=2.7), TypeError, "num_nodes must be an int, got float"),
    (lambda: Graph.from_edges([[0, 1]], num_nodes=-5), ValueError, "num_nodes must be >= 1, got -5"),
    (lambda: Graph.from_edges([[0, 1]], num_nodes=0), ValueError, "num_nodes must be >= 1, got 0"),
    (lambda: Graph.from_edges([[0, 1e20]]), TypeError, "integer node indices"),
])
def test_sizes_are_checked_with_their_names(build, error, message) -> None:
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize("build, message", [
    (lambda: Graph.from_edges([[0, 10 ** 12]]), r"a graph with 1000000000001 nodes and 1 edges needs about 29.1 TiB "
                                                r"of memory, more than the 16 GiB available; the edges use only 2 "
                                                r"distinct node ids.*relabel"),
    (lambda: Graph.from_edges([[0, 1]], num_nodes=10 ** 12), "1000000000000 nodes .* needs about"),
    (lambda: icosphere_graph(14), r"icosphere_graph\(14\) \(5368709120 faces\) needs about 5 TiB"),
    (lambda: grid_graph(100_000, 100_000), r"grid_graph\(100000, 100000\) needs about"),
    (lambda: erdos_renyi_graph(10 ** 6, 0.5), "about 2.5e\\+11 edges.* needs about"),
    (lambda: Graph(sp.coo_matrix(([1.0, 1.0], ([0, 1], [1, 0])), shape=(10 ** 12, 10 ** 12))), "needs about"),
])
def test_graphs_that_cannot_fit_are_refused_before_allocating(memory_16_gib: None, build, message) -> None:
    from gp_couple._checks import TooLargeError

    with pytest.raises(TooLargeError, match=message):
        build()


def test_sparse_node_ids_warn_and_suggest_relabelling() -> None:
    with pytest.warns(UserWarning, match=r"200001 nodes.*only 3 distinct node ids.*relabel"):
        graph = Graph.from_edges([[0, 200_000], [7, 0]])
    assert graph.num_nodes == 200_001
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Graph.from_edges([[0, 200_000]], num_nodes=200_001)  # asked for explicitly
        Graph.from_edges([[0, 5_000]])  # small


@pytest.mark.parametrize("adjacency", [
    np.array([[0, 1j], [1j, 0]]),
    np.array([[0, 1 + 0j], [1 + 0j, 0]]),  # even a zero imaginary part: never cast silently
    sp.csr_matrix(np.array([[0, 2j], [2j, 0]])),
    sp.coo_array(np.array([[0, 1 + 1j], [1 + 1j, 0]])),
    torch.tensor([[0, 1j], [1j, 0]]),
    np.array([["0", "1"], ["1", "0"]]),
    np.array([[0, None], [None, 0]]),
])
def test_complex_and_text_adjacency_is_refused(adjacency) -> None:
    with pytest.raises(TypeError, match="adjacency must hold real numbers"):
        Graph(adjacency)
    with pytest.raises(TypeError, match="adjacency must hold real numbers"):
        Graph.from_scipy(adjacency, symmetrize=True)


@pytest.mark.parametrize("weight", ["2", 1 + 2j, None, b"1", [1.0]])
def test_networkx_weights_must_be_real(weight) -> None:
    graph = nx.Graph([(0, 1, {"weight": 1.0}), (1, "b", {"weight": weight})])
    with pytest.raises(TypeError, match=r"edge \(1, 'b'\) has weight=.*must be real numbers"):
        Graph.from_networkx(graph)
    assert Graph.from_networkx(graph, weight=None).num_edges == 2
    numpy_weights = nx.Graph([(0, 1, {"w": np.float32(2.0)}), (1, 2, {"w": np.int64(3)}), (2, 3, {"w": True})])
    assert Graph.from_networkx(numpy_weights, weight="w").adjacency[1, 2] == 3.0


@pytest.mark.parametrize("weights", [["2", "1"], [1 + 1j, 1], np.array([1, 2], dtype=object)])
def test_edge_weights_must_be_real(weights) -> None:
    with pytest.raises(TypeError, match="weights must hold real numbers"):
        Graph.from_edges([[0, 1], [1, 2]], weights=weights)
