r"""Predictions of a trained graph GP at any number of nodes, chunk by chunk, on one or many processes.

A GRF-GP's cost follows the observed and predicted nodes, not the graph, but the
features of every predicted node are still too many to hold at once on a large graph
(thousands of entries per node). :class:`StreamedPredictor` holds only what the training
side needs and samples the walks of each chunk of prediction nodes on the fly, from the
trained kernel's configuration and seed. Walks are keyed by their start node
(:func:`gp_couple.features.walks.sample_walk_lengths`), so a node's prediction is the same
whatever the chunk size, the order and the number of processes, and equals what the
in-memory model (:func:`gp_couple.models.predict`) gives at the kernel's rows.

With :math:`\mathbf A = s\,\Phi_X\Phi_X^\top + \sigma_n^2\mathbf I` on the :math:`n`
observed nodes (``s`` the output scale), factorised once in float64, and
:math:`\mathbf w = s\,\Phi_X^\top\mathbf A^{-1}(\mathbf y - \mu)` on the nodes the training
walks touch, a prediction node :math:`v` with features :math:`\phi_v` gets

.. math::

    \mu_v = \mu + \phi_v^\top\mathbf w, \qquad
    \sigma^2_v = s\,\|\phi_v\|^2 - \mathbf k_v^\top\mathbf A^{-1}\mathbf k_v
    \;(+\,\sigma_n^2), \qquad \mathbf k_v = s\,\Phi_X\phi_v ,

the exact posterior of the GRF kernel (paper, Appendix F.2 "Scalable GPs on graphs"
[app:grf_gp_details]). :math:`\mathbf k_v` is sparse (only observed nodes whose walks
meet :math:`v`'s), so the quadratic form costs the square of its support, computed row by
row in a compiled loop: each node's numbers do not depend on its chunk.

Up to :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` observed nodes,
:math:`\mathbf A^{-1}` is held in LAPACK's rectangular full packed format
(``?pftrf``, ``?pftri``: the blocked Cholesky factorisation and inverse, on
:math:`n(n+1)/2` numbers, half the dense matrix, factorised and inverted in place). Above,
:math:`\mathbf A` is sparse (two observed nodes covary only where their walks meet) and
is factorised by a sparse LU decomposition (:class:`~gp_couple.sparse_factor.SparseFactor`),
and each quadratic form costs a sparse triangular solve over the part of the factor
that :math:`\mathbf k_v` reaches: exact as well, and slower per node than the packed
inverse (milliseconds rather than microseconds), but with no limit from :math:`n^2`.
Memory:
:math:`\Phi_X` is read from the kernel's own rows where it holds them (the same walks,
since walks are keyed by start node) instead of being sampled again; and the walks of a
chunk are sampled in blocks of about :data:`WALK_ENTRIES` walk steps, so the memory of the
walks being sampled grows with neither the walker count nor the chunk size.

An exact graph GP (:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`,
:class:`~gp_couple.kernels.exact_graph.ExactGraphKernel`) is streamed by
:class:`ExactStreamedPredictor`: the same posterior with :math:`\mathbf A = s\,\mathbf K_{XX}
+ \sigma_n^2\mathbf I` factorised once by a dense float64 Cholesky factor
:math:`\mathbf L`, and each block of prediction nodes' cross-covariance
:math:`\mathbf k_v = s\,\mathbf K_{Xv}` and prior variance computed by the kernel in float64,

.. math::

    \mu_v = \mu + \mathbf k_v^\top\mathbf A^{-1}(\mathbf y - \mu), \qquad
    \sigma^2_v = s\,K_{vv} - \|\mathbf L^{-1}\mathbf k_v\|^2 \;(+\,\sigma_n^2).

Across processes (:mod:`gp_couple.distributed`), chunk :math:`i` is predicted by rank
:math:`i \bmod P`; rank 0 gathers the chunks in order and writes the file. Both
predictors share that machinery (:class:`StreamedPosterior`).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator
from typing import Any

import gpytorch
import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch
from numba import njit, prange
from threadpoolctl import threadpool_limits

from ._checks import check_int
from ._files import PathLike, atomic_write, check_output_file
from ._nodes import node_index_array
from .distributed import Collective
from .features.graph_random_features import GraphRandomFeatures
from .kernels.graph_node import GraphNodeKernel
from .kernels.grf_kernel import GRFKernel
from .predictive_variance import DENSE_VARIANCE_SIZE
from .progress import progress
from .sparse_factor import SparseFactor

__all__ = ["CROSS_ENTRIES", "DEFAULT_CHUNK_SIZE", "WALK_ENTRIES", "ExactStreamedPredictor", "StreamedPosterior",
           "StreamedPredictor"]

#: Prediction nodes per chunk: the unit shared among the processes and gathered.
DEFAULT_CHUNK_SIZE = 4096
#: Walk steps (nodes x walkers x expected steps per walk) sampled at once when predicting.
WALK_ENTRIES = 1 << 22
#: Entries of an exact kernel's cross-covariance block (prediction nodes x observed nodes) formed at once.
CROSS_ENTRIES = 1 << 22
#: Training rows of the covariance formed at once.
_GRAM_BLOCK = 512
#: LAPACK's rectangular full packed format: not transposed, lower triangle.
_RFP = {"transr": "N", "uplo": "L"}


@njit(cache=True, inline="always")
def _packed_index(row, column, size, half):  # pragma: no cover - compiled
    """Position of entry ``(row, column)``, ``row >= column``, of a symmetric ``size x size`` matrix (``size``
    even, ``half = size // 2``) in LAPACK's rectangular full packed format (``TRANSR='N'``, ``UPLO='L'``)."""
    if column < half:
        return (size + 1) * column + row + 1
    return (size + 1) * (row - half) + column - half


@njit(cache=True)
def _pack_rows(block, first, size, half, packed):  # pragma: no cover - compiled
    """Write the lower triangle of rows ``first, first + 1, ...`` (``block``) of a symmetric matrix into ``packed``."""
    for r in range(block.shape[0]):
        row = first + r
        for column in range(row + 1):
            packed[_packed_index(row, column, size, half)] = block[r, column]


@njit(parallel=True, cache=True)
def _quadratic_forms(indptr, indices, data, packed, size, half, out):  # pragma: no cover - compiled
    """``out[r] = k_r^T M k_r`` for the sorted sparse rows ``k_r`` of a CSR matrix, ``M`` symmetric in the
    rectangular full packed format (one row per iteration: each result depends on its row only)."""
    for r in prange(indptr.size - 1):
        lo, hi = indptr[r], indptr[r + 1]
        total = 0.0
        for a in range(lo, hi):
            row = indices[a]
            inner = packed[_packed_index(row, row, size, half)] * data[a]
            for b in range(lo, a):
                inner += 2.0 * packed[_packed_index(row, indices[b], size, half)] * data[b]
            total += data[a] * inner
        out[r] = total


def _grf_parts(model: Any) -> tuple[GRFKernel, float]:
    """The GRF kernel of ``model`` and its output scale."""
    covariance = model.covar_module
    scale = 1.0
    if isinstance(covariance, gpytorch.kernels.ScaleKernel):
        scale = float(covariance.outputscale.detach().reshape(-1)[0]) if covariance.outputscale.numel() == 1 \
            else math.nan
        covariance = covariance.base_kernel
    if not isinstance(covariance, GRFKernel) or not math.isfinite(scale):
        raise TypeError("StreamedPredictor needs a model whose covar_module is a GRFKernel or a ScaleKernel of one "
                        f"(without batches), got {type(model.covar_module).__name__} (stream an exact graph kernel "
                        "with ExactStreamedPredictor)")
    return covariance, scale


def _constant_mean(model: Any) -> float:
    mean = model.mean_module
    if isinstance(mean, gpytorch.means.ZeroMean):
        return 0.0
    if isinstance(mean, gpytorch.means.ConstantMean) and mean.constant.numel() == 1:
        return float(mean.constant.detach().reshape(-1)[0])
    raise TypeError(f"StreamedPredictor needs a ZeroMean or ConstantMean, got {type(mean).__name__}")


def _lapack_info(routine: str, info: int) -> None:
    if info > 0:
        raise ValueError(f"the training covariance is not positive definite (LAPACK {routine} info {info}); "
                         "is the noise variance zero?")
    if info < 0:  # pragma: no cover - an argument error of the call itself
        raise RuntimeError(f"LAPACK {routine} refused argument {-info}")


class StreamedPosterior:
    r"""What every streamed predictor shares: the chunks, the processes and the output file.

    A subclass computes the standardised posterior of a block of nodes
    (:meth:`_predict_block`); this class maps it back to the data's units, shares the
    chunks among the processes (rank :math:`i \bmod P` predicts chunk :math:`i`) and
    writes them in order.

    :param model: The trained :class:`~gp_couple.models.GraphGP` (a ``ZeroMean`` or ``ConstantMean``).
    :param likelihood: Its :class:`gpytorch.likelihoods.GaussianLikelihood`.
    :param collective: The processes sharing the prediction nodes (default: the default
        process group, or this process alone).
    :param target_offset: Predictions are of :math:`(y - \text{offset}) / \text{scale}` when the
        model was trained on standardised targets: means are mapped back by
        ``offset + scale * mean``, variances by ``scale ** 2 * variance``.
    :param target_scale: See ``target_offset`` (positive).
    :raises TypeError: For another kind of mean or likelihood.
    :raises ValueError: For a non-finite offset or a scale that is not positive.
    """

    #: Nodes predicted at once (the memory of one block of their walks or cross-covariances).
    block_size: int

    def __init__(self, model: Any, likelihood: Any, *, collective: Collective | None = None,
                 target_offset: float = 0.0, target_scale: float = 1.0) -> None:
        if not isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
            raise TypeError(f"likelihood must be a GaussianLikelihood, got {type(likelihood).__name__}")
        if not (math.isfinite(target_offset) and math.isfinite(target_scale) and target_scale > 0):
            raise ValueError(f"target_offset must be finite and target_scale positive, got {target_offset!r} and "
                             f"{target_scale!r}")
        self.target_offset, self.target_scale = float(target_offset), float(target_scale)
        self.mean = _constant_mean(model)
        self.noise = float(likelihood.noise.detach().reshape(-1)[0])
        self.collective = Collective() if collective is None else collective

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph."""
        raise NotImplementedError

    def _predict_block(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means and latent variances (standardised) at ``nodes``, at most :attr:`block_size` of them."""
        raise NotImplementedError

    def _prepare(self, nodes: np.ndarray | range) -> None:
        """Called by every process before :meth:`predict_all` or :meth:`write` predicts ``nodes``
        (collectives allowed); nothing by default."""

    def predict(self, nodes: Any, *, noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances at ``nodes`` (float64), computed here (no collectives).

        :param nodes: Node indices (any number; their walks are sampled :attr:`block_size` nodes at a time).
        :param noise: Variances of noisy observations (``True``) or of the latent function.
        :return: ``(mean, variance)``, each of shape ``(len(nodes),)``.
        :raises ValueError: For node indices outside the graph.
        """
        index = node_index_array(nodes, "nodes", self.num_nodes)
        return self._predict(index, noise)

    def _predict(self, nodes: np.ndarray, noise: bool) -> tuple[np.ndarray, np.ndarray]:
        mean, variance = np.empty(nodes.size), np.empty(nodes.size)
        for start in range(0, nodes.size, self.block_size):
            part = slice(start, start + self.block_size)
            mean[part], variance[part] = self._predict_block(nodes[part])
        if noise:
            variance += self.noise
        return self.target_offset + self.target_scale * mean, self.target_scale ** 2 * variance

    def _rounds(self, nodes: np.ndarray | range, chunk_size: int, noise: bool) -> Iterator[list[np.ndarray]]:
        """Chunk by chunk, in order, every rank's share gathered: rank ``i mod P`` predicts chunk ``i``."""
        num_chunks = math.ceil(len(nodes) / chunk_size)
        size = self.collective.size
        for first in progress(range(0, num_chunks, size), description="predicting",
                              total=math.ceil(num_chunks / size), unit="round"):
            start = (first + self.collective.rank) * chunk_size
            chunk = nodes[start:start + chunk_size]  # empty past the last chunk
            if isinstance(chunk, range):
                chunk = np.arange(chunk.start, chunk.stop, dtype=np.int64)
            yield [block for block in self._gathered(chunk, noise) if block.shape[0]]

    def _gathered(self, chunk: np.ndarray, noise: bool) -> list[np.ndarray]:
        mean, variance = self._predict(chunk, noise)
        block = torch.from_numpy(np.stack([mean, variance], axis=1)).to(self.collective.device)
        return [part.cpu().numpy() for part in self.collective.all_gather(block)]

    def predict_all(self, nodes: Any = None, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                    noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances at ``nodes`` (default: every node), chunk by chunk, shared by the processes.

        Every process must call it with the same arguments and gets the whole result.

        :param nodes: Node indices (default: all nodes in order).
        :param chunk_size: Nodes per chunk, the unit shared among the processes (their walks are
            sampled :attr:`block_size` nodes at a time, whatever the chunk size).
        :param noise: Variances of noisy observations or of the latent function.
        :return: ``(mean, variance)`` in the order of ``nodes``.
        """
        index = self._prediction_nodes(nodes, chunk_size, noise)
        self._prepare(index)
        blocks = [block for round_blocks in self._rounds(index, int(chunk_size), noise) for block in round_blocks]
        result = np.concatenate(blocks) if blocks else np.zeros((0, 2))
        return result[:, 0], result[:, 1]

    def write(self, path: PathLike, nodes: Any = None, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
              noise: bool = True) -> None:
        """Write the predictions at ``nodes`` (default: every node) to a ``.npy`` file, chunk by chunk.

        The file holds a float64 array of shape ``(len(nodes), 2)``: column 0 the means,
        column 1 the variances, row ``i`` for ``nodes[i]`` (row ``v`` for node ``v`` by
        default). Read it with ``numpy.load(path, mmap_mode="r")``. Rank 0 writes it
        atomically (a temporary file in the same folder, renamed at the end); memory does
        not grow with the number of nodes. Every process must call
        it with the same arguments.

        :param path: The ``.npy`` file (checked before any work; missing folders are created).
        :param nodes: Node indices (default: all nodes in order).
        :param chunk_size: Nodes per chunk, the unit shared among the processes.
        :param noise: Variances of noisy observations or of the latent function.
        :raises ValueError: If ``path`` does not end in ``.npy``, is a folder, or its folder cannot be written.
        """
        if not os.fspath(path).endswith(".npy"):
            raise ValueError(f"path must name a .npy file, got {os.fspath(path)!r}")
        writer = self.collective.rank == 0
        if writer:
            check_output_file(path, "path").resolve().parent.mkdir(parents=True, exist_ok=True)
        index = self._prediction_nodes(nodes, chunk_size, noise)
        self._prepare(index)
        if not writer:
            for _ in self._rounds(index, int(chunk_size), noise):
                pass
            self.collective.barrier()
            return
        with atomic_write(path, "wb") as handle:
            np.lib.format.write_array_header_2_0(
                handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float64)), "fortran_order": False,
                         "shape": (len(index), 2)})
            for blocks in self._rounds(index, int(chunk_size), noise):
                for block in blocks:
                    handle.write(np.ascontiguousarray(block, dtype=np.float64).tobytes())
        self.collective.barrier()

    def _prediction_nodes(self, nodes: Any, chunk_size: int, noise: bool) -> np.ndarray | range:
        """The validated nodes (every node: a ``range``, so that no array grows with the graph)."""
        check_int("chunk_size", chunk_size, 1)
        if not isinstance(noise, bool):
            raise TypeError(f"noise must be a bool, got {type(noise).__name__}")
        index = range(self.num_nodes) if nodes is None else node_index_array(nodes, "nodes", self.num_nodes)
        ends = (int(index[0]), int(index[-1])) if len(index) else (0, 0)
        self.collective.check_same("prediction nodes", (len(index), *ends, int(chunk_size), noise))
        return index


class StreamedPredictor(StreamedPosterior):
    r"""Posterior means and variances of a trained GRF-GP, for nodes streamed in chunks.

    Built once from the trained model (the training side: one float64 factorisation of
    :math:`\mathbf A` and the weights :math:`\mathbf w`), then :meth:`predict` any nodes,
    or :meth:`write` the predictions at every node (or any set) to a ``.npy`` file.
    The features of the observed nodes are the kernel's own rows where it holds them in
    float64 (walks are keyed by start node, so they equal a fresh draw), sampled
    otherwise (the other processes' rows of a
    :class:`~gp_couple.kernels.sharded_grf.ShardedGRFKernel`, or a float32 kernel's).

    :param model: A trained :class:`~gp_couple.models.GraphGP` whose covariance is a
        :class:`~gp_couple.kernels.grf_kernel.GRFKernel` (or a ``ScaleKernel`` of one), with a
        ``ZeroMean`` or ``ConstantMean``; prediction walks follow the kernel's current
        configuration and seed (call :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction`
        first for the recommended σ-coupled walkers).
    :param likelihood: Its :class:`gpytorch.likelihoods.GaussianLikelihood`.
    :param collective: See :class:`StreamedPosterior`.
    :param target_offset: See :class:`StreamedPosterior`.
    :param target_scale: See :class:`StreamedPosterior`.
    :param release_kernel_walks: Free the kernel's walks once the observed nodes' features are
        read from them, before the training side is factorised, so that the two never take
        memory together. For a model that is only predicted from: the kernel (which needs a
        ``release_walks`` method, e.g. :class:`~gp_couple.kernels.sharded_grf.ShardedGRFKernel`)
        then evaluates nothing until it is resampled.
    :raises TypeError: For another kind of model, mean or likelihood, or ``release_kernel_walks``
        with a kernel that cannot release its walks.
    """

    def __init__(self, model: Any, likelihood: Any, *, collective: Collective | None = None,
                 target_offset: float = 0.0, target_scale: float = 1.0, release_kernel_walks: bool = False) -> None:
        super().__init__(model, likelihood, collective=collective, target_offset=target_offset,
                         target_scale=target_scale)
        self.kernel, self.outputscale = _grf_parts(model)
        if release_kernel_walks and not callable(getattr(self.kernel, "release_walks", None)):
            raise TypeError(f"release_kernel_walks needs a kernel with release_walks (a ShardedGRFKernel), got "
                            f"{type(self.kernel).__name__}")
        train = model.train_inputs[0].detach().reshape(-1).cpu().numpy().astype(np.int64)
        targets = model.train_targets.detach().double().cpu().numpy()
        #: Nodes whose walks are sampled at once (about :data:`WALK_ENTRIES` walk steps).
        self.block_size = max(1, int(WALK_ENTRIES * self.kernel.p_halt / self.kernel.num_walkers))
        with torch.no_grad():
            features, reused = self._training_features(train)
        #: Rows of the training features taken from the kernel's own walks (the others were sampled).
        self.reused_rows = reused
        if release_kernel_walks:
            self.kernel.release_walks()
        #: The nodes the training walks touch (sorted): the columns of the training features.
        self.touched = np.unique(features.indices)
        compact = np.searchsorted(self.touched, features.indices).astype(features.indices.dtype)
        features = sp.csr_matrix((features.data, compact, features.indptr), shape=(train.size, self.touched.size))
        del compact
        # Phi_X^T by rows, the only copy kept: the covariance by row blocks (so the sparse product never
        # exists whole) and the cross-covariances of the prediction chunks.
        self._train_columns = features.T.tocsr()
        self._train_columns.sort_indices()
        del features
        residual = targets - self.mean
        #: The sparse LU factor of A above :data:`DENSE_VARIANCE_SIZE` observed nodes (else ``None``).
        self.train_factor: SparseFactor | None = None
        #: :math:`\mathbf A^{-1}` in LAPACK's rectangular full packed format (lower triangle, not
        #: transposed) up to :data:`DENSE_VARIANCE_SIZE` observed nodes (else ``None``).
        self.train_precision: np.ndarray | None = None
        if train.size > DENSE_VARIANCE_SIZE:
            covariance = self.outputscale * (self._train_columns.T @ self._train_columns) \
                + self.noise * sp.identity(train.size, format="csr")
            self.train_factor = SparseFactor(covariance)
            del covariance
            self.weights = self.outputscale * (self._train_columns @ self.train_factor.solve(residual))
        else:
            self._dense_training_side(residual)

    def _dense_training_side(self, residual: np.ndarray) -> None:
        """:attr:`train_precision` and :attr:`weights` from a packed float64 Cholesky factor of A."""
        size = residual.size
        # A^{-1} in the rectangular full packed format: n(n+1)/2 numbers (n padded to even with a unit
        # diagonal entry, which leaves the rest of the inverse unchanged), factorised and inverted in place.
        self._packed_size = size + size % 2
        self._half = self._packed_size // 2
        packed = np.empty(self._packed_size * (self._packed_size + 1) // 2)
        for start in range(0, size, _GRAM_BLOCK):
            block = (self._train_columns[:, start:start + _GRAM_BLOCK].T.tocsr() @ self._train_columns).toarray()
            block *= self.outputscale
            diagonal = np.arange(block.shape[0])
            block[diagonal, start + diagonal] += self.noise
            _pack_rows(block, start, self._packed_size, self._half, packed)
        if self._packed_size > size:
            unit = np.zeros((1, self._packed_size))
            unit[0, -1] = 1.0
            _pack_rows(unit, size, self._packed_size, self._half, packed)
        # One BLAS thread: threaded LAPACK factorises and inverts in blocks whose order depends on the
        # thread count, so its last bits would follow the pools (which the commands size by the
        # machine's load), and predictions would differ between runs with the same seed.
        with threadpool_limits(limits=1, user_api="blas"):
            factor, info = scipy.linalg.lapack.dpftrf(self._packed_size, packed, overwrite_a=True, **_RFP)
            _lapack_info("pftrf", info)
            padded = np.zeros((self._packed_size, 1))
            padded[:size, 0] = residual
            alpha, info = scipy.linalg.lapack.dpftrs(self._packed_size, factor, padded, overwrite_b=True, **_RFP)
            _lapack_info("pftrs", info)
            self.train_precision, info = scipy.linalg.lapack.dpftri(self._packed_size, factor, overwrite_a=True,
                                                                     **_RFP)
            _lapack_info("pftri", info)
        self.weights = self.outputscale * (self._train_columns @ alpha[:size, 0])

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph."""
        return self.kernel.num_nodes

    def _training_features(self, train: np.ndarray) -> tuple[sp.csr_matrix, int]:
        """:math:`\\Phi_X` (float64 CSR over all graph nodes) and how many of its rows are the kernel's own.

        The kernel's rows of float64 walks are used as they are; the other training nodes are sampled.
        """
        held = self.kernel.features
        starts = held.start_nodes.cpu().numpy()
        position = np.full(train.size, -1, dtype=np.int64)
        if held.dtype == torch.float64 and starts.size:
            order = np.argsort(starts, kind="stable")
            slot = np.minimum(np.searchsorted(starts[order], train), starts.size - 1)
            found = starts[order][slot] == train
            position[found] = order[slot[found]]
        found = position >= 0
        missing = train[~found]
        pieces = [self._feature_matrix(held, position[found])] if found.any() else []
        pieces += [self._features(missing[start:start + self.block_size])
                   for start in range(0, missing.size, self.block_size)]
        features = sp.vstack(pieces, format="csr") if len(pieces) > 1 else pieces[0]
        stacked = np.concatenate([np.flatnonzero(found), np.flatnonzero(~found)])
        if np.any(stacked != np.arange(train.size)):
            features = features[np.argsort(stacked)]
        return features, int(found.sum())

    def _feature_matrix(self, features: GraphRandomFeatures, rows: np.ndarray | None = None) -> sp.csr_matrix:
        r"""Rows ``rows`` (default all) of :math:`\Phi` of sampled walks at the kernel's hyperparameters."""
        modulation = self.kernel.kernel_family.modulation(features.num_terms)
        return features.scipy_feature_matrix(modulation.reshape(-1, modulation.shape[-1])[0], rows)

    def _features(self, nodes: np.ndarray) -> sp.csr_matrix:
        """:math:`\\Phi` of ``nodes`` (float64 CSR over all graph nodes), from the kernel's walk configuration."""
        return self._feature_matrix(self.kernel.sample_features(nodes, torch.float64))

    def _restricted(self, features: sp.csr_matrix) -> sp.csr_matrix:
        """The columns of ``features`` that training walks touched, in the compact order of :attr:`touched`."""
        position = np.searchsorted(self.touched, features.indices)
        position = np.minimum(position, self.touched.size - 1)
        keep = self.touched[position] == features.indices
        kept = np.zeros(keep.size + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        return sp.csr_matrix((features.data[keep], position[keep], kept[features.indptr]),
                             shape=(features.shape[0], self.touched.size))

    def _predict_block(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means and latent variances (standardised) at ``nodes``, whose walks are sampled at once."""
        with torch.no_grad():
            features = self._features(nodes)
        prior = self.outputscale * np.asarray(features.multiply(features).sum(axis=1)).reshape(-1)
        restricted = self._restricted(features)
        del features
        mean = self.mean + restricted @ self.weights
        cross = (restricted @ self._train_columns).tocsr()
        cross.sort_indices()
        if self.train_factor is not None:
            quadratic = self.train_factor.inverse_quadratic_forms(cross * self.outputscale)
        else:
            quadratic = np.empty(nodes.size)
            _quadratic_forms(cross.indptr.astype(np.int64), cross.indices.astype(np.int64),
                             cross.data * self.outputscale, self.train_precision, self._packed_size, self._half,
                             quadratic)
        return mean, np.maximum(prior - quadratic, 0.0)


class ExactStreamedPredictor(StreamedPosterior):
    r"""Posterior means and variances of a trained exact graph GP, for nodes streamed in chunks.

    For a kernel that is not a GRF kernel: :class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`,
    :class:`~gp_couple.kernels.exact_graph.ExactGraphKernel` or any other
    :class:`~gp_couple.kernels.graph_node.GraphNodeKernel`. Built once from the trained model
    (a float64 copy of it, and one dense float64 Cholesky factor :math:`\mathbf L` of
    :math:`\mathbf A = s\,\mathbf K_{XX} + \sigma_n^2\mathbf I` with the weights
    :math:`\mathbf w = \mathbf A^{-1}(\mathbf y - \mu)`). The posterior at node :math:`v` is

    .. math::

        \mu + \mathbf k_v^\top\mathbf w, \qquad
        s\,k(v, v) - \|\mathbf L^{-1}\mathbf k_v\|^2,
        \qquad \mathbf k_v = s\,\mathbf K_{X v}.

    :meth:`predict` computes it block by block (:attr:`block_size` nodes: their
    cross-covariances and prior variances from the kernel, a triangular solve with
    :math:`\mathbf L`); a block's numbers depend on the block alone. :meth:`predict_all`
    and :meth:`write` of more than one block first compute the means and the quadratic
    forms of every node of the graph (two numbers per node, kept in :attr:`node_terms`) in
    one pass over the observed nodes instead: the
    products of the kernel's cross-covariance :math:`s\,\mathbf K_{\cdot X}` (every node
    against the observed ones, never dense) with :math:`\mathbf w` and with
    :math:`\mathbf L^{-\top}`, a block of columns at a time, the blocks shared among the
    processes (their sums of squares all-reduced). For a
    :class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel` that costs one Chebyshev
    recurrence on :math:`n + 1` columns, rather than one on :math:`n` columns per block of
    prediction nodes, and :math:`\mathbf L^{-1}` (:math:`n^2` numbers more, while the pass
    runs); only the prior variances are then computed chunk by chunk. Results
    agree whatever the number of processes, to rounding (the sums of squares are summed in
    another order).

    :param model: A trained :class:`~gp_couple.models.GraphGP` (no batches) whose covariance
        is a graph kernel other than a GRF kernel (or a ``ScaleKernel`` of one), with a
        ``ZeroMean`` or ``ConstantMean``; it is left as it is.
    :param likelihood: Its :class:`gpytorch.likelihoods.GaussianLikelihood`.
    :param collective: See :class:`StreamedPosterior`.
    :param target_offset: See :class:`StreamedPosterior`.
    :param target_scale: See :class:`StreamedPosterior`.
    :raises TypeError: For a GRF kernel (stream it with :class:`StreamedPredictor`), a kernel
        that is not a graph kernel, or another kind of mean or likelihood.
    :raises ValueError: Above :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE`
        observed nodes, or for a training covariance that is not positive definite.
    """

    def __init__(self, model: Any, likelihood: Any, *, collective: Collective | None = None,
                 target_offset: float = 0.0, target_scale: float = 1.0) -> None:
        super().__init__(model, likelihood, collective=collective, target_offset=target_offset,
                         target_scale=target_scale)
        covariance = model.covar_module
        base = covariance.base_kernel if isinstance(covariance, gpytorch.kernels.ScaleKernel) else covariance
        if isinstance(base, GRFKernel):
            raise TypeError("ExactStreamedPredictor streams exact graph kernels; stream a GRF kernel with "
                            "StreamedPredictor")
        train = model.train_inputs[0]
        if not isinstance(base, GraphNodeKernel) or train.dim() != 2 or base.batch_shape.numel() != 1:
            raise TypeError("ExactStreamedPredictor needs a model whose covar_module is a graph kernel (a "
                            "GraphNodeKernel, e.g. MatrixFreeGraphKernel) or a ScaleKernel of one, without batches; "
                            f"got {type(covariance).__name__} of {type(base).__name__}")
        if train.shape[0] > DENSE_VARIANCE_SIZE:
            raise ValueError(f"ExactStreamedPredictor factorises the training covariance densely: at most "
                             f"{DENSE_VARIANCE_SIZE} observed nodes, got {train.shape[0]}")
        #: The graph kernel (with its output scale) in float64: a copy, so the caller's model is left as it is.
        self.covariance = copy.deepcopy(covariance).double()
        self._num_nodes = base.num_nodes
        self._train_inputs = train.detach().double()
        with torch.no_grad():
            gram = self.covariance(self._train_inputs, self._train_inputs).to_dense().cpu().numpy()
        gram[np.diag_indices_from(gram)] += self.noise
        residual = model.train_targets.detach().double().cpu().numpy() - self.mean
        # One BLAS thread, as for the GRF predictor: the factor's last bits then follow neither the pools nor the load.
        with threadpool_limits(limits=1, user_api="blas"):
            try:
                #: The lower Cholesky factor of :math:`\mathbf A` (float64).
                self.train_factor = scipy.linalg.cholesky(gram, lower=True, overwrite_a=True, check_finite=False)
            except np.linalg.LinAlgError as error:
                raise ValueError("the training covariance is not positive definite; is the noise variance "
                                 "zero?") from error
            self.weights = scipy.linalg.cho_solve((self.train_factor, True), residual, check_finite=False)
        self.block_size = max(1, CROSS_ENTRIES // max(1, train.shape[0]))
        #: Means and quadratic forms :math:`\|\mathbf L^{-1}\mathbf k_v\|^2` of every node
        #: (standardised), once :meth:`predict_all` or :meth:`write` computed them.
        self.node_terms: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph."""
        return self._num_nodes

    def _prepare(self, nodes: np.ndarray | range) -> None:
        if self.node_terms is None and len(nodes) > self.block_size:
            self.node_terms = self._every_node_terms()

    def _every_node_terms(self) -> tuple[np.ndarray, np.ndarray]:
        r"""Means :math:`\mathbf k_v^\top\mathbf w` and :math:`\|\mathbf L^{-1}\mathbf k_v\|^2` of every node."""
        device = self._train_inputs.device
        every = torch.arange(self._num_nodes, dtype=torch.float64, device=device).unsqueeze(-1)
        with threadpool_limits(limits=1, user_api="blas"):
            inverse, info = scipy.linalg.lapack.dtrtri(self.train_factor, lower=1)
        _lapack_info("dtrtri", info)
        size = self._train_inputs.shape[0]
        width = max(1, CROSS_ENTRIES // self._num_nodes)
        starts = range(0, size, width)[self.collective.rank::self.collective.size]
        squares = torch.zeros(self._num_nodes, dtype=torch.float64, device=device)
        with torch.no_grad():
            cross = self.covariance(every, self._train_inputs).evaluate_kernel()  # s K_{.X}, lazily
            means = cross.matmul(torch.as_tensor(self.weights, device=device).unsqueeze(-1)).squeeze(-1)
            # Row v of K_{.X} L^{-T} is (L^{-1} k_v)^T; columns [start, start + width) are rows of L^{-1}.
            for start in progress(starts, description="cross-covariances", unit="block"):
                rows = torch.as_tensor(np.ascontiguousarray(inverse[start:start + width].T), device=device)
                squares += cross.matmul(rows).square().sum(-1)
        squares = self.collective.all_reduce(squares.to(self.collective.device))
        return means.cpu().numpy(), squares.cpu().numpy()

    def _predict_block(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = torch.as_tensor(nodes, dtype=torch.float64, device=self._train_inputs.device).unsqueeze(-1)
        with torch.no_grad():
            prior = self.covariance(inputs, diag=True).cpu().numpy()
            if self.node_terms is not None:
                means, squares = self.node_terms
                return self.mean + means[nodes], np.maximum(prior - squares[nodes], 0.0)
            cross = self.covariance(inputs, self._train_inputs).to_dense().cpu().numpy()
        whitened = scipy.linalg.solve_triangular(self.train_factor, cross.T, lower=True, check_finite=False)
        quadratic = np.einsum("ij,ij->j", whitened, whitened)
        return self.mean + cross @ self.weights, np.maximum(prior - quadratic, 0.0)
