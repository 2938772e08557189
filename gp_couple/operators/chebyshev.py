r"""Graph kernels applied matrix-free as Chebyshev polynomials of the normalised adjacency.

Every kernel family of :mod:`gp_couple.kernel_families` is a function
:math:`g_\theta(\widetilde{\mathbf W})` of the normalised adjacency, whose eigenvalues lie in
:math:`[-1, 1]` (paper, section on graph node kernels, eq. for the normalised Laplacian).
Expanding :math:`g_\theta` in Chebyshev polynomials of the first kind,

.. math::

    \mathbf K = g_\theta(\widetilde{\mathbf W}) \approx \sum_{j=0}^{J} c_j(\theta)\, T_j(\widetilde{\mathbf W}),
    \qquad T_{j+1}(\widetilde{\mathbf W})\mathbf v = 2\widetilde{\mathbf W}\, T_j(\widetilde{\mathbf W})\mathbf v
    - T_{j-1}(\widetilde{\mathbf W})\mathbf v,

gives products :math:`\mathbf K\mathbf v` from :math:`J` sparse products and never forms
:math:`\mathbf K`. Only the coefficients depend on the hyperparameters, which is the same
structure as the GRF features :math:`\Phi(\theta) = \sum_t f_\theta(t)\Phi_t` (Appendix on
GRF approximation), so gradients cost one more recurrence:
:math:`\partial(\mathbf u^\top\mathbf K\mathbf v)/\partial c_j = \mathbf u^\top T_j\mathbf v`.

Because :math:`|T_j(\lambda)| \le 1` on :math:`[-1, 1]`, dropping the terms :math:`j > J`
changes :math:`\mathbf K` by at most :math:`\sum_{j > J}|c_j|` in operator norm; the degree
:math:`J` is chosen from that bound (:func:`chebyshev_expansion`).

* :func:`chebyshev_expansion`: coefficients :math:`c_j(\theta)` of a
  :class:`~gp_couple.kernel_families.KernelFamily`, differentiable, with the truncation bound.
* :class:`ChebyshevBasis`: the sparse :math:`\widetilde{\mathbf W}`, its recurrences and
  the cached, hyperparameter-free diagonals :math:`T_j(\widetilde{\mathbf W})_{ii}`.
* :class:`ChebyshevKernelLinearOperator`: the block :math:`\mathbf K_{AB}` on node sets
  :math:`A`, :math:`B` as a :class:`~linear_operator.LinearOperator`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from linear_operator.operators import LinearOperator
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from torch import Tensor

from .._checks import check_int
from ..kernel_families import KernelFamily

__all__ = [
    "ChebyshevBasis",
    "ChebyshevExpansion",
    "ChebyshevKernelLinearOperator",
    "chebyshev_coefficients",
    "chebyshev_expansion",
    "DEFAULT_TOLERANCE",
    "DEFAULT_MAX_DEGREE",
]

#: Default relative truncation tolerance of :func:`chebyshev_expansion`.
DEFAULT_TOLERANCE = 1e-8
#: Default largest Chebyshev degree before :func:`chebyshev_expansion` gives up.
DEFAULT_MAX_DEGREE = 2000
#: Smallest tolerance accepted: float64 coefficients carry rounding noise of about this size.
MIN_TOLERANCE = 1e-14
#: Interpolation points of the first resolution attempt (doubled until resolved).
_FIRST_POINTS = 32
#: Numbers held by one block of one-hot recurrences (three blocks live at once).
_BLOCK_ENTRIES = 1 << 23
#: Largest nnz(W~) x columns product done with torch's COO kernel: MKL's CSR kernel enters
#: a parallel region on every call, which stalls for milliseconds on an oversubscribed
#: machine, while the COO kernel is serial for small sizes but ~30x slower per entry.
_SMALL_PRODUCT = 1 << 15
#: Smallest block of diagonal nodes (their recurrences usually run on a neighbourhood only).
_LOCAL_BLOCK = 64


# ------------------------------------------------------------------ coefficients
def chebyshev_coefficients(values: Tensor) -> Tensor:
    r"""Chebyshev coefficients of the interpolant through values at the first-kind points.

    For :math:`g_k = g(x_k)`, :math:`x_k = \cos(\pi(k + \tfrac12)/M)`, :math:`k < M`,

    .. math::

        c_j = \frac{2 - \delta_{j0}}{M}\sum_{k=0}^{M-1} g_k \cos\frac{\pi j (k + \frac12)}{M},

    a DCT-II computed with one FFT of length :math:`2M` (differentiable, batched over
    leading dimensions, on any device). Exact for polynomials of degree below :math:`M`.

    :param values: :math:`g(x_0), \dots, g(x_{M-1})` along the last dimension.
    :return: :math:`c_0, \dots, c_{M-1}`, same shape.
    """
    num_points = values.shape[-1]
    spectrum = torch.fft.fft(values, n=2 * num_points, dim=-1)[..., :num_points]
    j = torch.arange(num_points, dtype=values.dtype, device=values.device)
    shift = torch.polar(torch.ones_like(j), -math.pi * j / (2 * num_points))
    weights = torch.full_like(j, 2.0 / num_points)
    weights[0] = 1.0 / num_points
    return (spectrum * shift).real * weights


def chebyshev_points(num_points: int, dtype: torch.dtype = torch.float64,
                     device: torch.device | str | None = None) -> Tensor:
    r"""First-kind Chebyshev points :math:`\cos(\pi(k + \tfrac12)/M)`, :math:`k = 0, \dots, M - 1`."""
    k = torch.arange(num_points, dtype=torch.float64, device=device)
    return torch.cos(math.pi * (k + 0.5) / num_points).to(dtype)


@dataclass(frozen=True)
class ChebyshevExpansion:
    r"""A graph kernel truncated to :math:`\sum_{j \le J} c_j T_j(\widetilde{\mathbf W})`.

    :ivar coefficients: :math:`c_0, \dots, c_J`, shape ``(*batch, J + 1)`` (float64,
        differentiable in the hyperparameters).
    :ivar tail_bound: Per batch entry, a bound on the operator-norm error
        :math:`\|\mathbf K - \mathbf K_J\|_2`: :math:`\sum_{j > J}|c_j|` plus the
        interpolation error of the :math:`M`-point interpolant, estimated as twice the
        mass of its upper half :math:`\sum_{j \ge M/2}|c_j|` (which the resolution check
        keeps below ``tolerance / 8`` of the scale).
    :ivar scale: :math:`\sum_j |c_j|` per batch entry (at least :math:`\|\mathbf K\|_2`).
    :ivar tolerance: The relative tolerance the degree was chosen for.
    """

    coefficients: Tensor
    tail_bound: Tensor
    scale: Tensor
    tolerance: float

    @property
    def degree(self) -> int:
        """The polynomial degree :math:`J`."""
        return self.coefficients.shape[-1] - 1

    @property
    def relative_bound(self) -> Tensor:
        r""":math:`\sum_{j > J}|c_j| / \sum_j |c_j|` per batch entry (at most ``tolerance``)."""
        return self.tail_bound / self.scale

    def to_dict(self) -> dict[str, Any]:
        """Degree and bounds as plain numbers (lists when batched), for reports."""
        def plain(tensor: Tensor) -> Any:
            flat = tensor.detach().reshape(-1).tolist()
            return flat[0] if len(flat) == 1 else flat

        return {"degree": self.degree, "tolerance": self.tolerance,
                "tail_bound": plain(self.tail_bound), "relative_bound": plain(self.relative_bound)}


def check_tolerance(tolerance: Any, max_degree: Any) -> tuple[float, int]:
    """Validate the truncation settings (public edge of the matrix-free kernel)."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.integer, np.floating)):
        raise TypeError(f"tolerance must be a float, got {type(tolerance).__name__}")
    if not MIN_TOLERANCE <= float(tolerance) < 1:
        raise ValueError(f"tolerance must lie in [{MIN_TOLERANCE:g}, 1), got {tolerance}")
    return float(tolerance), check_int("max_degree", max_degree, 1)


def chebyshev_expansion(kernel_family: KernelFamily, tolerance: float = DEFAULT_TOLERANCE,
                        max_degree: int = DEFAULT_MAX_DEGREE) -> ChebyshevExpansion:
    r"""Chebyshev expansion of a graph kernel, truncated at a stated relative tolerance.

    :math:`g_\theta` (:meth:`~gp_couple.kernel_families.KernelFamily.spectrum`) is
    interpolated at :math:`M = 32, 64, \dots` first-kind points until the upper half of
    the coefficients is negligible (below ``tolerance / 8`` of :math:`\sum_j|c_j|`), and
    the degree is the smallest :math:`J` with

    .. math::

        \sum_{j > J} |c_j| + 2\sum_{j \ge M/2}|c_j| \le \mathrm{tol} \sum_j |c_j|,

    the largest over a hyperparameter batch (the second sum estimates the interpolation
    error; the left-hand side is reported as :attr:`ChebyshevExpansion.tail_bound`).
    Polynomial families (p-step random walk, :class:`~gp_couple.kernel_families.PowerSeries`)
    are reproduced exactly at their degree;
    for analytic ones the Chebyshev series converges at least as fast as the Taylor
    series in :math:`\widetilde{\mathbf W}` (the regularised Laplacian needs
    :math:`J \approx \log(1/\mathrm{tol})\,/\,\sqrt{2/\sigma^2}` instead of
    :math:`\log(1/\mathrm{tol})\,\sigma^2`). The degree is chosen without gradients; the
    returned coefficients are differentiable in the hyperparameters.

    :param kernel_family: The kernel family (any batch shape).
    :param tolerance: Relative tolerance in ``[1e-14, 1)``.
    :param max_degree: Largest degree allowed.
    :return: The truncated expansion, float64.
    :raises ValueError: If the kernel needs a degree above ``max_degree`` (e.g. a
        regularised Laplacian with huge :math:`\sigma`, whose spectrum has a pole just
        outside :math:`[-1, 1]`), or its spectrum is not finite.
    """
    if not isinstance(kernel_family, KernelFamily):
        raise TypeError(f"kernel_family must be a KernelFamily, got {type(kernel_family).__name__}")
    tolerance, max_degree = check_tolerance(tolerance, max_degree)
    device = _family_device(kernel_family)
    resolution = max(tolerance / 8, 16 * torch.finfo(torch.float64).eps)
    num_points = _FIRST_POINTS
    while True:
        points = chebyshev_points(num_points, device=device)
        with torch.no_grad():
            values = kernel_family.spectrum(points).to(torch.float64)
            if not bool(torch.isfinite(values).all()):
                raise ValueError(f"{_describe(kernel_family)} has a non-finite spectrum on [-1, 1]")
            magnitudes = chebyshev_coefficients(values).abs()
            scale = magnitudes.sum(-1)
            unresolved = magnitudes[..., num_points // 2:].sum(-1) > resolution * scale
        if not bool(unresolved.any()):
            break
        if num_points // 2 > max_degree:
            raise ValueError(
                f"{_describe(kernel_family)} needs a Chebyshev degree above max_degree={max_degree} to reach "
                f"tolerance={tolerance:g} (its spectrum varies too fast on [-1, 1]); raise max_degree "
                "or the tolerance, or use the dense ExactGraphKernel")
        num_points *= 2
    # tails[..., J] = sum_{j > J} |c_j| + the interpolation error, estimated (for decaying
    # coefficients, generously) by twice the mass of the upper half.
    tails = magnitudes.flip(-1).cumsum(-1).flip(-1).roll(-1, dims=-1)
    tails[..., -1] = 0
    tails = tails + 2 * magnitudes[..., num_points // 2:].sum(-1, keepdim=True)
    enough = (tails <= tolerance * scale.unsqueeze(-1)).reshape(-1, num_points).all(0)
    degree = int(torch.nonzero(enough)[0])
    if degree > max_degree:
        raise ValueError(
            f"{_describe(kernel_family)} needs Chebyshev degree {degree} > max_degree={max_degree} for "
            f"tolerance={tolerance:g}; raise max_degree or the tolerance")
    coefficients = chebyshev_coefficients(kernel_family.spectrum(points).to(torch.float64))[..., :degree + 1]
    return ChebyshevExpansion(coefficients, tails[..., degree], scale, tolerance)


def _describe(kernel_family: KernelFamily) -> str:
    return f"{type(kernel_family).__name__}({kernel_family.extra_repr()})"


def _family_device(kernel_family: KernelFamily) -> torch.device:
    for tensor in list(kernel_family.parameters()) + list(kernel_family.buffers()):
        return tensor.device
    return torch.device("cpu")


# ------------------------------------------------------------------ the basis
class ChebyshevBasis:
    r"""The normalised adjacency :math:`\widetilde{\mathbf W}` and its Chebyshev recurrences.

    Holds :math:`\widetilde{\mathbf W}` as a torch sparse CSR tensor (float64; copies in
    other dtypes and devices are made on first use and kept) and a table of the
    hyperparameter-free diagonals :math:`T_j(\widetilde{\mathbf W})_{ii}`, filled on demand
    for the nodes asked for (see :meth:`diagonal`).

    :param normalized_adjacency: :math:`\widetilde{\mathbf W}` (scipy sparse or torch sparse
        CSR), symmetric with spectrum in :math:`[-1, 1]` (not checked).
    """

    def __init__(self, normalized_adjacency: Any) -> None:
        if sp.issparse(normalized_adjacency):
            matrix = sp.csr_matrix(normalized_adjacency, dtype=np.float64)
            self._matrix = torch.sparse_csr_tensor(
                torch.from_numpy(matrix.indptr.astype(np.int64)),
                torch.from_numpy(matrix.indices.astype(np.int64)),
                torch.from_numpy(np.array(matrix.data, dtype=np.float64)), matrix.shape)
        elif isinstance(normalized_adjacency, Tensor) and normalized_adjacency.layout == torch.sparse_csr:
            self._matrix = normalized_adjacency.to(torch.float64)
        else:
            raise TypeError("normalized_adjacency must be a scipy sparse matrix or a torch sparse CSR "
                            f"tensor, got {type(normalized_adjacency).__name__}")
        if self._matrix.shape[0] != self._matrix.shape[1]:
            raise ValueError(f"normalized_adjacency must be square, got shape {tuple(self._matrix.shape)}")
        if self._matrix.values().numel() < 2**31:
            # MKL's sparse kernels take int32 indices: int64 ones are converted on every product.
            self._matrix = torch.sparse_csr_tensor(self._matrix.crow_indices().to(torch.int32),
                                                   self._matrix.col_indices().to(torch.int32),
                                                   self._matrix.values(), self._matrix.shape)
        self._copies: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        self._rank: Tensor | None = None
        self._reset_diagonals(-1)

    @property
    def num_nodes(self) -> int:
        """Number of nodes :math:`N`."""
        return int(self._matrix.shape[0])

    @property
    def nnz(self) -> int:
        """Stored entries of :math:`\\widetilde{\\mathbf W}`."""
        return int(self._matrix.values().numel())

    def matrix(self, like: Tensor, *, layout: torch.layout = torch.sparse_csr) -> Tensor:
        r""":math:`\widetilde{\mathbf W}` in the dtype and on the device of ``like`` (CSR, or COO)."""
        key = (like.dtype, like.device, layout)
        if key not in self._copies:
            matrix = self._matrix.to(device=like.device, dtype=like.dtype)
            self._copies[key] = matrix if layout == torch.sparse_csr else matrix.to_sparse_coo().coalesce()
        return self._copies[key]

    # ---------------------------------------------------------------- recurrences
    def terms(self, block: Tensor, degree: int, matrix: Tensor | None = None) -> Iterator[Tensor]:
        r"""Yield :math:`T_0\mathbf X, T_1\mathbf X, \dots, T_J\mathbf X` for a block ``(N, m)``.

        Each step is one fused sparse product :math:`2\widetilde{\mathbf W}T_j\mathbf X - T_{j-1}\mathbf X`
        written over the buffer of :math:`T_{j-1}\mathbf X`, so three blocks are alive at a
        time: a yielded block is only valid until the next one is requested (``block``
        itself is never overwritten). ``matrix`` replaces :math:`\widetilde{\mathbf W}`
        (e.g. by its restriction to a neighbourhood).
        """
        if matrix is None:
            matrix = self.matrix(block, layout=_layout(self.nnz, block.shape[-1]))
        yield block
        if degree < 1:
            return
        previous, current = block, matrix @ block
        yield current
        for step in range(2, degree + 1):
            if matrix.layout == torch.sparse_coo:
                following = torch.sparse.mm(matrix, current).mul_(2).sub_(previous)
            else:
                # Over T_{j-1}'s buffer, except the caller's block.
                following = torch.addmm(previous, matrix, current, beta=-1, alpha=2,
                                        **({} if step == 2 else {"out": previous}))
            previous, current = current, following
            yield current

    def _stacked(self, tensor: Tensor) -> Tensor:
        # (*batch, N, t) -> (N, batch * t): one sparse product for every batch entry and column.
        return tensor.movedim(-2, 0).reshape(self.num_nodes, -1)

    def combine(self, coefficients: Tensor, block: Tensor) -> Tensor:
        r""":math:`\sum_j c_j T_j(\widetilde{\mathbf W})\mathbf X`, broadcasting batches.

        :param coefficients: ``(*batch_c, J + 1)``.
        :param block: ``(*batch_x, N, t)``.
        :return: ``(*broadcast(batch_c, batch_x), N, t)``.
        """
        batch_c, batch_x, width = coefficients.shape[:-1], block.shape[:-2], block.shape[-1]
        batch = torch.broadcast_shapes(batch_c, batch_x)
        term_shape = (self.num_nodes, *([1] * (len(batch) - len(batch_x))), *batch_x, width)
        weights = coefficients.reshape(1, *([1] * (len(batch) - len(batch_c))), *batch_c, -1, 1)
        result = None
        for j, term in enumerate(self.terms(self._stacked(block), coefficients.shape[-1] - 1)):
            term = term.view(term_shape)
            if result is None:
                result = term * weights[..., 0, :]
            else:
                result.addcmul_(term, weights[..., j, :])
        return result.movedim(0, -2)

    def moments(self, left: Tensor, block: Tensor, degree: int) -> Tensor:
        r"""Moments :math:`m_j = \sum_{i, s} \mathbf U_{is}\,(T_j(\widetilde{\mathbf W})\mathbf X)_{is}`
        per batch entry.

        :param left: :math:`\mathbf U`, ``(*batch_u, N, t)``.
        :param block: :math:`\mathbf X`, ``(*batch_x, N, t)``.
        :param degree: :math:`J`.
        :return: ``(*broadcast(batch_u, batch_x), J + 1)``.
        """
        batch_u, batch_x, width = left.shape[:-2], block.shape[:-2], block.shape[-1]
        batch = torch.broadcast_shapes(batch_u, batch_x)
        term_shape = (self.num_nodes, *([1] * (len(batch) - len(batch_x))), *batch_x, width)
        stacked_left = left.movedim(-2, 0).reshape(self.num_nodes, *([1] * (len(batch) - len(batch_u))),
                                                   *batch_u, left.shape[-1])
        moments = [torch.einsum("n...t,n...t->...", stacked_left, term.view(term_shape)).expand(batch)
                   for term in self.terms(self._stacked(block), degree)]
        return torch.stack(moments, dim=-1)

    # ---------------------------------------------------------------- diagonals
    def _reset_diagonals(self, degree: int) -> None:
        self._diagonal_degree = degree
        self._diagonal_slot = torch.full((self.num_nodes,), -1, dtype=torch.int64)
        self._diagonal_values = torch.empty(0, max(degree, 0) + 1, dtype=torch.float64)

    def diagonal(self, nodes: Tensor, degree: int) -> Tensor:
        r"""Diagonal entries :math:`T_j(\widetilde{\mathbf W})_{ii}`, :math:`j \le J`, of ``nodes``.

        They do not depend on the hyperparameters, so they are computed once per node
        and kept (a table of :math:`J + 1` numbers per node asked for). The degree is
        rounded up with 25% headroom, so that training, whose degree drifts with the
        hyperparameters, rarely recomputes. With
        :math:`T_{2m} = 2T_m^2 - \mathbf I` and :math:`T_{2m-1} = 2T_mT_{m-1} - T_1`,

        .. math::

            T_{2m}(\widetilde{\mathbf W})_{ii} = 2\|T_m\mathbf e_i\|^2 - 1, \qquad
            T_{2m-1}(\widetilde{\mathbf W})_{ii}
            = 2\langle T_m\mathbf e_i, T_{m-1}\mathbf e_i\rangle - \widetilde W_{ii},

        only :math:`h = \lceil J/2\rceil` recurrence steps on one-hot columns are needed, and
        they run exactly on the restriction of :math:`\widetilde{\mathbf W}` to the
        :math:`h`-hop neighbourhood of a block of nodes that are close in a reverse
        Cuthill-McKee order (the whole graph when that neighbourhood is over half of it).
        The one-off cost is at most :math:`h\,\mathrm{nnz}(\widetilde{\mathbf W})` per node,
        and on meshes and grids, whose neighbourhoods grow slowly, much less; memory is
        :math:`3N` numbers per node of a block (:data:`_LOCAL_BLOCK` nodes, or more when
        :data:`_BLOCK_ENTRIES` allows).

        :param nodes: Node indices (int64, any shape).
        :param degree: :math:`J`.
        :return: float64 tensor ``(*nodes.shape, J + 1)`` on the device of ``nodes``.
        """
        if degree > self._diagonal_degree:
            self._reset_diagonals(2 * math.ceil(1.25 * degree / 2))
        flat = nodes.reshape(-1).cpu()
        wanted = torch.unique(flat)
        missing = wanted[self._diagonal_slot[wanted] < 0]
        if missing.numel():
            # Blocks of nodes that are close in the graph have small joint neighbourhoods.
            missing = missing[torch.argsort(self._locality_rank()[missing])]
            block = max(_LOCAL_BLOCK, _BLOCK_ENTRIES // (3 * self.num_nodes))
            computed = [self._one_hot_diagonals(missing[start:start + block].to(nodes.device),
                                                self._diagonal_degree)
                        for start in range(0, missing.numel(), block)]
            self._diagonal_slot[missing] = torch.arange(missing.numel()) + self._diagonal_values.shape[0]
            self._diagonal_values = torch.cat([self._diagonal_values, *[c.cpu() for c in computed]])
        table = self._diagonal_values[self._diagonal_slot[flat], :degree + 1]
        return table.reshape(*nodes.shape, degree + 1).to(nodes.device)

    def _locality_rank(self) -> Tensor:
        """Position of every node in a reverse Cuthill-McKee order (neighbours get close ranks)."""
        if self._rank is None:
            from scipy.sparse.csgraph import reverse_cuthill_mckee

            matrix = self._matrix.cpu()
            pattern = sp.csr_matrix((np.ones(self.nnz), matrix.col_indices().numpy(),
                                     matrix.crow_indices().numpy()), shape=tuple(matrix.shape))
            order = torch.from_numpy(reverse_cuthill_mckee(pattern, symmetric_mode=True).astype(np.int64))
            self._rank = torch.empty_like(order)
            self._rank[order] = torch.arange(order.numel())
        return self._rank

    def _neighbourhood(self, nodes: Tensor, hops: int) -> Tensor | None:
        """Mask of the nodes within ``hops`` of ``nodes``; ``None`` once that is half the graph."""
        matrix = self.matrix(torch.empty(0, dtype=torch.float64, device=nodes.device),
                             layout=_layout(self.nnz, 1))
        reach = torch.zeros(self.num_nodes, 1, dtype=torch.float64, device=nodes.device)
        reach[nodes] = 1.0
        for _ in range(hops):
            # Weights are non-negative, so a positive entry means "reachable".
            reach = ((matrix @ reach) + reach > 0).to(torch.float64)
            if 2 * float(reach.sum()) > self.num_nodes:
                return None
        return reach.squeeze(-1) > 0

    def _restriction(self, keep: Tensor, width: int) -> Tensor:
        r""":math:`\widetilde{\mathbf W}` restricted to the nodes in ``keep`` (float64, for ``width`` columns)."""
        matrix = self.matrix(torch.empty(0, dtype=torch.float64, device=keep.device))
        crow, columns, values = matrix.crow_indices().long(), matrix.col_indices().long(), matrix.values()
        rows = torch.repeat_interleave(torch.arange(self.num_nodes, device=keep.device), crow.diff())
        inside = keep[rows] & keep[columns]
        local = torch.cumsum(keep.long(), 0) - 1  # monotone: CSR order is preserved
        size = int(keep.sum())
        pointer = torch.zeros(size + 1, dtype=torch.int64, device=keep.device)
        pointer[1:] = torch.bincount(local[rows[inside]], minlength=size).cumsum(0)
        restricted = torch.sparse_csr_tensor(pointer.to(torch.int32), local[columns[inside]].to(torch.int32),
                                             values[inside], (size, size))
        small = _layout(int(inside.sum()), width) == torch.sparse_coo
        return restricted.to_sparse_coo().coalesce() if small else restricted

    def _one_hot_diagonals(self, nodes: Tensor, degree: int) -> Tensor:
        # T_m e_i lives within m hops of node i: the recurrence up to m = ceil(J/2) runs
        # exactly on the restriction of W~ to the block's (ceil(J/2))-hop neighbourhood.
        hops = (degree + 1) // 2
        keep = self._neighbourhood(nodes, hops)
        matrix = None if keep is None else self._restriction(keep, nodes.numel())
        positions = nodes if keep is None else (torch.cumsum(keep.long(), 0) - 1)[nodes]
        size = self.num_nodes if keep is None else int(keep.sum())
        block = one_hot_columns(positions, size, torch.float64)
        columns = torch.arange(nodes.numel(), device=nodes.device)
        result = torch.empty(nodes.numel(), degree + 1, dtype=torch.float64, device=nodes.device)
        result[:, 0] = 1.0
        previous = None
        self_loops = None
        for m, current in enumerate(self.terms(block, hops, matrix)):
            if m == 1:
                self_loops = current[positions, columns]
            if m >= 1:
                if 2 * m - 1 <= degree:
                    result[:, 2 * m - 1] = 2 * (current * previous).sum(0) - self_loops
                if 2 * m <= degree:
                    result[:, 2 * m] = 2 * current.square().sum(0) - 1
            previous = current
        return result


def _layout(nnz: int, width: int) -> torch.layout:
    return torch.sparse_coo if nnz * width <= _SMALL_PRODUCT else torch.sparse_csr


def one_hot_columns(nodes: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
    """The ``(num_nodes, len(nodes))`` block whose column ``k`` is the indicator of ``nodes[k]``."""
    block = torch.zeros(num_nodes, nodes.numel(), dtype=dtype, device=nodes.device)
    block[nodes, torch.arange(nodes.numel(), device=nodes.device)] = 1.0
    return block


class _ChebyshevProduct(torch.autograd.Function):
    r""":math:`\mathbf Y = \sum_j c_j T_j(\widetilde{\mathbf W})\mathbf X` with a recurrence-based backward.

    The backward pass reruns the recurrence instead of keeping :math:`J` blocks on an
    autograd tape: :math:`\partial/\partial c_j = \langle \bar{\mathbf Y}, T_j\mathbf X\rangle`
    and :math:`\bar{\mathbf X} = \sum_j c_j T_j\bar{\mathbf Y}` (:math:`\widetilde{\mathbf W}`
    is symmetric), :math:`O(N t)` memory. ``block`` may also be int64 node indices,
    standing for their one-hot columns (then it is not saved as a dense block).
    """

    @staticmethod
    def forward(ctx: Any, coefficients: Tensor, block: Tensor, basis: ChebyshevBasis) -> Tensor:
        ctx.basis = basis
        ctx.save_for_backward(coefficients, block)
        return basis.combine(coefficients, _dense_block(block, basis.num_nodes, coefficients.dtype))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        coefficients, block = ctx.saved_tensors
        basis: ChebyshevBasis = ctx.basis
        grad_coefficients = grad_block = None
        if ctx.needs_input_grad[0]:
            dense = _dense_block(block, basis.num_nodes, coefficients.dtype)
            moments = basis.moments(grad, dense, coefficients.shape[-1] - 1)
            grad_coefficients = moments.sum_to_size(coefficients.shape)
        if ctx.needs_input_grad[1]:
            grad_block = basis.combine(coefficients, grad).sum_to_size(block.shape)
        return grad_coefficients, grad_block, None


def _dense_block(block: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
    return block if block.is_floating_point() else one_hot_columns(block, num_nodes, dtype)


# ------------------------------------------------------------------ the operator
class ChebyshevKernelLinearOperator(LinearOperator):
    r"""Matrix-free graph kernel block
    :math:`\mathbf K_{AB} = \mathbf P_A\sum_j c_jT_j(\widetilde{\mathbf W})\mathbf P_B^\top`.

    :math:`\mathbf P_A` selects the rows of the nodes in :math:`A` (``row_nodes``), so
    :math:`(\mathbf K_{AB})_{ab} = k(A_a, B_b)`. Products scatter the right-hand side onto
    the graph, run one recurrence of :math:`J` sparse products for all columns and batch
    entries together, and gather the rows of :math:`A`; costs are
    :math:`O(J\,\mathrm{nnz}(\widetilde{\mathbf W})\,t)` time and :math:`O(N t)` memory for
    :math:`t` right-hand sides, whatever :math:`|A|`, :math:`|B|`.

    * Gradients with respect to the coefficients (hence the hyperparameters) use
      :math:`\partial(\mathbf u^\top\mathbf K\mathbf v)/\partial c_j =
      (\mathbf P_A^\top\mathbf u)^\top T_j(\mathbf P_B^\top\mathbf v)`: one more recurrence
      (:meth:`_bilinear_derivative`, and the backward of every product).
    * The diagonal of a symmetric block is :math:`\mathbf D_A\mathbf c` with the
      hyperparameter-free table :math:`(\mathbf D_A)_{aj} = T_j(\widetilde{\mathbf W})_{A_aA_a}`
      cached by the :class:`ChebyshevBasis` (:meth:`ChebyshevBasis.diagonal`).
    * Entries and rows (e.g. for the pivoted-Cholesky preconditioner) run the recurrence
      on the one-hot columns of whichever side has fewer distinct nodes
      (:math:`\mathbf K` is symmetric in the node pair).

    :param coefficients: :math:`c_0, \dots, c_J`, shape ``(*batch, J + 1)``.
    :param basis: The :class:`ChebyshevBasis` of the graph.
    :param row_nodes: Node indices of :math:`A`, shape ``(n_A,)`` (shared by the batch) or
        ``(*batch, n_A)``.
    :param column_nodes: Node indices of :math:`B` (same conventions).
    """

    def __init__(self, coefficients: Tensor, *, basis: ChebyshevBasis, row_nodes: Tensor,
                 column_nodes: Tensor) -> None:
        batch = coefficients.shape[:-1]
        symmetric = column_nodes is row_nodes
        # LinearOperator.to()/type() may convert every tensor argument: indices stay int64.
        row_nodes = _nodes(row_nodes, batch)
        column_nodes = row_nodes if symmetric else _nodes(column_nodes, batch)
        super().__init__(coefficients, basis=basis, row_nodes=row_nodes, column_nodes=column_nodes)
        self.coefficients = coefficients
        self.basis = basis
        self.row_nodes = row_nodes
        self.column_nodes = column_nodes

    def _new(self, coefficients: Tensor) -> ChebyshevKernelLinearOperator:
        # Same nodes, new coefficients (batched node indices follow their batch shape).
        batch = coefficients.shape[:-1]
        rows = _expand_nodes(self.row_nodes, batch)
        columns = rows if self.column_nodes is self.row_nodes else _expand_nodes(self.column_nodes, batch)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    @property
    def degree(self) -> int:
        """The Chebyshev degree :math:`J`."""
        return self.coefficients.shape[-1] - 1

    # ---------------------------------------------------------------- required hooks
    def _size(self) -> torch.Size:
        return torch.Size((*self.coefficients.shape[:-1], self.row_nodes.shape[-1],
                           self.column_nodes.shape[-1]))

    def _scatter(self, nodes: Tensor, values: Tensor) -> Tensor:
        r""":math:`\mathbf P^\top\mathbf V` on the graph, ``(*batch, N, t)``."""
        batch = torch.broadcast_shapes(nodes.shape[:-1], values.shape[:-2])
        shape = (*batch, self.basis.num_nodes, values.shape[-1])
        index = nodes.unsqueeze(-1).expand(*batch, nodes.shape[-1], values.shape[-1])
        return values.new_zeros(shape).scatter_add(-2, index, values.expand(*batch, *values.shape[-2:]))

    @staticmethod
    def _gather(nodes: Tensor, full: Tensor) -> Tensor:
        if nodes.ndim == 1:
            return full.index_select(-2, nodes)
        batch = torch.broadcast_shapes(nodes.shape[:-1], full.shape[:-2])
        index = nodes.unsqueeze(-1).expand(*batch, nodes.shape[-1], full.shape[-1])
        return full.expand(*batch, *full.shape[-2:]).gather(-2, index)

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.ndim == 1
        rhs = rhs.unsqueeze(-1) if vector else rhs
        full = _ChebyshevProduct.apply(self.coefficients, self._scatter(self.column_nodes, rhs), self.basis)
        result = self._gather(self.row_nodes, full)
        return result.squeeze(-1) if vector else result

    def _transpose_nonbatch(self) -> ChebyshevKernelLinearOperator:
        if self.row_nodes is self.column_nodes:
            return self
        return self.__class__(self.coefficients, basis=self.basis, row_nodes=self.column_nodes,
                              column_nodes=self.row_nodes)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if not self.coefficients.requires_grad:
            return (None, None, None)
        if left_vecs.ndim == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        with torch.no_grad():
            moments = self.basis.moments(self._scatter(self.row_nodes, left_vecs),
                                         self._scatter(self.column_nodes, right_vecs), self.degree)
        # Representation order: coefficients, then the tensor kwargs sorted by name.
        return (moments.sum_to_size(self.coefficients.shape), None, None)

    # ---------------------------------------------------------------- batch handling
    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> ChebyshevKernelLinearOperator:
        return self._new(self.coefficients.expand(*batch_shape, self.coefficients.shape[-1]))

    def _with_batch_map(self, coefficients: Tensor, transform: Any) -> ChebyshevKernelLinearOperator:
        # Batched node indices follow the coefficients' batch; shared (1-D) ones stay shared.
        def apply(nodes: Tensor) -> Tensor:
            return nodes if nodes.ndim == 1 else transform(nodes)

        rows = apply(self.row_nodes)
        columns = rows if self.column_nodes is self.row_nodes else apply(self.column_nodes)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    def _permute_batch(self, *dims: int) -> ChebyshevKernelLinearOperator:
        return self._with_batch_map(self.coefficients.permute(*dims, -1),
                                    lambda nodes: nodes.permute(*dims, -1))

    def _unsqueeze_batch(self, dim: int) -> ChebyshevKernelLinearOperator:
        return self._with_batch_map(self.coefficients.unsqueeze(dim), lambda nodes: nodes.unsqueeze(dim))

    def _mul_constant(self, other: float | Tensor) -> LinearOperator:
        # c * g(W) = (c g)(W): scaling the coefficients keeps the cheap derivative (ScaleKernel).
        constant = torch.as_tensor(other, dtype=self.dtype, device=self.device)
        return self._new(self.coefficients * constant.unsqueeze(-1))

    # ---------------------------------------------------------------- entries
    def _diagonal(self) -> Tensor:
        size = min(self.matrix_shape)
        rows, columns = self.row_nodes[..., :size], self.column_nodes[..., :size]
        if not torch.equal(rows, columns):
            index = torch.arange(size, device=self.device)
            return self._entries(rows, columns, index, index)
        table = self.basis.diagonal(rows, self.degree).to(self.dtype)
        return (table * self.coefficients.unsqueeze(-2)).sum(-1)

    def _entries(self, rows: Tensor, columns: Tensor, row_index: Tensor, column_index: Tensor,
                 batch_indices: tuple[Tensor, ...] = ()) -> Tensor:
        r"""Entries :math:`k(A_{r_p}, B_{s_p})` for flat index lists ``row_index``, ``column_index``.

        One recurrence runs on the one-hot columns of whichever side has fewer distinct
        nodes (:math:`k` is symmetric in the node pair), e.g. a single column for a
        pivoted-Cholesky row :math:`\mathbf K[i, :]`. With ``batch_indices`` every pair
        has its own batch entry; the recurrence then runs for the distinct entries only.
        """
        if batch_indices:
            first = rows[row_index] if rows.ndim == 1 else rows[(*batch_indices, row_index)]
            second = columns[column_index] if columns.ndim == 1 else columns[(*batch_indices, column_index)]
        else:
            first, second = rows[..., row_index], columns[..., column_index]
        distinct_first, distinct_second = torch.unique(first), torch.unique(second)
        if distinct_first.numel() < distinct_second.numel():
            first, second, distinct_second = second, first, distinct_first
        position = torch.searchsorted(distinct_second, second)
        if batch_indices:
            entry = torch.zeros_like(row_index)
            for index, size in zip(batch_indices, self.batch_shape):
                entry = entry * size + index
            distinct_entries, owner = torch.unique(entry, return_inverse=True)
            coefficients = self.coefficients.reshape(-1, self.degree + 1)[distinct_entries]
            full = _ChebyshevProduct.apply(coefficients, distinct_second, self.basis)  # (E, N, u)
            return full[owner, first, position]
        full = _ChebyshevProduct.apply(self.coefficients, distinct_second, self.basis)  # (*batch, N, u)
        batch = full.shape[:-2]
        flat = full.reshape(-1, *full.shape[-2:])
        first = first.expand(*batch, first.shape[-1]).reshape(flat.shape[0], -1)
        position = position.expand(*batch, position.shape[-1]).reshape(flat.shape[0], -1)
        picked = flat[torch.arange(flat.shape[0], device=flat.device).unsqueeze(-1), first, position]
        return picked.reshape(*batch, -1)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape, *(index.shape for index in batch_indices))
        flat_batch = tuple(index.expand(shape).reshape(-1) for index in batch_indices)
        values = self._entries(self.row_nodes, self.column_nodes, row_index.expand(shape).reshape(-1),
                               col_index.expand(shape).reshape(-1), flat_batch)
        return values.reshape(shape)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        coefficients = self.coefficients
        batched = batch_indices and not all(_is_noop_index(index) for index in batch_indices)
        if batched:
            coefficients = coefficients[(*batch_indices, _noop_index)]

        def select(nodes: Tensor, index: Any) -> Tensor:
            if nodes.ndim > 1 and batched:
                nodes = nodes[(*batch_indices, _noop_index)]
            return nodes if _is_noop_index(index) else nodes[..., index]

        batch = coefficients.shape[:-1]
        rows = _expand_nodes(select(self.row_nodes, row_index), batch)
        if self.row_nodes is self.column_nodes and _same_index(row_index, col_index):
            columns = rows
        else:
            columns = _expand_nodes(select(self.column_nodes, col_index), batch)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    # ---------------------------------------------------------------- dense
    def to_dense(self) -> Tensor:
        r"""The dense block, from one-hot recurrences on the distinct nodes of the smaller side, in chunks.

        Costs :math:`J\,\mathrm{nnz}\,\min(|A|, |B|)` and :math:`O(N\,\mathrm{chunk})` memory; meant for
        the small blocks that gpytorch's Cholesky path asks for.
        """
        columns = self.column_nodes
        if columns.ndim > 1:
            index = torch.arange(columns.shape[-1], device=self.device)
            rows = torch.arange(self.row_nodes.shape[-1], device=self.device)
            grid_rows, grid_columns = torch.meshgrid(rows, index, indexing="ij")
            values = self._entries(self.row_nodes, columns, grid_rows.reshape(-1), grid_columns.reshape(-1))
            return values.reshape(*self.batch_shape, rows.numel(), index.numel())
        distinct, position = torch.unique(columns, return_inverse=True)
        if self.row_nodes.ndim == 1 and torch.unique(self.row_nodes).numel() < distinct.numel():
            # K_AB = K_BA^T: one-hot recurrences on the side with fewer distinct nodes.
            return self._transpose_nonbatch().to_dense().mT
        chunk = max(1, _BLOCK_ENTRIES // (3 * self.basis.num_nodes * max(1, self.batch_shape.numel())))
        blocks = [self._gather(self.row_nodes, _ChebyshevProduct.apply(
            self.coefficients, distinct[start:start + chunk], self.basis))
            for start in range(0, distinct.numel(), chunk)]
        return torch.cat(blocks, dim=-1)[..., position]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={tuple(self.shape)}, degree={self.degree}, "
                f"num_nodes={self.basis.num_nodes}, dtype={self.dtype})")


def _same_index(first: Any, second: Any) -> bool:
    if isinstance(first, Tensor) and isinstance(second, Tensor):
        return first.shape == second.shape and bool(torch.equal(first, second))
    if isinstance(first, slice) and isinstance(second, slice):
        return (first.start, first.stop, first.step) == (second.start, second.stop, second.step)
    return False


def _nodes(nodes: Tensor, batch: torch.Size) -> Tensor:
    if not isinstance(nodes, Tensor):
        raise TypeError(f"node indices must be a tensor, got {type(nodes).__name__}")
    nodes = nodes if nodes.dtype == torch.int64 else nodes.to(torch.int64)
    if nodes.ndim > 1 and nodes.shape[:-1] != batch:
        raise ValueError(f"batched node indices of shape {tuple(nodes.shape)} do not match the "
                         f"coefficient batch shape {tuple(batch)}")
    return nodes


def _expand_nodes(nodes: Tensor, batch: torch.Size) -> Tensor:
    if nodes.ndim == 1 or nodes.shape[:-1] == batch:
        return nodes
    return nodes.expand(*batch, nodes.shape[-1])
