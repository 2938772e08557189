r"""Exact graph-kernel references.

* :func:`exact_kernel_matrix`: the dense :math:`N \times N` kernel from one symmetric
  eigendecomposition of :math:`\widetilde{\mathbf W}` (cached per graph), as
  :math:`U g_\theta(\Lambda) U^\top`. Only :math:`g_\theta` depends on the
  hyperparameters, so the result is cheap to recompute and differentiable in torch.
  Practical up to :math:`N \approx 10^4`.
* :func:`exact_kernel_columns`: columns :math:`\mathbf K[:, S]` of large graphs without
  forming :math:`\mathbf K`, through each family's
  :meth:`~gp_couple.kernel_families.KernelFamily.apply_exact`
  (``scipy.sparse.linalg.expm_multiply`` for diffusion and cosine, sparse LU solves for
  the regularised Laplacian, sparse products for p-step and general series). The
  ``expm_multiply`` products have errors of about :math:`5\cdot 10^{-9}\|\mathbf v\|_2`
  (diffusion, :math:`\gamma = 3`, measured by ``benchmarks/bench_matrix_free.py``).

For differentiable products, blocks and diagonals of the exact kernel on graphs too large
for the dense reference, see :class:`gp_couple.kernels.MatrixFreeGraphKernel` (Chebyshev
recurrences with a stated truncation bound).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .graphs import Graph
from .kernel_families import KernelFamily

__all__ = ["normalized_adjacency_eigh", "exact_kernel_matrix", "exact_kernel_columns",
           "DENSE_LIMIT"]

#: Largest graph for which :func:`exact_kernel_matrix` runs without ``force=True``.
DENSE_LIMIT = 20_000


def _check_graph(graph: Any) -> Graph:
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    return graph


def normalized_adjacency_eigh(graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Eigenvalues and eigenvectors of :math:`\widetilde{\mathbf W}` in float64 (cached on the graph)."""
    graph = _check_graph(graph)

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        dense = torch.from_numpy(graph.normalized_adjacency().toarray())
        return torch.linalg.eigh(dense)

    return graph.derived("normalized_adjacency_eigh", build)


def exact_kernel_matrix(kernel_family: KernelFamily, graph: Graph, *, force: bool = False) -> torch.Tensor:
    r"""Dense exact kernel :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` as a float64 tensor.

    Differentiable with respect to the family's hyperparameters; batched
    hyperparameters give a ``(*batch, N, N)`` result.

    :param kernel_family: The kernel family and its hyperparameters.
    :param graph: The graph.
    :param force: Allow graphs larger than :data:`DENSE_LIMIT` nodes.
    """
    graph = _check_graph(graph)
    if not isinstance(kernel_family, KernelFamily):
        raise TypeError(f"kernel_family must be a KernelFamily, got {type(kernel_family).__name__}")
    if graph.num_nodes > DENSE_LIMIT and not force:
        raise ValueError(
            f"a dense kernel on {graph.num_nodes} nodes needs {graph.num_nodes**2 * 8 / 1e9:.1f} GB; "
            "use exact_kernel_columns, or pass force=True")
    eigenvalues, eigenvectors = normalized_adjacency_eigh(graph)
    # float64 eigenvalues promote float32 hyperparameters: the reference stays float64,
    # on the CPU with the eigenvectors whatever the hyperparameters' device.
    parameter = next(kernel_family.parameters(), None)
    device = eigenvalues.device if parameter is None else parameter.device
    spectrum = kernel_family.spectrum(eigenvalues.to(device)).to(device=eigenvectors.device, dtype=torch.float64)
    return (eigenvectors * spectrum.unsqueeze(-2)) @ eigenvectors.T


def exact_kernel_columns(kernel_family: KernelFamily, graph: Graph, columns: Any) -> np.ndarray:
    r"""Exact columns :math:`\mathbf K[:, S]` (float64 numpy, shape ``(N, |S|)``) without forming :math:`\mathbf K`.

    :param kernel_family: The kernel family (unbatched hyperparameters).
    :param graph: The graph.
    :param columns: Node indices :math:`S`.
    """
    graph = _check_graph(graph)
    index = np.asarray(columns)
    if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
        raise TypeError("columns must be a 1-D integer array of node indices")
    if index.size and (index.min() < 0 or index.max() >= graph.num_nodes):
        raise ValueError(f"columns must lie in [0, {graph.num_nodes})")
    block = np.zeros((graph.num_nodes, index.size))
    block[index, np.arange(index.size)] = 1.0
    with torch.no_grad():
        return np.asarray(kernel_family.apply_exact(graph.normalized_adjacency(), block), dtype=np.float64)
