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
* **Weight types.** Weights are real numbers: complex, string or object weights are a
  ``TypeError`` (never silently cast, which would drop an imaginary part or parse text).
* **Node ids and size.** Nodes are ``0, ..., num_nodes - 1``; an edge list whose ids are
  spread over a much larger range than the ids it uses (at least
  :data:`SPARSE_IDS_MIN_NODES` nodes, over 90 % of them isolated) draws a warning that
  suggests relabelling them, and a graph whose estimated memory exceeds the available
  memory is refused with the estimate before anything is allocated.
* **Unweighted graphs** (every weight 1, whichever builder made them) store no weights:
  :attr:`Graph.weights` is then a read-only zero-stride view of ``1.0`` (no buffer of 8 bytes
  per stored entry), read like any array, and every result is the one of stored unit weights,
  bit for bit.
* **Weight range.** Weights must be finite and non-negative, and every weighted degree
  (row sum of :math:`\mathbf W`) at most :data:`MAX_WEIGHTED_DEGREE` (``1e300``), so that
  degree sums and the normalisation stay finite in float64. Graph kernels depend only on
  the ratios of the weights (:math:`\widetilde{\mathbf W}` is invariant to scaling
  :math:`\mathbf W`), so rescale larger weights, e.g. by their maximum.
"""

from __future__ import annotations

import hashlib
import numbers
import warnings
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import scipy.sparse as sp
import torch
from numba import njit

from ._checks import check_int, check_memory, is_int
from ._derived import DerivedCache

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx
    import trimesh

#: Largest weighted degree (row sum of W) a graph may have: far below float64's 1.8e308,
#: leaving room for the symmetrisation and degree products of the normalisation.
MAX_WEIGHTED_DEGREE = 1e300

#: An edge list inferring at least this many nodes, over 90 % of them unused by its edges,
#: draws a warning (its ids are sparse: relabel them).
SPARSE_IDS_MIN_NODES = 100_000
_SPARSE_IDS_RATIO = 10

# Peak bytes of building a graph, measured with tracemalloc (about 24 per node and 100-220
# per edge-list row for Graph.from_edges and grid_graph, about 880 per face for an
# icosphere through trimesh, about 430 per edge through networkx), rounded up.
_BYTES_PER_NODE = 32
_BYTES_PER_EDGE = 224
_BYTES_PER_MESH_FACE = 1024
_NETWORKX_BYTES_PER_NODE = 1024
_NETWORKX_BYTES_PER_EDGE = 512

#: Largest value of a 32-bit index: the CSR arrays are int32 while the number of nodes and
#: of stored entries stay below it (as scipy does), int64 beyond.
_INT32_MAX = np.iinfo(np.int32).max
#: Elements of the CSR arrays hashed at a time by :meth:`Graph.fingerprint`.
_HASH_CHUNK = 1 << 20
#: What the compiled loops get for the weights of an unweighted graph (read-only).
_EMPTY_WEIGHTS = np.empty(0, dtype=np.float64)
_EMPTY_WEIGHTS.setflags(write=False)

SelfLoopPolicy = Literal["error", "drop", "keep"]
_SELF_LOOP_POLICIES = ("error", "drop", "keep")


def _check_policy(self_loops: str) -> None:
    if self_loops not in _SELF_LOOP_POLICIES:
        raise ValueError(f"self_loops must be one of {_SELF_LOOP_POLICIES}, got {self_loops!r}")


def _freeze(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _unit_weights(num_entries: int) -> np.ndarray:
    """``num_entries`` weights 1.0 without a buffer: a read-only zero-stride view of one float64."""
    return np.broadcast_to(np.float64(1.0), (num_entries,))


def _kept_weights(weights: np.ndarray) -> np.ndarray:
    """The weights a graph keeps: :func:`_unit_weights` when all are 1 (or there are none), else a
    read-only float64 array of stride 8 (``weights`` itself where it is one), so that a zero stride
    marks unit weights (:attr:`Graph.has_unit_weights`)."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size == 0 or weights.min() == weights.max() == 1.0:
        return _unit_weights(weights.size)
    # A copy where the strides differ (np.ascontiguousarray keeps any stride of a single value).
    return _freeze(weights if weights.strides == (8,) else weights.copy())


def _index_dtype(num_nodes: int, num_entries: int) -> type[np.signedinteger]:
    """int32 for CSR arrays whose node ids and entry offsets fit, int64 otherwise (one dtype for both arrays)."""
    return np.int32 if max(num_nodes, num_entries) < _INT32_MAX else np.int64


class Graph(DerivedCache):
    r"""A weighted undirected graph on nodes ``0, ..., num_nodes - 1``.

    Build one with :meth:`from_scipy`, :meth:`from_networkx`, :meth:`from_edges` or
    :meth:`from_trimesh`; the constructor takes a symmetric scipy sparse matrix or dense
    array directly. Instances are immutable: their arrays are read-only, and what is
    computed from a graph alone (degrees, proposal tables, a Chebyshev basis, ...) is
    kept with it by :meth:`~gp_couple._derived.DerivedCache.derived`.

    :param adjacency: Square symmetric weighted adjacency matrix (scipy sparse or dense
        array-like) with non-negative finite weights.
    :param self_loops: What to do with diagonal entries: ``"error"`` (default),
        ``"drop"`` or ``"keep"``.
    :raises TypeError: If ``adjacency`` is not a matrix of real numbers (complex, string
        and object matrices are refused).
    :raises ValueError: If the matrix is empty, not square, not symmetric, or has
        negative, NaN or infinite weights, or self-loops under ``self_loops="error"``, or
        (a sparse matrix) cannot be converted within the available memory.
    """

    def __init__(self, adjacency: Any, *, self_loops: SelfLoopPolicy = "error") -> None:
        _check_policy(self_loops)
        # _as_csr copies the input: the arrays of `matrix` belong to this graph alone.
        matrix = _as_csr(adjacency)
        _validate_square_finite_nonnegative(matrix)
        matrix = _apply_self_loop_policy(matrix, self_loops)
        matrix = _symmetric(matrix)
        self._set_csr(matrix.indptr, matrix.indices, matrix.data, matrix.shape[0])

    def _set_csr(self, indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, num_nodes: int) -> None:
        """Keep a canonical symmetric CSR matrix (arrays owned by this graph; cast without copying where they
        fit; weights that are all 1 are not kept, see :func:`_kept_weights`)."""
        index_dtype = _index_dtype(num_nodes, len(weights))
        self._indptr = _freeze(indptr.astype(index_dtype, copy=False))
        self._indices = _freeze(indices.astype(index_dtype, copy=False))
        self._weights = _kept_weights(weights)
        self._num_nodes = int(num_nodes)

    @classmethod
    def _from_csr(cls, indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, num_nodes: int) -> Graph:
        """A graph of CSR arrays that are valid by construction (symmetric, sorted, positive finite weights,
        degrees in range), which it takes over: the builders that produce such arrays skip the checks and the
        symmetrisation of :class:`Graph`'s constructor, and their copies."""
        graph = cls.__new__(cls)
        graph._set_csr(indptr, indices, weights, num_nodes)
        return graph

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

        Node ids are used as they are: ids ``0`` and ``10**7`` make a graph of ``10**7 + 1``
        nodes. When ``num_nodes`` is inferred and the edges use under a tenth of at least
        :data:`SPARSE_IDS_MIN_NODES` ids, a warning suggests relabelling them
        (``np.unique(edges, return_inverse=True)``, or ``load_graph(..., relabel=True)``
        for a file); a graph too large for the available memory is refused beforehand.

        :param edges: Integer array of shape ``(E, 2)``.
        :param weights: Optional positive real weights of shape ``(E,)`` (default all ones).
        :param num_nodes: Number of nodes, a positive int (default ``edges.max() + 1``);
            use it to include isolated nodes with large indices.
        :param self_loops: Self-loop policy.
        :raises TypeError: If ``edges`` are not integers, ``weights`` not real numbers or
            ``num_nodes`` not an int.
        :raises ValueError: For a wrong shape, a negative node index, ``num_nodes`` below 1
            or below the largest index + 1, invalid weights, or a graph that cannot fit
            in memory (the message gives the estimate).
        """
        _check_policy(self_loops)
        edge_array = np.asarray(edges)
        if edge_array.size == 0:
            edge_array = edge_array.reshape(0, 2)
        if edge_array.ndim != 2 or edge_array.shape[1] != 2:
            raise ValueError(f"edges must have shape (E, 2), got {edge_array.shape}")
        if not np.issubdtype(edge_array.dtype, np.integer):
            # Floats beyond int64 would wrap around when cast.
            if not np.issubdtype(edge_array.dtype, np.floating) or not np.all(
                np.abs(edge_array) < 2.0 ** 63) or np.any(edge_array != np.round(edge_array)):
                raise TypeError("edges must hold integer node indices")
            edge_array = edge_array.astype(np.int64)
        if edge_array.size and edge_array.min() < 0:
            raise ValueError("edges contain a negative node index")
        inferred = int(edge_array.max()) + 1 if edge_array.size else 0
        if num_nodes is not None:
            num_nodes = check_int("num_nodes", num_nodes, 1)
            if num_nodes < inferred:
                raise ValueError(f"edges reference node {inferred - 1} but num_nodes={num_nodes}")
        if weights is None:
            weight_array = np.ones(len(edge_array), dtype=np.float64)
        else:
            weight_array = _real_array("weights", np.asarray(weights))
            if weight_array.shape != (len(edge_array),):
                raise ValueError(
                    f"weights must have shape ({len(edge_array)},), got {weight_array.shape}")
        inferring = num_nodes is None
        num_nodes = inferred if inferring else num_nodes
        if num_nodes == 0:
            raise ValueError("graph is empty: adjacency has no nodes")
        _check_edge_list_fits(edge_array, num_nodes, sparse_ids_hint=inferring)
        return cls._from_csr(*_symmetric_csr_of_edges(edge_array, weight_array, num_nodes, self_loops), num_nodes)

    @classmethod
    def from_networkx(cls, graph: nx.Graph, *, weight: str | None = "weight",
                      nodelist: list | None = None, symmetrize: bool = False,
                      self_loops: SelfLoopPolicy = "error") -> Graph:
        """Build a graph from a networkx graph.

        Node ``i`` of the result is ``nodelist[i]`` (default: ``list(graph.nodes)``).
        Parallel edges of multigraphs have their weights summed.

        :param graph: A networkx graph. Directed graphs are rejected unless
            ``symmetrize=True`` (element-wise maximum of the two directions).
        :param weight: Edge attribute holding the weight, a real number (missing
            attributes count as 1); ``None`` makes the graph unweighted.
        :param nodelist: Node order.
        :param symmetrize: Accept directed graphs by symmetrising them.
        :param self_loops: Self-loop policy.
        :raises TypeError: If ``graph`` is not a networkx graph, or an edge's weight is
            not a real number (a string such as ``'2'``, a complex number, ``None``).
        :raises ValueError: For an empty or (without ``symmetrize``) directed graph, or
            invalid weights.
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
        if weight is not None:
            _check_networkx_weights(graph, weight)
        matrix = nx.to_scipy_sparse_array(graph, nodelist=nodelist, weight=weight, format="csr")
        return cls.from_scipy(matrix, symmetrize=graph.is_directed(), self_loops=self_loops)

    @classmethod
    def from_trimesh(cls, mesh: trimesh.Trimesh, *, nodes: Literal["faces", "vertices"] = "faces") -> Graph:
        """Build the graph of a triangle mesh.

        With ``nodes="faces"`` (the paper's setting, Appendix F.2 "Scalable GPs on graphs",
        paragraph "Training GRF-GPs: technical details" [app:grf_gp_details]) the nodes are
        the faces and two faces are joined when they share an edge (two of their
        vertices), also at a non-manifold edge: the three or more faces around such an
        edge are joined pairwise. Exact duplicate faces (the same three vertices, in either
        orientation) are merged into the first of them with a warning
        (:func:`distinct_faces`), so node ``i`` is the ``i``-th distinct face in file order
        (face ``i`` when there are no duplicates). With ``nodes="vertices"`` node ``i`` is
        vertex ``i`` and the graph is the mesh's edge graph. Edges are unweighted. Faces of
        zero area with three distinct vertices are ordinary nodes here (only their normal
        is undefined).

        :param mesh: A :class:`trimesh.Trimesh` with at least one face.
        :param nodes: ``"faces"`` or ``"vertices"``.
        :raises TypeError: If ``mesh`` is not a :class:`trimesh.Trimesh`.
        :raises ValueError: For an unknown ``nodes``, a mesh without faces (vertices), a vertex with
            a NaN or infinite coordinate, or a face that repeats a vertex (each named).
        """
        import trimesh

        if not isinstance(mesh, trimesh.Trimesh):
            raise TypeError(f"expected a trimesh.Trimesh, got {type(mesh).__name__}")
        if nodes not in ("faces", "vertices"):
            raise ValueError(f"nodes must be 'faces' or 'vertices', got {nodes!r}")
        if len(mesh.faces if nodes == "faces" else mesh.vertices) == 0:
            raise ValueError(f"mesh has no {nodes}")
        if nodes == "faces":
            faces = np.asarray(mesh.faces)[distinct_faces(mesh)]
            return cls.from_edges(_shared_edge_pairs(faces), num_nodes=len(faces))
        check_mesh(mesh)
        pairs = np.unique(np.sort(np.asarray(mesh.edges_unique), axis=1), axis=0)
        return cls.from_edges(pairs.reshape(-1, 2), num_nodes=len(mesh.vertices))

    # ---------------------------------------------------------------- structure
    @property
    def num_nodes(self) -> int:
        """Number of nodes :math:`N`."""
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        """Number of undirected edges (a self-loop counts once)."""
        # Stored weights are positive: the self-loops are the diagonal entries of the pattern.
        loops = _count_self_loops(self._indptr, self._indices)
        return (len(self._indices) - loops) // 2 + loops

    @property
    def indptr(self) -> np.ndarray:
        """CSR row pointer (length ``num_nodes + 1``), read-only: int32 when the graph has fewer than
        ``2**31 - 1`` nodes and stored entries, int64 otherwise (the dtype of :attr:`indices`)."""
        return self._indptr

    @property
    def indices(self) -> np.ndarray:
        """CSR neighbour indices (the dtype of :attr:`indptr`), sorted within each row, read-only."""
        return self._indices

    @property
    def weights(self) -> np.ndarray:
        """CSR edge weights (float64), read-only.

        On an unweighted graph (:attr:`has_unit_weights`) a zero-stride view of ``1.0``
        (``strides == (0,)``) that holds no per-edge buffer: numpy reads it like any array, and
        ``np.ascontiguousarray`` copies it where a contiguous one is needed.
        """
        return self._weights

    @property
    def has_unit_weights(self) -> bool:
        """Whether every edge weight is 1 (an unweighted graph, all weights given as 1, or no edges):
        the weights are then not stored, and what is computed from them takes the unit weights'
        shortcuts (the same values, bit for bit)."""
        return self._weights.strides == (0,)

    def nbytes(self) -> int:
        """Bytes of the CSR arrays the graph holds (not what is kept with it by
        :meth:`~gp_couple._derived.DerivedCache.derived`): the unit weights of an unweighted graph
        count for nothing."""
        weights = 0 if self.has_unit_weights else self._weights.nbytes
        return self._indptr.nbytes + self._indices.nbytes + weights

    @property
    def degrees(self) -> np.ndarray:
        """Number of neighbours of each node (the dtype of :attr:`indptr`): the walkers' choice is uniform
        over them."""
        return self.derived("degrees", lambda: _freeze(np.diff(self._indptr)))

    @property
    def weighted_degrees(self) -> np.ndarray:
        r"""Weighted degrees :math:`D_{ii} = \sum_j W_{ij}` (float64)."""
        return self.derived("weighted_degrees", self._weighted_degrees)

    def _weighted_degrees(self) -> np.ndarray:
        if self.has_unit_weights:
            # Row sums of ones are the degrees, exactly (without a contiguous copy of the weights).
            return _freeze(self.degrees.astype(np.float64))
        return _freeze(np.asarray(self.adjacency.sum(axis=1)).ravel().astype(np.float64))

    @property
    def adjacency(self) -> sp.csr_matrix:
        """Weighted adjacency matrix :math:`W` (a fresh scipy CSR matrix view).

        Its ``data`` is :attr:`weights`: on an unweighted graph the zero-stride view, which scipy's
        compiled routines (products, sums, indexing) copy to a contiguous array while they run.
        """
        return sp.csr_matrix((self._weights, self._indices, self._indptr),
                             shape=(self._num_nodes, self._num_nodes))

    @property
    def isolated_nodes(self) -> np.ndarray:
        """Indices of nodes with no neighbours."""
        return np.flatnonzero(self.degrees == 0)

    def normalized_weights(self) -> np.ndarray:
        r"""Entries of :math:`\widetilde{\mathbf W} = D^{-1/2} W D^{-1/2}` in CSR order (read-only, kept)."""
        return self.derived("normalized_weights", lambda: _freeze(self.compute_normalized_weights()))

    def compute_normalized_weights(self, *, times_degree: bool = False) -> np.ndarray:
        r"""Entries :math:`\widetilde W(u, v)` of :meth:`normalized_weights`, computed afresh and not kept.

        With ``times_degree`` each is multiplied by :math:`\deg(u)` of its row: the importance ratios of a
        uniform choice among neighbours, which the walk sampler keeps instead of :math:`\widetilde{\mathbf W}`.
        Equal, bit for bit, to ``normalized_weights() * np.repeat(degrees, degrees)``; computed row by row,
        without temporaries the size of the edge list.

        :return: A new writable float64 array of shape ``(E,)``.
        """
        # The weighted degrees are kept only when something else asked for them.
        d = self.derived("weighted_degrees", self._weighted_degrees, keep=False)
        inv_sqrt = np.zeros_like(d)
        positive = d > 0
        inv_sqrt[positive] = 1.0 / np.sqrt(d[positive])
        out = np.empty(len(self._indices), dtype=np.float64)
        unit = self.has_unit_weights
        _normalize_edge_weights(self._indptr, self._indices, _EMPTY_WEIGHTS if unit else self._weights, unit,
                                inv_sqrt, times_degree, out)
        return out

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

        return self.derived("components", lambda: connected_components(self.adjacency, directed=False))

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
            # The index arrays are hashed as int64 whatever their dtype, so fingerprints (kept in saved
            # kernels) do not depend on it; in chunks, without an int64 copy of the edge list.
            for array in (self._indptr, self._indices):
                for start in range(0, len(array), _HASH_CHUNK):
                    digest.update(array[start:start + _HASH_CHUNK].astype(np.int64).tobytes())
            if self.has_unit_weights:
                # The bytes of stored unit weights, a chunk at a time.
                count = len(self._weights)
                ones = np.ones(min(count, _HASH_CHUNK))
                for start in range(0, count, _HASH_CHUNK):
                    digest.update(ones[:count - start])
            else:
                digest.update(self._weights)
            return digest.hexdigest()

        return self.derived("fingerprint", build)

    def __repr__(self) -> str:
        count, _ = self.connected_components()
        return (f"Graph(num_nodes={self._num_nodes}, num_edges={self.num_edges}, "
                f"components={count}, isolated={len(self.isolated_nodes)})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.fingerprint() == other.fingerprint()

    def __copy__(self) -> Graph:
        return self

    def __getstate__(self) -> dict[str, Any]:
        # Unit weights are pickled as None (a pickled zero-stride view would be a full array).
        state = dict(self.__dict__)
        if self.has_unit_weights:
            state["_weights"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        weights = state.pop("_weights")
        self.__dict__.update(state)
        self._weights = _unit_weights(len(self._indices)) if weights is None else _kept_weights(weights)
        _freeze(self._indptr)
        _freeze(self._indices)

    def __deepcopy__(self, memo: dict[int, Any]) -> Graph:
        # Immutable: copies (e.g. Pyro deep-copying a model every step) can share it.
        return self

    def __hash__(self) -> int:
        return hash(self.fingerprint())


# ------------------------------------------------------------------ procedural graphs
def grid_graph(rows: int, cols: int) -> Graph:
    """The ``rows x cols`` 4-neighbour grid; node ``r * cols + c`` sits at ``(r, c)``.

    :param rows: Number of rows, a positive int.
    :param cols: Number of columns, a positive int.
    :raises TypeError: If ``rows`` or ``cols`` is not an int.
    :raises ValueError: If one is below 1, or the grid cannot fit in memory (the message
        gives the estimate).
    """
    rows, cols = check_int("rows", rows, 1), check_int("cols", cols, 1)
    _check_graph_fits(f"grid_graph({rows}, {cols})", rows * cols, 2 * rows * cols)
    # Symmetric by construction: the CSR arrays are written directly, in their final dtype, with no edge
    # list and no symmetrisation (the graph of Graph.from_edges on the grid's edges, array for array).
    num_nodes, num_entries = rows * cols, 2 * (rows * (cols - 1) + (rows - 1) * cols)
    index_dtype = _index_dtype(num_nodes, num_entries)
    indptr = np.empty(num_nodes + 1, dtype=index_dtype)
    indices = np.empty(num_entries, dtype=index_dtype)
    _fill_grid_csr(rows, cols, indptr, indices)
    return Graph._from_csr(indptr, indices, _unit_weights(num_entries), num_nodes)


def erdos_renyi_graph(num_nodes: int, edge_probability: float, seed: int = 0) -> Graph:
    r"""The Erdős–Rényi graph :math:`G(n, p)` of ``networkx.gnp_random_graph`` (the paper's fitting graph).

    :param num_nodes: Number of nodes :math:`n \ge 1`.
    :param edge_probability: Probability :math:`p \in [0, 1]` of each edge.
    :param seed: Non-negative int seed of networkx's generator.
    :raises TypeError: If an argument is not a number of the right kind.
    :raises ValueError: If ``num_nodes < 1``, ``edge_probability`` lies outside
        ``[0, 1]``, ``seed`` is negative, or the graph cannot fit in memory.
    """
    import networkx as nx

    num_nodes = check_int("num_nodes", num_nodes, 1)
    if isinstance(edge_probability, bool) or not isinstance(edge_probability, (int, float, np.number)):
        raise TypeError(f"edge_probability must be a float, got {type(edge_probability).__name__}")
    if not 0.0 <= float(edge_probability) <= 1.0:
        raise ValueError(f"edge_probability must lie in [0, 1], got {edge_probability}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    expected_edges = float(edge_probability) * num_nodes * (num_nodes - 1) / 2
    check_memory(f"erdos_renyi_graph({num_nodes}, {edge_probability}) (about {expected_edges:.3g} edges)",
                 _NETWORKX_BYTES_PER_NODE * num_nodes + _NETWORKX_BYTES_PER_EDGE * expected_edges)
    return Graph.from_networkx(nx.gnp_random_graph(int(num_nodes), float(edge_probability), seed=int(seed)),
                               weight=None)


def icosphere_graph(subdivisions: int) -> Graph:
    """Faces of ``trimesh.creation.icosphere(subdivisions)`` as nodes (``20 * 4**subdivisions`` nodes).

    :param subdivisions: Number of subdivisions of the icosahedron, a non-negative int.
    :raises TypeError: If ``subdivisions`` is not an int.
    :raises ValueError: If it is negative, or the mesh cannot fit in memory (checked
        before it is built; the message gives the estimate).
    """
    import trimesh

    subdivisions = check_int("subdivisions", subdivisions, 0)
    num_faces = 20 * 4 ** subdivisions
    check_memory(f"icosphere_graph({subdivisions}) ({num_faces} faces)", _BYTES_PER_MESH_FACE * float(num_faces))
    return Graph.from_trimesh(trimesh.creation.icosphere(subdivisions=subdivisions))


# ------------------------------------------------------------------ meshes
def check_mesh(mesh: trimesh.Trimesh, source: str = "mesh") -> None:
    """Refuse a mesh with non-finite vertices, or faces that repeat a vertex or index a missing one.

    trimesh silently drops the faces of NaN or infinite vertices when it processes a
    mesh (renumbering the faces after them) and gives degenerate faces a zero normal,
    so both are errors here.

    :param mesh: A :class:`trimesh.Trimesh`.
    :param source: What the mesh is, for the messages (e.g. ``"mesh file bunny.ply"``).
    :raises ValueError: Naming the first vertex with a NaN or infinite coordinate, or the
        first face whose three vertex indices are not distinct or not all vertices.
    """
    vertices, faces = np.asarray(mesh.vertices), np.asarray(mesh.faces).reshape(-1, 3)
    non_finite = np.flatnonzero(~np.all(np.isfinite(vertices), axis=1))
    if non_finite.size:
        vertex = int(non_finite[0])
        raise ValueError(f"{source}: vertex {vertex} has a NaN or infinite coordinate "
                         f"{vertices[vertex].tolist()} ({non_finite.size} such vertices); fix or remove them")
    outside = np.flatnonzero(np.any((faces < 0) | (faces >= len(vertices)), axis=1))
    if outside.size:
        face = int(outside[0])
        raise ValueError(f"{source}: face {face} has vertices {faces[face].tolist()}, but the mesh has "
                         f"{len(vertices)} vertices")
    repeated = np.flatnonzero((faces[:, 0] == faces[:, 1]) | (faces[:, 1] == faces[:, 2])
                              | (faces[:, 0] == faces[:, 2]))
    if repeated.size:
        face = int(repeated[0])
        raise ValueError(f"{source}: face {face} has vertices {faces[face].tolist()}, repeating a vertex "
                         f"({repeated.size} such degenerate faces); remove them, e.g. with "
                         "mesh.update_faces(mesh.nondegenerate_faces())")


def distinct_faces(mesh: trimesh.Trimesh, source: str = "mesh") -> np.ndarray:
    """Indices of the faces of a checked mesh that are the nodes of its face graph.

    The mesh is checked with :func:`check_mesh`. Exact duplicate faces (the same three
    vertices, in either orientation) would be one triangle counted twice; each is merged
    into its first occurrence, with a warning naming one of them.

    :param mesh: A :class:`trimesh.Trimesh`.
    :param source: What the mesh is, for the messages.
    :return: The sorted int64 indices of the first occurrence of every distinct face
        (``arange(len(mesh.faces))`` when there are no duplicates).
    :raises ValueError: As :func:`check_mesh`.
    """
    check_mesh(mesh, source)
    faces = np.asarray(mesh.faces)
    _, first, group = np.unique(np.sort(faces, axis=1), axis=0, return_index=True, return_inverse=True)
    keep = np.sort(first).astype(np.int64)
    if len(keep) < len(faces):
        group = group.ravel()
        duplicate = int(np.flatnonzero(first[group] != np.arange(len(faces)))[0])
        warnings.warn(
            f"{source}: {len(faces) - len(keep)} faces repeat the vertices of an earlier face (e.g. face "
            f"{duplicate} those of face {first[group[duplicate]]}) and are merged into it: the face graph "
            f"has {len(keep)} nodes, the distinct faces in order", stacklevel=3)
    return keep


def _shared_edge_pairs(faces: np.ndarray) -> np.ndarray:
    """Pairs ``(i, j)``, ``i < j``, of faces sharing an edge; the k faces at an edge give all k(k-1)/2 pairs."""
    edges = np.sort(faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2), axis=1)
    owners = np.repeat(np.arange(len(faces), dtype=np.int64), 3)
    order = np.lexsort((owners, edges[:, 1], edges[:, 0]))
    edges, owners = edges[order], owners[order]
    starts = np.flatnonzero(np.r_[True, np.any(edges[1:] != edges[:-1], axis=1)])
    sizes = np.diff(np.r_[starts, len(edges)])
    pairs = [np.zeros((0, 2), dtype=np.int64)]
    for size in np.unique(sizes[sizes > 1]):
        members = owners[starts[sizes == size][:, None] + np.arange(size)]
        first, second = np.triu_indices(size, 1)
        pairs.append(np.stack([members[:, first].ravel(), members[:, second].ravel()], axis=1))
    return np.unique(np.sort(np.concatenate(pairs), axis=1), axis=0)


# ------------------------------------------------------------------ validation helpers
def _check_real(name: str, dtype: np.dtype) -> None:
    """Refuse complex, string and object values, which a cast to float64 would drop a part of or parse."""
    if dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {dtype}")


def _real_array(name: str, array: np.ndarray) -> np.ndarray:
    _check_real(name, array.dtype)
    return array.astype(np.float64)


def _check_graph_fits(what: str, num_nodes: int, num_edges: int, hint: str = "") -> None:
    check_memory(what, _BYTES_PER_NODE * float(num_nodes) + _BYTES_PER_EDGE * float(num_edges), hint)


def _check_edge_list_fits(edges: np.ndarray, num_nodes: int, sparse_ids_hint: bool) -> None:
    """Warn about sparse inferred ids, refuse an edge list whose graph cannot fit (before allocating it)."""
    hint = ""
    if sparse_ids_hint and num_nodes >= SPARSE_IDS_MIN_NODES:
        used = len(np.unique(edges))
        if used * _SPARSE_IDS_RATIO < num_nodes:
            hint = (f"; the edges use only {used} distinct node ids, the largest {num_nodes - 1}: relabel "
                    f"them 0..{used - 1} (np.unique(edges, return_inverse=True), or "
                    "gp_couple.datasets.load_graph(path, relabel=True) for an edge-list file)")
    _check_graph_fits(f"a graph with {num_nodes} nodes and {len(edges)} edges", num_nodes, len(edges), hint)
    if hint:
        warnings.warn(f"the edge list makes a graph of {num_nodes} nodes, most of them isolated{hint}",
                      stacklevel=3)


def _check_networkx_weights(graph: nx.Graph, weight: str) -> None:
    for u, v, value in graph.edges(data=weight, default=1):
        if not isinstance(value, numbers.Real):
            raise TypeError(f"edge ({u!r}, {v!r}) has {weight}={value!r} ({type(value).__name__}): weights "
                            f"(the edge attribute weight={weight!r}) must be real numbers; convert them, "
                            "or pass weight=None for an unweighted graph")


def _as_csr(adjacency: Any) -> sp.csr_matrix:
    if sp.issparse(adjacency):
        _check_real("adjacency", adjacency.dtype)
        _check_graph_fits(f"a graph with {max(adjacency.shape)} nodes", max(adjacency.shape), adjacency.nnz)
        matrix = sp.csr_matrix(adjacency, dtype=np.float64, copy=True)
    else:
        if isinstance(adjacency, torch.Tensor):
            adjacency = adjacency.detach().cpu().to_dense().numpy()
        if isinstance(adjacency, (str, bytes)) or not hasattr(adjacency, "__len__") and not hasattr(adjacency, "shape"):
            raise TypeError(f"adjacency must be a matrix, got {type(adjacency).__name__}")
        array = _real_array("adjacency", np.asarray(adjacency))
        if array.ndim != 2:
            raise ValueError(f"adjacency must be 2-D, got shape {array.shape}")
        matrix = sp.csr_matrix(array)
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError("graph is empty: adjacency has no nodes")
    return matrix


def _check_weight_values(data: np.ndarray) -> None:
    if not np.all(np.isfinite(data)):
        raise ValueError("adjacency has NaN or infinite weights")
    if np.any(data < 0):
        raise ValueError(f"adjacency has negative weights (min {data.min():.3g}); weights must be >= 0")


def _validate_square_finite_nonnegative(matrix: sp.csr_matrix) -> None:
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {matrix.shape}")
    _check_weight_values(matrix.data)
    matrix.eliminate_zeros()
    matrix.sum_duplicates()
    with np.errstate(over="ignore"):
        _check_weighted_degrees(np.asarray(matrix.sum(axis=1)).ravel())


def _check_weighted_degrees(degrees: np.ndarray) -> None:
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
        _refuse_self_loops(loops)
    matrix = matrix.tolil()
    matrix.setdiag(0.0)
    matrix = matrix.tocsr()
    matrix.eliminate_zeros()
    return matrix


def _refuse_self_loops(loops: np.ndarray) -> None:
    raise ValueError(
        f"graph has {loops.size} self-loop(s) (e.g. node {loops[0]}); pass "
        "self_loops='drop' to remove them or self_loops='keep' to keep them")


def _symmetric(matrix: sp.csr_matrix) -> sp.csr_matrix:
    """``matrix`` (canonical: sorted, summed, no zeros) when it is exactly symmetric, else ``(W + W^T) / 2``.

    :raises ValueError: If ``W`` and ``W^T`` differ by more than round-off.
    """
    matrix.sort_indices()
    transpose = matrix.T.tocsr()
    transpose.sort_indices()
    if (np.array_equal(matrix.indptr, transpose.indptr) and np.array_equal(matrix.indices, transpose.indices)
            and np.array_equal(matrix.data, transpose.data)):
        # (W + W^T) / 2 would be W itself, value for value (weights are far below overflow).
        return matrix
    difference = abs(matrix - transpose)
    worst = difference.max()
    scale = max(abs(matrix).max(), 1.0)
    if worst > 1e-12 * scale:
        raise ValueError(
            f"adjacency is not symmetric (max |W - W^T| = {worst:.3g}); graph kernels "
            "need an undirected graph. Use Graph.from_scipy(..., symmetrize=True) to "
            "symmetrise it explicitly")
    del difference
    # Remove round-off asymmetry so that W~ is exactly symmetric.
    symmetric = ((matrix + transpose) * 0.5).tocsr()
    symmetric.sort_indices()
    return symmetric


def _symmetric_csr_of_edges(edges: np.ndarray, weights: np.ndarray, num_nodes: int,
                            self_loops: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The canonical CSR arrays ``(indptr, indices, weights)`` of an undirected edge list (checked as
    :class:`Graph` checks a matrix): each edge stored in both orientations, a self-loop once, duplicates
    summed in list order, zero weights dropped. Built without a COO matrix or a symmetrisation: the
    edges are put in canonical orientation ``(lo, hi)``, sorted, summed and scattered into rows."""
    _check_weight_values(weights)
    index_dtype = _index_dtype(num_nodes, 2 * len(edges))
    lo = np.empty(len(edges), dtype=index_dtype)
    hi = np.empty(len(edges), dtype=index_dtype)
    np.minimum(edges[:, 0], edges[:, 1], out=lo, casting="unsafe")  # ids < num_nodes fit index_dtype
    np.maximum(edges[:, 0], edges[:, 1], out=hi, casting="unsafe")
    if not np.all(weights > 0):
        positive = weights > 0
        lo, hi, weights = lo[positive], hi[positive], weights[positive]
    # Sort the edges by (lo, hi), stably, and sum the weights of each distinct pair in list order.
    if num_nodes < 2 ** 31:
        key = lo.astype(np.int64) * num_nodes + hi
        if not np.all(key[1:] >= key[:-1]):
            order = np.argsort(key, kind="stable")
            key, lo, hi, weights = key[order], lo[order], hi[order], weights[order]
            del order
        distinct = np.empty(len(key), dtype=bool)
        distinct[:1] = True
        np.not_equal(key[1:], key[:-1], out=distinct[1:])
        del key
    else:
        order = np.lexsort((hi, lo))
        lo, hi, weights = lo[order], hi[order], weights[order]
        distinct = np.r_[True, (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])]
    # A sum that overflows is refused below, with the weighted degree it gives.
    with np.errstate(over="ignore"):
        if not np.all(distinct):
            starts = np.flatnonzero(distinct)
            lo, hi, weights = lo[starts], hi[starts], np.add.reduceat(weights, starts)
        del distinct
        loops = lo == hi
        _check_weighted_degrees(np.bincount(lo, weights, minlength=num_nodes)
                                + np.bincount(hi[~loops], weights[~loops], minlength=num_nodes))
    if np.any(loops) and self_loops != "keep":
        if self_loops == "error":
            _refuse_self_loops(lo[loops])
        lo, hi, weights, loops = lo[~loops], hi[~loops], weights[~loops], loops[~loops]
    counts = np.bincount(lo, minlength=num_nodes) + np.bincount(hi[~loops], minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=index_dtype)
    np.cumsum(counts, out=indptr[1:])
    del counts, loops
    indices = np.empty(indptr[-1], dtype=index_dtype)
    data = np.empty(indptr[-1], dtype=np.float64)
    _fill_symmetric_csr(indptr, lo, hi, weights, indices, data)
    return indptr, indices, data


# ------------------------------------------------------------------ compiled CSR loops
@njit(cache=True)
def _fill_grid_csr(rows, cols, indptr, indices):  # pragma: no cover - compiled
    """The CSR arrays of the ``rows x cols`` 4-neighbour grid: neighbours up, left, right, down (sorted)."""
    position = 0
    for r in range(rows):
        for c in range(cols):
            node = r * cols + c
            indptr[node] = position
            if r > 0:
                indices[position] = node - cols
                position += 1
            if c > 0:
                indices[position] = node - 1
                position += 1
            if c < cols - 1:
                indices[position] = node + 1
                position += 1
            if r < rows - 1:
                indices[position] = node + cols
                position += 1
    indptr[rows * cols] = position


@njit(cache=True)
def _fill_symmetric_csr(indptr, lo, hi, weights, indices, data):  # pragma: no cover - compiled
    """Scatter distinct edges ``lo <= hi``, sorted by ``(lo, hi)``, into both orientations of a CSR matrix.

    Row ``r`` receives first its neighbours below ``r`` (edges ``(lo, r)``, met in increasing ``lo``), then
    its self-loop and its neighbours above (edges ``(r, hi)``, met in increasing ``hi``): sorted rows.
    """
    cursor = indptr[:-1].copy()
    for k in range(lo.size):
        if lo[k] != hi[k]:
            position = cursor[hi[k]]
            indices[position] = lo[k]
            data[position] = weights[k]
            cursor[hi[k]] = position + 1
    for k in range(lo.size):
        position = cursor[lo[k]]
        indices[position] = hi[k]
        data[position] = weights[k]
        cursor[lo[k]] = position + 1


@njit(cache=True)
def _count_self_loops(indptr, indices):  # pragma: no cover - compiled
    """Number of stored diagonal entries ``(u, u)``."""
    loops = 0
    for row in range(indptr.size - 1):
        for edge in range(indptr[row], indptr[row + 1]):
            if indices[edge] == row:
                loops += 1
    return loops


@njit(cache=True)
def _normalize_edge_weights(indptr, indices, weights, unit, inv_sqrt, times_degree,
                            out):  # pragma: no cover - compiled
    """``out[e] = weights[e] * inv_sqrt[u] * inv_sqrt[v]`` (times ``deg(u)`` with ``times_degree``), row by row,
    with numpy's order of operations and roundings; with ``unit`` every weight is 1.0 (``weights`` unread)."""
    for row in range(indptr.size - 1):
        lo, hi = indptr[row], indptr[row + 1]
        scale = inv_sqrt[row]
        degree = np.float64(hi - lo)
        for edge in range(lo, hi):
            weight = 1.0 if unit else weights[edge]
            value = weight * scale * inv_sqrt[indices[edge]]
            out[edge] = value * degree if times_degree else value
