r"""Predictions of a trained GRF-GP at any number of nodes, chunk by chunk, on one or many processes.

A GRF-GP's cost follows the observed and predicted nodes, not the graph, but the
features of every predicted node are still too many to hold at once on a large graph
(thousands of entries per node). :class:`StreamedPredictor` holds only what the training
side needs and samples the walks of each chunk of prediction nodes on the fly, from the
trained kernel's configuration and seed. Walks are keyed by their start node
(:func:`gp_couple.features.walks.sample_walk_lengths`), so a node's prediction is the same
whatever the chunk size, the order and the number of processes, and equals what the
in-memory model (:func:`gp_couple.models.predict`) gives at the kernel's rows.

With :math:`\mathbf A = s\,\Phi_X\Phi_X^\top + \sigma_n^2\mathbf I` on the :math:`n`
observed nodes (``s`` the output scale), factorised once in float64 (exact up to
:data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` observed nodes), and
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

Across processes (:mod:`gp_couple.distributed`), chunk :math:`i` is predicted by rank
:math:`i \bmod P`; rank 0 gathers the chunks in order and writes the file.
"""

from __future__ import annotations

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

from ._checks import check_int
from ._files import PathLike, atomic_write, check_output_file
from ._nodes import node_index_array
from .distributed import Collective
from .kernels.grf_kernel import GRFKernel
from .predictive_variance import DENSE_VARIANCE_SIZE
from .progress import progress

__all__ = ["DEFAULT_CHUNK_SIZE", "StreamedPredictor"]

#: Prediction nodes whose walks are sampled at once.
DEFAULT_CHUNK_SIZE = 4096
#: Training rows of the covariance formed at once.
_GRAM_BLOCK = 512


@njit(parallel=True, cache=True)
def _quadratic_forms(indptr, indices, data, lower, out):  # pragma: no cover - compiled
    """``out[r] = k_r^T M k_r`` for the sorted sparse rows ``k_r`` of a CSR matrix, ``M`` symmetric given by
    its ``lower`` triangle (one row per iteration: each result depends on its row only)."""
    for r in prange(indptr.size - 1):
        lo, hi = indptr[r], indptr[r + 1]
        total = 0.0
        for a in range(lo, hi):
            row = lower[indices[a]]
            inner = row[indices[a]] * data[a]
            for b in range(lo, a):
                inner += 2.0 * row[indices[b]] * data[b]
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
                        f"(without batches), got {type(model.covar_module).__name__}")
    return covariance, scale


def _constant_mean(model: Any) -> float:
    mean = model.mean_module
    if isinstance(mean, gpytorch.means.ZeroMean):
        return 0.0
    if isinstance(mean, gpytorch.means.ConstantMean) and mean.constant.numel() == 1:
        return float(mean.constant.detach().reshape(-1)[0])
    raise TypeError(f"StreamedPredictor needs a ZeroMean or ConstantMean, got {type(mean).__name__}")


class StreamedPredictor:
    r"""Posterior means and variances of a trained GRF-GP, for nodes streamed in chunks.

    Built once from the trained model (the training side: one float64 factorisation of
    :math:`\mathbf A` and the weights :math:`\mathbf w`), then :meth:`predict` any nodes,
    or :meth:`write` the predictions at every node (or any set) to a ``.npy`` file.

    :param model: A trained :class:`~gp_couple.models.GraphGP` whose covariance is a
        :class:`~gp_couple.kernels.grf_kernel.GRFKernel` (or a ``ScaleKernel`` of one), with a
        ``ZeroMean`` or ``ConstantMean``; prediction walks follow the kernel's current
        configuration and seed (call :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction`
        first for the recommended σ-coupled walkers).
    :param likelihood: Its :class:`gpytorch.likelihoods.GaussianLikelihood`.
    :param collective: The processes sharing the prediction nodes (default: the default
        process group, or this process alone).
    :param target_offset: Predictions are of :math:`(y - \text{offset}) / \text{scale}` when the
        model was trained on standardised targets: means are mapped back by
        ``offset + scale * mean``, variances by ``scale ** 2 * variance``.
    :param target_scale: See ``target_offset`` (positive).
    :raises TypeError: For another kind of model, mean or likelihood.
    :raises ValueError: If the model has more than
        :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` observed nodes.
    """

    def __init__(self, model: Any, likelihood: Any, *, collective: Collective | None = None,
                 target_offset: float = 0.0, target_scale: float = 1.0) -> None:
        if not isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
            raise TypeError(f"likelihood must be a GaussianLikelihood, got {type(likelihood).__name__}")
        if not (math.isfinite(target_offset) and math.isfinite(target_scale) and target_scale > 0):
            raise ValueError(f"target_offset must be finite and target_scale positive, got {target_offset!r} and "
                             f"{target_scale!r}")
        self.target_offset, self.target_scale = float(target_offset), float(target_scale)
        self.kernel, self.outputscale = _grf_parts(model)
        self.mean = _constant_mean(model)
        self.noise = float(likelihood.noise.detach().reshape(-1)[0])
        self.collective = Collective() if collective is None else collective
        train = model.train_inputs[0].detach().reshape(-1).cpu().numpy().astype(np.int64)
        if train.size > DENSE_VARIANCE_SIZE:
            raise ValueError(f"streamed prediction factorises the training covariance densely; the model has "
                             f"{train.size} observed nodes, more than {DENSE_VARIANCE_SIZE}")
        targets = model.train_targets.detach().double().cpu().numpy()
        with torch.no_grad():
            features = self._features(train)
        self.touched = np.unique(features.indices)
        features = self._restricted(features)
        self.train_features = features
        # One n x n buffer: the covariance (filled by row blocks, so the sparse product never
        # exists whole), factorised and then inverted in place (LAPACK potrf, potri).
        precision = np.empty((train.size, train.size))
        transposed = features.T.tocsr()
        for start in range(0, train.size, _GRAM_BLOCK):
            precision[start:start + _GRAM_BLOCK] = (features[start:start + _GRAM_BLOCK] @ transposed).toarray()
        precision *= self.outputscale
        precision[np.diag_indices_from(precision)] += self.noise
        factor, info = scipy.linalg.lapack.dpotrf(precision, lower=True, overwrite_a=True, clean=False)
        if info:
            raise ValueError(f"the training covariance is not positive definite (LAPACK potrf info {info}); "
                             "is the noise variance zero?")
        alpha, _ = scipy.linalg.lapack.dpotrs(factor, targets - self.mean, lower=True)
        self.weights = self.outputscale * (features.T @ alpha)
        # Only the lower triangle is set (and read by the quadratic forms).
        self.train_precision, _ = scipy.linalg.lapack.dpotri(factor, lower=True, overwrite_c=True)

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph."""
        return self.kernel.num_nodes

    def _features(self, nodes: np.ndarray) -> sp.csr_matrix:
        """:math:`\\Phi` of ``nodes`` (float64 CSR over all graph nodes), from the kernel's walk configuration."""
        features = self.kernel.sample_features(nodes, torch.float64)
        modulation = self.kernel.kernel_family.modulation(features.num_terms)
        return features.scipy_feature_matrix(modulation.reshape(-1, modulation.shape[-1])[0])

    def _restricted(self, features: sp.csr_matrix) -> sp.csr_matrix:
        """The columns of ``features`` that training walks touched, in the compact order of :attr:`touched`."""
        position = np.searchsorted(self.touched, features.indices)
        position = np.minimum(position, self.touched.size - 1)
        keep = self.touched[position] == features.indices
        rows = np.repeat(np.arange(features.shape[0]), np.diff(features.indptr))
        return sp.csr_matrix((features.data[keep], (rows[keep], position[keep])),
                             shape=(features.shape[0], self.touched.size))

    def predict(self, nodes: Any, *, noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances at ``nodes`` (float64), computed here (no collectives).

        :param nodes: Node indices (any number; memory grows with their walks).
        :param noise: Variances of noisy observations (``True``) or of the latent function.
        :return: ``(mean, variance)``, each of shape ``(len(nodes),)``.
        :raises ValueError: For node indices outside the graph.
        """
        index = node_index_array(nodes, "nodes", self.num_nodes)
        return self._predict(index, noise)

    def _predict(self, nodes: np.ndarray, noise: bool) -> tuple[np.ndarray, np.ndarray]:
        if nodes.size == 0:
            return np.zeros(0), np.zeros(0)
        with torch.no_grad():
            features = self._features(nodes)
        prior = self.outputscale * np.asarray(features.multiply(features).sum(axis=1)).reshape(-1)
        restricted = self._restricted(features)
        mean = self.mean + restricted @ self.weights
        cross = (restricted @ self.train_features.T).tocsr()
        cross.sort_indices()
        quadratic = np.empty(nodes.size)
        _quadratic_forms(cross.indptr.astype(np.int64), cross.indices.astype(np.int64),
                         cross.data * self.outputscale, self.train_precision, quadratic)
        variance = np.maximum(prior - quadratic, 0.0) + (self.noise if noise else 0.0)
        return self.target_offset + self.target_scale * mean, self.target_scale ** 2 * variance

    def _rounds(self, nodes: np.ndarray, chunk_size: int, noise: bool) -> Iterator[list[np.ndarray]]:
        """Chunk by chunk, in order, every rank's share gathered: rank ``i mod P`` predicts chunk ``i``."""
        chunks = [nodes[start:start + chunk_size] for start in range(0, nodes.size, chunk_size)]
        size = self.collective.size
        for first in progress(range(0, len(chunks), size), description="predicting",
                              total=math.ceil(len(chunks) / size), unit="round"):
            mine = first + self.collective.rank
            yield [chunk for chunk in self._gathered(chunks[mine] if mine < len(chunks) else nodes[:0], noise)
                   if chunk.shape[0]]

    def _gathered(self, chunk: np.ndarray, noise: bool) -> list[np.ndarray]:
        mean, variance = self._predict(chunk, noise)
        block = torch.from_numpy(np.stack([mean, variance], axis=1)).to(self.collective.device)
        return [part.cpu().numpy() for part in self.collective.all_gather(block)]

    def predict_all(self, nodes: Any = None, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                    noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances at ``nodes`` (default: every node), chunk by chunk, shared by the processes.

        Every process must call it with the same arguments and gets the whole result.

        :param nodes: Node indices (default: all nodes in order).
        :param chunk_size: Nodes whose walks are sampled at once (bounds the memory).
        :param noise: Variances of noisy observations or of the latent function.
        :return: ``(mean, variance)`` in the order of ``nodes``.
        """
        index = self._prediction_nodes(nodes, chunk_size, noise)
        blocks = [block for round_blocks in self._rounds(index, int(chunk_size), noise) for block in round_blocks]
        result = np.concatenate(blocks) if blocks else np.zeros((0, 2))
        return result[:, 0], result[:, 1]

    def write(self, path: PathLike, nodes: Any = None, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
              noise: bool = True) -> None:
        """Write the predictions at ``nodes`` (default: every node) to a ``.npy`` file, chunk by chunk.

        The file holds a float64 array of shape ``(len(nodes), 2)``: column 0 the means,
        column 1 the variances, row ``i`` for ``nodes[i]`` (row ``v`` for node ``v`` by
        default). Read it with ``numpy.load(path, mmap_mode="r")``. Rank 0 writes it
        atomically (a temporary file in the same folder, renamed at the end); memory stays
        bounded by the chunk size whatever the number of nodes. Every process must call
        it with the same arguments.

        :param path: The ``.npy`` file (checked before any work; missing folders are created).
        :param nodes: Node indices (default: all nodes in order).
        :param chunk_size: Nodes whose walks are sampled at once.
        :param noise: Variances of noisy observations or of the latent function.
        :raises ValueError: If ``path`` does not end in ``.npy``, is a folder, or its folder cannot be written.
        """
        if not os.fspath(path).endswith(".npy"):
            raise ValueError(f"path must name a .npy file, got {os.fspath(path)!r}")
        writer = self.collective.rank == 0
        if writer:
            check_output_file(path, "path").resolve().parent.mkdir(parents=True, exist_ok=True)
        index = self._prediction_nodes(nodes, chunk_size, noise)
        if not writer:
            for _ in self._rounds(index, int(chunk_size), noise):
                pass
            self.collective.barrier()
            return
        with atomic_write(path, "wb") as handle:
            np.lib.format.write_array_header_2_0(
                handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float64)), "fortran_order": False,
                         "shape": (int(index.size), 2)})
            for blocks in self._rounds(index, int(chunk_size), noise):
                for block in blocks:
                    handle.write(np.ascontiguousarray(block, dtype=np.float64).tobytes())
        self.collective.barrier()

    def _prediction_nodes(self, nodes: Any, chunk_size: int, noise: bool) -> np.ndarray:
        check_int("chunk_size", chunk_size, 1)
        if not isinstance(noise, bool):
            raise TypeError(f"noise must be a bool, got {type(noise).__name__}")
        index = np.arange(self.num_nodes, dtype=np.int64) if nodes is None else \
            node_index_array(nodes, "nodes", self.num_nodes)
        self.collective.check_same("prediction nodes", (index.size, int(index[:1].sum()), int(index[-1:].sum()),
                                                        int(chunk_size), noise))
        return index
