r"""Validated, weighted, undirected graphs in CSR form.

:class:`Graph` is the input of everything on the graph side of gp_couple: the walk
sampler reads its CSR arrays, the kernels read its normalised adjacency

.. math::

    \widetilde{\mathbf W} = \mathbf D^{-1/2} \mathbf W \mathbf D^{-1/2},
    \qquad \widetilde{\mathbf L} = \mathbf I - \widetilde{\mathbf W},

(paper, eq. (48), the normalised Laplacian, Appendix C.1 [eq:graph_lap]) where :math:`\mathbf D`
holds the *weighted* degrees.

Conventions
-----------
* **Isolated nodes** (no neighbours) are legal. Their row of :math:`\widetilde{\mathbf W}`
  is zero, so :math:`\widetilde{\mathbf L}_{ii} = 1` and every graph kernel
  :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` gives them :math:`K_{ii} = \alpha_0`
  and zero covariance with every other node. A random walker that starts at an
  isolated node cannot move: its walk ends there. This keeps graph random features
  unbiased, because every walk through such a node has zero weight in the series.
* **Disconnected graphs** are legal; kernels are block diagonal over components.
* **Self-loops** are rejected by default (``self_loops="error"``). ``"drop"`` removes
  them; ``"keep"`` keeps them as ordinary edges (a walker may then stay in place, and
  the estimators remain unbiased for the series in the resulting
  :math:`\widetilde{\mathbf W}`).
* **Duplicate edges** (edge lists, multigraphs) have their weights summed, as
  ``networkx.to_numpy_array`` does.
* **Zero weights** mean "no edge" and are removed.
* **Weight range.** Weights must be finite and non-negative, and every weighted degree
  (row sum of :math:`\mathbf W`) at most :data:`MAX_WEIGHTED_DEGREE` (``1e300``), so that
  degree sums and the normalisation stay finite in float64. Graph kernels depend only on
  the ratios of the weights (:math:`\widetilde{\mathbf W}` is invariant to scaling
  :math:`\mathbf W`), so rescale larger weights, e.g. by their maximum.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import scipy.sparse as sp
import torch

from ._checks import check_int, is_int

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx
    import trimesh

#: Largest weighted degree (row sum of W) a graph may have: far below float64's 1.8e308,
#: leaving room for the symmetrisation and degree products of the normalisation.
MAX_WEIGHTED_DEGREE = 1e300

SelfLoopPolicy = Literal["error", "drop", "keep"]
_SELF_LOOP_POLICIES = ("error", "drop", "keep")


def _check_policy(self_loops: str) -> None:
    if self_loops not in _SELF_LOOP_POLICIES:
        raise ValueError(f"self_loops must be one of {_SELF_LOOP_POLICIES}, got {self_loops!r}")


def _freeze(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


class Graph:
    r"""A weighted undirected graph on nodes ``0, ..., num_nodes - 1``.

    Build one with :meth:`from_scipy`, :meth:`from_networkx`, :meth:`from_edges` or
    :meth:`from_trimesh`; the constructor takes a symmetric scipy sparse matrix or dense
    array directly. Instances are immutable: their arrays are read-only.

    :param adjacency: Square symmetric weighted adjacency matrix (scipy sparse or dense
        array-like) with non-negative finite weights.
    :param self_loops: What to do with diagonal entries: ``"error"`` (default),
        ``"drop"`` or ``"keep"``.
    :raises TypeError: If ``adjacency`` is not a matrix.
    :raises ValueError: If the matrix is empty, not square, not symmetric, or has
        negative, NaN or infinite weights, or self-loops under ``self_loops="error"``.
    """

    def __init__(self, adjacency: Any, *, self_loops: SelfLoopPolicy = "error") -> None:
        _check_policy(self_loops)
        matrix = _as_csr(adjacency)
        _validate_square_finite_nonnegative(matrix)
        matrix = _apply_self_loop_policy(matrix, self_loops)
        _validate_symmetric(matrix)
        # Remove round-off asymmetry so that W~ is exactly symmetric.
        matrix = ((matrix + matrix.T) * 0.5).tocsr()
        matrix.sort_indices()
        n = matrix.shape[0]
        index_dtype = np.int32 if n < np.iinfo(np.int32).max else np.int64
        self._indptr = _freeze(matrix.indptr.astype(np.int64, copy=True))
        self._indices = _freeze(matrix.indices.astype(index_dtype, copy=True))
        self._weights = _freeze(matrix.data.astype(np.float64, copy=True))
        self._num_nodes = int(n)
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_scipy(cls, matrix: sp.spmatrix | sp.sparray, *, symmetrize: bool = False,
                   self_loops: SelfLoopPolicy = "error") -> Graph:
        """Build a graph from a scipy sparse (or dense numpy) adjacency matrix.

        :param matrix: Square weighted adjacency matrix.
        :param symmetrize: If ``True``, an asymmetric matrix is symmetrised with the
            element-wise maximum :math:`\\max(W, W^\\top)`; otherwise asymmetry is an error.
        :param self_loops: Self-loop policy (see the module docstring).
        """
        if not symmetrize:
            return cls(matrix, self_loops=self_loops)
        csr = _as_csr(matrix)
        _validate_square_finite_nonnegative(csr)
        return cls(csr.maximum(csr.T), self_loops=self_loops)

    @classmethod
    def from_edges(cls, edges: Any, weights: Any = None, num_nodes: int | None = None, *,
                   self_loops: SelfLoopPolicy = "error") -> Graph:
        """Build a graph from an edge list.

        Each undirected edge may appear once (either orientation) or several times;
        repeated edges have their weights summed. An edge listed as both ``(u, v)`` and
        ``(v, u)`` counts twice.

        :param edges: Integer array of shape ``(E, 2)``.
        :param weights: Optional positive weights of shape ``(E,)`` (default all ones).
        :param num_nodes: Number of nodes (default ``edges.max() + 1``); use it to
            include isolated nodes with large indices.
        :param self_loops: Self-loop policy.
        """
        _check_policy(self_loops)
        edge_array = np.asarray(edges)
        if edge_array.size == 0:
            edge_array = edge_array.reshape(0, 2)
        if edge_array.ndim != 2 or edge_array.shape[1] != 2:
            raise ValueError(f"edges must have shape (E, 2), got {edge_array.shape}")
        if not np.issubdtype(edge_array.dtype, np.integer):
            if not np.issubdtype(edge_array.dtype, np.floating) or not np.all(
                np.isfinite(edge_array)) or np.any(edge_array != np.round(edge_array)):
                raise TypeError("edges must hold integer node indices")
            edge_array = edge_array.astype(np.int64)
        if edge_array.size and edge_array.min() < 0:
            raise ValueError("edges contain a negative node index")
        inferred = int(edge_array.max()) + 1 if edge_array.size else 0
        if num_nodes is None:
            num_nodes = inferred
        elif int(num_nodes) < inferred:
            raise ValueError(
                f"edges reference node {inferred - 1} but num_nodes={num_nodes}")
        if weights is None:
            weight_array = np.ones(len(edge_array), dtype=np.float64)
        else:
            weight_array = np.asarray(weights, dtype=np.float64)
            if weight_array.shape != (len(edge_array),):
                raise ValueError(
                    f"weights must have shape ({len(edge_array)},), got {weight_array.shape}")
        # Each undirected edge is stored in both orientations; a self-loop only once.
        mirrored = edge_array[:, 0] != edge_array[:, 1]
        rows = np.concatenate([edge_array[:, 0], edge_array[mirrored, 1]])
        cols = np.concatenate([edge_array[:, 1], edge_array[mirrored, 0]])
        data = np.concatenate([weight_array, weight_array[mirrored]])
        matrix = sp.coo_matrix((data, (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
        matrix.sum_duplicates()
        return cls(matrix, self_loops=self_loops)

    @classmethod
    def from_networkx(cls, graph: nx.Graph, *, weight: str | None = "weight",
                      nodelist: list | None = None, symmetrize: bool = False,
                      self_loops: SelfLoopPolicy = "error") -> Graph:
        """Build a graph from a networkx graph.

        Node ``i`` of the result is ``nodelist[i]`` (default: ``list(graph.nodes)``).
        Parallel edges of multigraphs have their weights summed.

        :param graph: A networkx graph. Directed graphs are rejected unless
            ``symmetrize=True`` (element-wise maximum of the two directions).
        :param weight: Edge attribute holding the weight (missing attributes count as
            1); ``None`` makes the graph unweighted.
        :param nodelist: Node order.
        :param symmetrize: Accept directed graphs by symmetrising them.
        :param self_loops: Self-loop policy.
        """
        import networkx as nx

        if not isinstance(graph, nx.Graph):
            raise TypeError(f"expected a networkx graph, got {type(graph).__name__}")
        if graph.is_directed() and not symmetrize:
            raise ValueError(
                "graph is directed; graph kernels need an undirected graph. Pass "
                "symmetrize=True to use max(W, W^T), or convert it with graph.to_undirected()")
        if graph.number_of_nodes() == 0:
            raise ValueError("graph is empty: it has no nodes")
        matrix = nx.to_scipy_sparse_array(graph, nodelist=nodelist, weight=weight, format="csr")
        return cls.from_scipy(matrix, symmetrize=graph.is_directed(), self_loops=self_loops)

    @classmethod
    def from_trimesh(cls, mesh: trimesh.Trimesh, *, nodes: Literal["faces", "vertices"] = "faces") -> Graph:
        """Build the graph of a triangle mesh.

        With ``nodes="faces"`` (the paper's setting, Appendix F.2 "Scalable GPs on graphs",
        paragraph "Training GRF-GPs: technical details" [app:grf_gp_details]) node ``i`` is
        face ``i`` and two faces are joined when they share an edge (``mesh.face_adjacency``). With
        ``nodes="vertices"`` node ``i`` is vertex ``i``
        and the graph is the mesh's edge graph. Edges are unweighted.

        :param mesh: A :class:`trimesh.Trimesh`.
        :param nodes: ``"faces"`` or ``"vertices"``.
        """
        import trimesh

        if not isinstance(mesh, trimesh.Trimesh):
            raise TypeError(f"expected a trimesh.Trimesh, got {type(mesh).__name__}")
        if nodes == "faces":
            # trimesh lists a face pair twice when duplicated faces of opposite
            # orientation share an edge; the graph has one unweighted edge per pair.
            pairs = np.unique(np.sort(np.asarray(mesh.face_adjacency), axis=1), axis=0)
            return cls.from_edges(pairs.reshape(-1, 2), num_nodes=len(mesh.faces))
        if nodes == "vertices":
            pairs = np.unique(np.sort(np.asarray(mesh.edges_unique), axis=1), axis=0)
            return cls.from_edges(pairs.reshape(-1, 2), num_nodes=len(mesh.vertices))
        raise ValueError(f"nodes must be 'faces' or 'vertices', got {nodes!r}")

    # ---------------------------------------------------------------- structure
    @property
    def num_nodes(self) -> int:
        """Number of nodes :math:`N`."""
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        """Number of undirected edges (a self-loop counts once)."""
        loops = int(np.count_nonzero(self.adjacency.diagonal()))
        return (len(self._indices) - loops) // 2 + loops

    @property
    def indptr(self) -> np.ndarray:
        """CSR row pointer (int64, length ``num_nodes + 1``), read-only."""
        return self._indptr

    @property
    def indices(self) -> np.ndarray:
        """CSR neighbour indices (int32 or int64), sorted within each row, read-only."""
        return self._indices

    @property
    def weights(self) -> np.ndarray:
        """CSR edge weights (float64), read-only."""
        return self._weights

    @property
    def degrees(self) -> np.ndarray:
        """Number of neighbours of each node (int64): the walkers' choice is uniform over them."""
        return self._cached("degrees", lambda: _freeze(np.diff(self._indptr)))

    @property
    def weighted_degrees(self) -> np.ndarray:
        r"""Weighted degrees :math:`D_{ii} = \sum_j W_{ij}` (float64)."""
        return self._cached("weighted_degrees", lambda: _freeze(
            np.asarray(self.adjacency.sum(axis=1)).ravel().astype(np.float64)))

    @property
    def adjacency(self) -> sp.csr_matrix:
        """Weighted adjacency matrix :math:`W` (a fresh scipy CSR matrix view)."""
        return sp.csr_matrix((self._weights, self._indices, self._indptr),
                             shape=(self._num_nodes, self._num_nodes))

    @property
    def isolated_nodes(self) -> np.ndarray:
        """Indices of nodes with no neighbours."""
        return np.flatnonzero(self.degrees == 0)

    def normalized_weights(self) -> np.ndarray:
        r"""Entries of :math:`\widetilde{\mathbf W} = D^{-1/2} W D^{-1/2}` in CSR order."""

        def build() -> np.ndarray:
            d = self.weighted_degrees
            inv_sqrt = np.zeros_like(d)
            positive = d > 0
            inv_sqrt[positive] = 1.0 / np.sqrt(d[positive])
            rows = np.repeat(np.arange(self._num_nodes), self.degrees)
            return _freeze(self._weights * inv_sqrt[rows] * inv_sqrt[self._indices])

        return self._cached("normalized_weights", build)

    def normalized_adjacency(self) -> sp.csr_matrix:
        r"""Normalised adjacency :math:`\widetilde{\mathbf W} = D^{-1/2} W D^{-1/2}` (scipy CSR)."""
        return sp.csr_matrix((self.normalized_weights(), self._indices, self._indptr),
                             shape=(self._num_nodes, self._num_nodes))

    def normalized_laplacian(self) -> sp.csr_matrix:
        r"""Normalised Laplacian :math:`\widetilde{\mathbf L} = \mathbf I - \widetilde{\mathbf W}`.

        Isolated nodes have :math:`\widetilde{\mathbf L}_{ii} = 1` (see the module docstring).
        """
        identity = sp.identity(self._num_nodes, format="csr", dtype=np.float64)
        return (identity - self.normalized_adjacency()).tocsr()

    def connected_components(self) -> tuple[int, np.ndarray]:
        """Number of connected components and the component label of each node."""
        from scipy.sparse.csgraph import connected_components

        return self._cached("components", lambda: connected_components(self.adjacency, directed=False))

    def largest_component(self) -> tuple[Graph, np.ndarray]:
        """The largest connected component as a new graph, and its nodes' original indices."""
        count, labels = self.connected_components()
        largest = np.argmax(np.bincount(labels, minlength=count))
        nodes = np.flatnonzero(labels == largest)
        return self.subgraph(nodes), nodes

    def subgraph(self, nodes: Any) -> Graph:
        """The induced subgraph on ``nodes``, relabelled ``0, ..., len(nodes) - 1`` in the given order."""
        index = np.asarray(nodes)
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
            raise TypeError("nodes must be a 1-D integer array")
        if index.size == 0:
            raise ValueError("nodes is empty")
        if index.min() < 0 or index.max() >= self._num_nodes:
            raise ValueError(f"nodes must lie in [0, {self._num_nodes})")
        if len(np.unique(index)) != len(index):
            raise ValueError("nodes contains duplicates")
        sub = self.adjacency[index][:, index]
        return Graph(sub, self_loops="keep")

    def to_networkx(self) -> nx.Graph:
        """The graph as a :class:`networkx.Graph` with ``weight`` edge attributes."""
        import networkx as nx

        return nx.from_scipy_sparse_array(self.adjacency, edge_attribute="weight")

    def fingerprint(self) -> str:
        """SHA-256 of the CSR arrays: equal graphs (same node order) have equal fingerprints."""

        def build() -> str:
            digest = hashlib.sha256()
            digest.update(np.int64(self._num_nodes).tobytes())
            digest.update(self._indptr.tobytes())
            digest.update(self._indices.astype(np.int64).tobytes())
            digest.update(self._weights.tobytes())
            return digest.hexdigest()

        return self._cached("fingerprint", build)

    def __repr__(self) -> str:
        count, _ = self.connected_components()
        return (f"Graph(num_nodes={self._num_nodes}, num_edges={self.num_edges}, "
                f"components={count}, isolated={len(self.isolated_nodes)})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.fingerprint() == other.fingerprint()

    def __copy__(self) -> Graph:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Graph:
        # Immutable: copies (e.g. Pyro deep-copying a model every step) can share it.
        return self

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def _cached(self, key: str, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


# ------------------------------------------------------------------ procedural graphs
def grid_graph(rows: int, cols: int) -> Graph:
    """The ``rows x cols`` 4-neighbour grid; node ``r * cols + c`` sits at ``(r, c)``."""
    if int(rows) < 1 or int(cols) < 1:
        raise ValueError(f"grid dimensions must be positive, got {rows} x {cols}")
    index = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    horizontal = np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], axis=1)
    vertical = np.stack([index[:-1, :].ravel(), index[1:, :].ravel()], axis=1)
    return Graph.from_edges(np.concatenate([horizontal, vertical]), num_nodes=rows * cols)


def erdos_renyi_graph(num_nodes: int, edge_probability: float, seed: int = 0) -> Graph:
    r"""The Erdős–Rényi graph :math:`G(n, p)` of ``networkx.gnp_random_graph`` (the paper's fitting graph).

    :param num_nodes: Number of nodes :math:`n \ge 1`.
    :param edge_probability: Probability :math:`p \in [0, 1]` of each edge.
    :param seed: Non-negative int seed of networkx's generator.
    :raises TypeError: If an argument is not a number of the right kind.
    :raises ValueError: If ``num_nodes < 1``, ``edge_probability`` lies outside
        ``[0, 1]`` or ``seed`` is negative.
    """
    import networkx as nx

    num_nodes = check_int("num_nodes", num_nodes, 1)
    if isinstance(edge_probability, bool) or not isinstance(edge_probability, (int, float, np.number)):
        raise TypeError(f"edge_probability must be a float, got {type(edge_probability).__name__}")
    if not 0.0 <= float(edge_probability) <= 1.0:
        raise ValueError(f"edge_probability must lie in [0, 1], got {edge_probability}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return Graph.from_networkx(nx.gnp_random_graph(int(num_nodes), float(edge_probability), seed=int(seed)),
                               weight=None)


def icosphere_graph(subdivisions: int) -> Graph:
    """Faces of ``trimesh.creation.icosphere(subdivisions)`` as nodes (``20 * 4**subdivisions`` nodes)."""
    import trimesh

    return Graph.from_trimesh(trimesh.creation.icosphere(subdivisions=int(subdivisions)))


# ------------------------------------------------------------------ validation helpers
def _as_csr(adjacency: Any) -> sp.csr_matrix:
    if sp.issparse(adjacency):
        matrix = sp.csr_matrix(adjacency, dtype=np.float64, copy=True)
    else:
        if isinstance(adjacency, torch.Tensor):
            adjacency = adjacency.detach().cpu().to_dense().numpy()
        if isinstance(adjacency, (str, bytes)) or not hasattr(adjacency, "__len__") and not hasattr(adjacency, "shape"):
            raise TypeError(f"adjacency must be a matrix, got {type(adjacency).__name__}")
        array = np.asarray(adjacency)
        if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise TypeError(f"adjacency must be numeric, got dtype {array.dtype}")
        if array.ndim != 2:
            raise ValueError(f"adjacency must be 2-D, got shape {array.shape}")
        matrix = sp.csr_matrix(array.astype(np.float64))
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError("graph is empty: adjacency has no nodes")
    return matrix


def _validate_square_finite_nonnegative(matrix: sp.csr_matrix) -> None:
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {matrix.shape}")
    data = matrix.data
    if not np.all(np.isfinite(data)):
        raise ValueError("adjacency has NaN or infinite weights")
    if np.any(data < 0):
        raise ValueError(f"adjacency has negative weights (min {data.min():.3g}); weights must be >= 0")
    matrix.eliminate_zeros()
    matrix.sum_duplicates()
    with np.errstate(over="ignore"):
        degrees = np.asarray(matrix.sum(axis=1)).ravel()
    too_large = ~(degrees <= MAX_WEIGHTED_DEGREE)
    if np.any(too_large):
        node = int(np.flatnonzero(too_large)[0])
        raise ValueError(
            f"adjacency weights are too large: node {node} has weighted degree {degrees[node]:.3g}, "
            f"above the limit {MAX_WEIGHTED_DEGREE:.0e} (float64 degree sums would overflow); graph "
            "kernels depend only on weight ratios, so rescale the weights (e.g. divide by the largest)")


def _apply_self_loop_policy(matrix: sp.csr_matrix, self_loops: str) -> sp.csr_matrix:
    diagonal = matrix.diagonal()
    loops = np.flatnonzero(diagonal)
    if loops.size == 0 or self_loops == "keep":
        return matrix
    if self_loops == "error":
        raise ValueError(
            f"graph has {loops.size} self-loop(s) (e.g. node {loops[0]}); pass "
            "self_loops='drop' to remove them or self_loops='keep' to keep them")
    matrix = matrix.tolil()
    matrix.setdiag(0.0)
    matrix = matrix.tocsr()
    matrix.eliminate_zeros()
    return matrix


def _validate_symmetric(matrix: sp.csr_matrix) -> None:
    difference = abs(matrix - matrix.T)
    if difference.nnz:
        worst = difference.max()
        scale = max(abs(matrix).max(), 1.0)
        if worst > 1e-12 * scale:
            raise ValueError(
                f"adjacency is not symmetric (max |W - W^T| = {worst:.3g}); graph kernels "
                "need an undirected graph. Use Graph.from_scipy(..., symmetrize=True) to "
                "symmetrise it explicitly")
