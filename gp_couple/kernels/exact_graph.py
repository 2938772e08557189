r"""The exact graph kernel :class:`ExactGraphKernel`, the reference for graphs with a dense eigendecomposition.

It is the exact kernel :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` for small graphs,
with the same ``kernel_family`` submodule as
:class:`~gp_couple.kernels.grf_kernel.GRFKernel`, so state dicts transfer between the two
(e.g. train a GRF-GP, then load its hyperparameters into the exact GP to measure the KL
divergence to the true posterior, appendix on GRF-GP details, Appendix F.2 "Scalable GPs on graphs",
paragraph "Training GRF-GPs: technical details" [app:grf_gp_details]). The eigenvectors are copied
to an accelerator once, not per call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..exact import DENSE_LIMIT, normalized_adjacency_eigh
from ..graphs import Graph
from ..kernel_families import KernelFamily
from ._inputs import same_inputs
from .graph_node import GraphNodeKernel

__all__ = ["ExactGraphKernel"]


class ExactGraphKernel(GraphNodeKernel):
    r"""The exact graph kernel, for graphs small enough for a dense eigendecomposition.

    .. math::

        \mathbf K = \sum_k \alpha_k \widetilde{\mathbf W}^k = \mathbf U g_\theta(\Lambda)\mathbf U^\top .

    Uses one cached eigendecomposition of :math:`\widetilde{\mathbf W}`
    (:func:`gp_couple.exact.normalized_adjacency_eigh`, float64); each evaluation costs
    :math:`O(n_1 n_2 N)` in the kernel's dtype, like gpytorch's kernels (a float32 model
    computes in float32), and is differentiable in the hyperparameters. Same
    ``kernel_family`` submodule as :class:`~gp_couple.kernels.grf_kernel.GRFKernel`, so their state dicts transfer
    (``load_state_dict(..., strict=False)`` ignores the GRF walk buffers).

    :param graph: The graph (at most :data:`gp_couple.exact.DENSE_LIMIT` nodes unless ``force``).
    :param kernel_family: The kernel family (default :class:`~gp_couple.kernel_families.Diffusion`).
    :param batch_shape: Hyperparameter batch shape.
    :param force: Allow graphs above the dense limit.
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel`.
    """

    def __init__(self, graph: Graph, kernel_family: KernelFamily | None = None, *,
                 batch_shape: torch.Size = torch.Size(), force: bool = False, **kwargs: Any) -> None:
        super().__init__(graph, kernel_family, batch_shape=batch_shape, **kwargs)
        self._eigh_cache: dict[str, tuple[Tensor, Tensor]] = {}
        if graph.num_nodes > DENSE_LIMIT and not force:
            raise ValueError(f"ExactGraphKernel needs a dense eigendecomposition; the graph has "
                             f"{graph.num_nodes} > {DENSE_LIMIT} nodes. Use GRFKernel, or pass force=True")

    def _invalidate(self) -> None:
        super()._invalidate()
        self._eigh_cache.clear()

    def _copy_memo(self) -> dict[int, Any]:
        # Copies (hyperparameter batches) share the device copies of the eigenvectors.
        return {**super()._copy_memo(), id(self._eigh_cache): self._eigh_cache}

    def _eigh(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """The float64 eigendecomposition on ``device``: copied there once, not per call."""
        eigh = normalized_adjacency_eigh(self._graph)  # on the CPU, cached on the graph
        if device.type == "cpu":
            return eigh
        key = str(device)
        if key not in self._eigh_cache:
            self._eigh_cache[key] = tuple(tensor.to(device) for tensor in eigh)
        return self._eigh_cache[key]

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> Tensor:
        self._check_forward_args(last_dim_is_batch)
        nodes1 = self.node_indices(x1, "x1", allow_batch=True)
        nodes2 = nodes1 if same_inputs(x1, x2) else self.node_indices(x2, "x2", allow_batch=True)
        eigenvalues, eigenvectors = self._eigh(nodes1.device)
        dtype = self.dtype
        spectrum = self.kernel_family.spectrum(eigenvalues.to(dtype))
        # The spectrum's dtype: the kernel's, or wider where the hyperparameters are (e.g. Pyro samples).
        left, right = eigenvectors[nodes1].to(spectrum.dtype), eigenvectors[nodes2].to(spectrum.dtype)
        batch = self._output_batch(spectrum.shape[:-1], x1, x2)
        if diag:
            if nodes1.shape[-1] != nodes2.shape[-1]:
                raise ValueError(f"diag=True needs x1 and x2 of equal length, got {nodes1.shape[-1]} "
                                 f"and {nodes2.shape[-1]}")
            result = ((left * right) * spectrum.unsqueeze(-2)).sum(-1)
        else:
            result = (left * spectrum.unsqueeze(-2)) @ right.transpose(-1, -2)
        result = result.to(dtype)
        return result.expand(*batch, *result.shape[-(1 if diag else 2):])
