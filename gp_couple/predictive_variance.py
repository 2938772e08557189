r"""Posterior variances of exact GPs, to a stated accuracy, with an error estimate.

The latent posterior variance at a test input :math:`x_*` is

.. math::

    \sigma^2_*(x_*) = k(x_*, x_*) - \mathbf k_*^\top \mathbf A^{-1} \mathbf k_*, \qquad
    \mathbf A = \mathbf K_{XX} + \sigma_n^2 \mathbf I ,\quad \mathbf k_* = \mathbf K_{X x_*},

the quantity behind every NLPD and KL of the paper's GP experiments (Appendix F.2
"Scalable GPs on graphs" [app:grf_gp_details]). gpytorch's ``fast_pred_var`` replaces
:math:`\mathbf A^{-1}` by a Lanczos approximation of fixed rank; once the number of
eigenvalues of :math:`\mathbf K_{XX}` above the noise exceeds that rank, the correction
term is too small and the variances are too large, by a factor that grows with the
training set. This module chooses the method by size and stops on an error estimate:

* ``"dense"``: :math:`\mathbf A` is formed and factorised by Cholesky in float64. Exact
  (to rounding); used up to :data:`DENSE_VARIANCE_SIZE` training points, unless the sparse
  factor below costs less (:func:`sparse_factor_ordering`).
* ``"sparse"``: when :math:`\mathbf A` and :math:`\mathbf K_{*X}` are sparse (GRF kernels:
  two nodes covary only where their walks meet, :meth:`GRFGramLinearOperator.scipy_matrix
  <gp_couple.operators.grf_gram.GRFGramLinearOperator.scipy_matrix>`), a sparse LU factor
  of :math:`\mathbf A` with a fill-reducing ordering and a sparse triangular solve per test
  point (:class:`~gp_couple.sparse_factor.SparseFactor`). Exact (to rounding), with the
  mean from the same factor. Used up to :data:`DENSE_VARIANCE_SIZE` training points where
  its symbolic cost, counted before factorising, is below the dense factor's (training
  points whose walks seldom meet: scattered over a large graph), and above that size when
  the factor's allowance (:func:`~gp_couple.sparse_factor.factor_bytes_bound`) fits in
  half the physical memory.
* ``"lanczos"``: a block Krylov subspace :math:`\mathcal Q_r` of :math:`\mathbf A`
  (random start block, full reorthogonalisation in float64) and the Galerkin
  approximation :math:`\mathbf A^{-1} \approx \mathbf Q_r (\mathbf Q_r^\top \mathbf A
  \mathbf Q_r)^{-1} \mathbf Q_r^\top`. For nested subspaces the correction term
  :math:`\mathbf k_*^\top \mathbf Q_r (\mathbf Q_r^\top\mathbf A\mathbf Q_r)^{-1}
  \mathbf Q_r^\top \mathbf k_*` increases monotonically to the exact one (it is the
  maximum of :math:`2\mathbf v^\top\mathbf k_* - \mathbf v^\top\mathbf A\mathbf v` over
  :math:`\mathbf v \in \mathcal Q_r`), so the variances decrease monotonically to the
  exact ones. The rank grows by half until an error bound on a random subset of test
  points is below ``tolerance``: for the Galerkin solution :math:`\mathbf z =
  \mathbf Q_r \mathbf T_r^{-1}\mathbf Q_r^\top\mathbf k_*` with residual
  :math:`\mathbf r = \mathbf k_* - \mathbf A\mathbf z`, the error of the correction
  term is :math:`\mathbf r^\top\mathbf A^{-1}\mathbf r \le \|\mathbf r\|^2 /
  \sigma_n^2`, since every eigenvalue of :math:`\mathbf A` is at least the noise
  variance. The largest such bound relative to the variance it corrects is the reported
  error estimate (a bound for the probed points, an estimate for the others).
  last step). The products with :math:`\mathbf A` and :math:`\mathbf K_{*X}` are the
  operators' own (sparse for GRF kernels, matrix-free for Chebyshev kernels), one block
  of columns at a time. The subspace is kept in float64 for the training and the test
  points; it stops growing where it would take more than :data:`KRYLOV_MEMORY_FRACTION`
  of the physical memory, and the estimate then says that it did not converge (the
  variances are still upper bounds of the exact ones).

All work on batched operators (hyperparameter batches, e.g. NUTS samples) one batch
entry at a time.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from gpytorch.lazy import LazyEvaluatedKernelTensor
from linear_operator import to_linear_operator
from linear_operator.operators import (
    ConstantMulLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    SumLinearOperator,
)
from torch import Tensor

from ._checks import check_fraction, check_int
from .devices import physical_memory
from .operators.grf_gram import GRFGramLinearOperator
from .operators.training_covariance import dense_covariance
from .sparse_factor import SparseFactor, factor_bytes_bound, factor_cost

__all__ = ["DENSE_VARIANCE_SIZE", "KRYLOV_MEMORY_FRACTION", "SPARSE_SETUP_WORK", "SPARSE_WORK_COST",
           "VARIANCE_METHODS", "VarianceEstimate",
           "VarianceToleranceWarning", "posterior_variance", "sparse_factor_candidate", "sparse_factor_ordering",
           "sparse_form", "sparse_work_budget"]

#: Largest training set whose variances ``"auto"`` computes by a float64 factor: dense Cholesky,
#: or a sparse factor where it costs less (:func:`sparse_factor_ordering`).
DENSE_VARIANCE_SIZE = 10_000
#: Cost of a multiply-add of the sparse factor and its solves (SuperLU, the compiled sparse
#: triangular solves) in multiply-adds of the dense float64 Cholesky factor and its
#: triangular solves (LAPACK and BLAS), by which ``"auto"`` weighs the two up to
#: :data:`DENSE_VARIANCE_SIZE` training points (``benchmarks/bench_variance_method.py``,
#: one core).
SPARSE_WORK_COST = 20
#: The sparse factor's fixed cost (the sparse matrices, the ordering, the symbolic count) in
#: multiply-adds of the dense factor: small training sets stay dense.
SPARSE_SETUP_WORK = 10 ** 9
#: The variance methods :func:`posterior_variance` accepts.
VARIANCE_METHODS = ("auto", "dense", "sparse", "lanczos")
#: Share of the physical memory the Krylov subspace (training and test sides, float64) may take.
KRYLOV_MEMORY_FRACTION = 0.5
#: Columns of the Krylov block (products are done a block at a time).
_BLOCK = 64
#: Rank of the first convergence check; it grows by :data:`_GROWTH` after each.
_FIRST_CHECK = 256
#: Test points whose error bound is computed exactly at every check.
_PROBES = 64
#: Factor by which the rank grows between checks.
_GROWTH = 1.5
#: Test points whose cross-covariance rows are read at once (bounds the memory).
_TEST_CHUNK = 2048


@dataclass(frozen=True)
class VarianceEstimate:
    """How predictive variances were computed, and how accurate they are estimated to be.

    :ivar method: ``"dense"`` (float64 Cholesky), ``"sparse"`` (sparse LU factor) or
        ``"lanczos"`` (block Krylov subspace).
    :ivar rank: Dimension of the Krylov subspace (the training-set size for ``"dense"``
        and ``"sparse"``).
    :ivar relative_error: Estimated largest relative error of any variance (0 for
        ``"dense"`` and ``"sparse"``; for ``"lanczos"`` the largest residual bound on the
        probed test points; the variances are too large, never too small).
    :ivar converged: Whether ``relative_error`` reached the requested tolerance (the
        subspace grows until it does, up to the whole space or the memory limit).
    """

    method: str
    rank: int
    relative_error: float
    converged: bool


class VarianceToleranceWarning(UserWarning):
    """Krylov variances stopped short of their tolerance (memory limit): they are too large by up to the estimate."""


@functools.singledispatch
def sparse_form(operator: object, max_entries: int | None = None) -> sp.csr_matrix | None:
    """An unbatched operator as a float64 SciPy CSR matrix when its structure is sparse, else ``None``.

    Dispatches on the operator's type: GRF kernel matrices, their sums with diagonals (the
    noise), constant multiples and gpytorch's lazily evaluated kernel tensors have one;
    register further types with ``sparse_form.register``.

    :param max_entries: If given, ``None`` unless the form is known, before it is assembled,
        to have at most this many stored entries (GRF Grams count theirs,
        :meth:`~gp_couple.operators.grf_gram.GRFGramLinearOperator.sparse_entries`; each
        part of a sum is held to the bound).
    """
    return None


@sparse_form.register
def _(operator: LazyEvaluatedKernelTensor, max_entries: int | None = None) -> sp.csr_matrix | None:
    return sparse_form(operator.evaluate_kernel(), max_entries)


@sparse_form.register
def _(operator: GRFGramLinearOperator, max_entries: int | None = None) -> sp.csr_matrix | None:
    if operator.batch_shape:
        return None
    if max_entries is not None and operator.sparse_entries(max_entries) is None:
        return None
    return operator.scipy_matrix()


@sparse_form.register
def _(operator: DiagLinearOperator, max_entries: int | None = None) -> sp.csr_matrix | None:
    if operator.batch_shape or (max_entries is not None and operator.shape[-1] > max_entries):
        return None
    return sp.diags(operator.diagonal().detach().to(torch.float64).cpu().numpy(), format="csr")


@sparse_form.register
def _(operator: SumLinearOperator, max_entries: int | None = None) -> sp.csr_matrix | None:
    parts = []
    for part in operator.linear_ops:
        form = sparse_form(part, max_entries)
        if form is None:
            return None
        parts.append(form)
    return sp.csr_matrix(sum(parts[1:], parts[0]))


@sparse_form.register
def _(operator: ConstantMulLinearOperator, max_entries: int | None = None) -> sp.csr_matrix | None:
    if operator.expanded_constant.numel() != 1:
        return None
    base = sparse_form(operator.base_linear_op, max_entries)
    return None if base is None else base * float(operator.expanded_constant.reshape(()))


@dataclass(frozen=True)
class _SparsePair:
    """The sparse training covariance and cross-covariance of one batch entry, and the training side's ordering."""

    train: sp.csr_matrix
    cross: sp.csr_matrix
    order: np.ndarray | None = None


def sparse_work_budget(size: int, num_solves: int) -> float:
    r"""The weighted work a sparse factor of ``size`` points may cost and still beat the dense one.

    In multiply-adds: :math:`m^3/3 + t m^2` for a dense Cholesky factor of :math:`m` points
    and its :math:`t` = ``num_solves`` triangular solves, :math:`m` the smaller of ``size``
    and :data:`DENSE_VARIANCE_SIZE` (above that size, the most dense work ``"auto"`` does),
    less :data:`SPARSE_SETUP_WORK`. Not positive where a sparse factor cannot pay, which
    callers check before assembling any sparse matrix.
    """
    reference = min(int(size), DENSE_VARIANCE_SIZE)
    return reference ** 3 / 3 + num_solves * reference ** 2 - SPARSE_SETUP_WORK


def sparse_factor_candidate(operator: object, num_solves: int) -> sp.csr_matrix | None:
    """The sparse form of a square operator whose sparse factor might beat a dense one, before any ordering.

    ``None`` where :func:`sparse_work_budget` leaves no room for a sparse factor, or where the
    form (:func:`sparse_form`) would hold more than a quarter of the dense entries; otherwise the
    form, for :func:`sparse_factor_ordering` to cost.

    :param operator: An unbatched square operator (a training covariance or a Gram).
    :param num_solves: Solves the factor would be for.
    :return: The float64 SciPy CSR form, or ``None``.
    """
    size = operator.shape[-1]
    if sparse_work_budget(size, num_solves) <= 0:
        return None
    return sparse_form(operator, max_entries=size * size // 4)


def sparse_factor_ordering(matrix: sp.csr_matrix, num_solves: int) -> np.ndarray | None:
    r"""The nested-dissection ordering of ``matrix`` where its sparse factor costs less than a dense one, else ``None``.

    The sparse factor's work is its symbolic cost (:func:`~gp_couple.sparse_factor.factor_cost`)
    and at most its entries per solve, weighted by :data:`SPARSE_WORK_COST`; it must be
    within :func:`sparse_work_budget`.

    :param matrix: A symmetric positive-definite SciPy sparse matrix.
    :param num_solves: Solves (or test rows' quadratic forms) the factor is for (a non-negative int).
    :raises ValueError: If ``matrix`` is not square or ``num_solves`` is negative.
    """
    num_solves = check_int("num_solves", num_solves, 0)
    budget = sparse_work_budget(matrix.shape[0], num_solves)
    if budget <= 0:
        return None
    cost = factor_cost(matrix, int(budget / SPARSE_WORK_COST))
    if cost is None or SPARSE_WORK_COST * (cost.multiply_adds + num_solves * cost.entries) > budget:
        return None
    return cost.order


def _sparse_moments(pair: _SparsePair, prior_diagonal: Tensor, residual: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Exact variances (and mean corrections) from a sparse LU factor of the training covariance."""
    factor = SparseFactor(pair.train, pair.order)
    cross = pair.cross
    device = prior_diagonal.device
    correction = torch.from_numpy(factor.inverse_quadratic_forms(cross)).to(device)
    variance = prior_diagonal.double() - correction
    shift = None
    if residual is not None:
        weights = factor.solve(residual.detach().double().cpu().numpy())
        shift = torch.from_numpy(np.asarray(cross @ weights, dtype=np.float64)).to(device)
    return variance, shift


def _krylov_rank_limit(size: int, num_test: int) -> int:
    """The largest Krylov rank whose float64 blocks (basis and image over the training points,
    projections over the test points) fit in :data:`KRYLOV_MEMORY_FRACTION` of the memory."""
    available = physical_memory()
    if available is None:
        return size
    return max(_BLOCK, int(KRYLOV_MEMORY_FRACTION * available / (8 * (2 * size + num_test))))


def _dense_moments(train_covariance: LinearOperator, cross: LinearOperator, prior_diagonal: Tensor,
                   residual: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Exact variances (and mean corrections) by a float64 Cholesky factor of the (unbatched) training covariance."""
    factor = dense_covariance(train_covariance, torch.float64)
    torch.linalg.cholesky(factor, out=factor)  # in place: one n x n float64 matrix
    weights = None if residual is None else torch.cholesky_solve(residual.double().unsqueeze(-1), factor)
    variance = prior_diagonal.double().clone()
    shift = None if residual is None else variance.new_empty(variance.shape)
    for start in range(0, cross.shape[-2], _TEST_CHUNK):
        rows = cross[start:start + _TEST_CHUNK, :].to_dense().double()
        solved = torch.linalg.solve_triangular(factor, rows.mT, upper=False)
        variance[start:start + _TEST_CHUNK] -= solved.square_().sum(0)
        if shift is not None:
            shift[start:start + _TEST_CHUNK] = (rows @ weights).squeeze(-1)
    return variance, shift


def _orthonormal(block: Tensor, basis: list[Tensor]) -> Tensor:
    """``block`` orthogonalised against ``basis`` (twice: classical Gram-Schmidt is stable so) and orthonormalised."""
    for _ in range(2):
        for previous in basis:
            block = block - previous @ (previous.mT @ block)
    q, r = torch.linalg.qr(block)
    # Directions the basis already spans (numerically) are dropped.
    keep = r.diagonal().abs() > 1e-10 * max(1.0, float(r.diagonal().abs().max()))
    return q[:, keep]


def _lanczos_variance(train_covariance: LinearOperator, cross: LinearOperator, prior_diagonal: Tensor,
                      noise_floor: float, tolerance: float,
                      generator: torch.Generator) -> tuple[Tensor, VarianceEstimate]:
    """Variances from a growing block Krylov subspace of the (unbatched) training covariance."""
    size = train_covariance.shape[-1]
    dtype = train_covariance.dtype
    device = train_covariance.device
    probes = torch.randperm(cross.shape[-2], generator=generator)[:_PROBES].to(device)
    selector = torch.zeros(cross.shape[-2], probes.numel(), dtype=dtype, device=device)
    selector[probes, torch.arange(probes.numel(), device=device)] = 1
    probe_rows = (cross.mT @ selector).double()    # k_* of the probe points, (n, s), by a product
    basis: list[Tensor] = []          # orthonormal blocks Q_j (float64)
    images: list[Tensor] = []         # A Q_j
    projections: list[Tensor] = []    # K_{*X} Q_j
    block = torch.randn(size, min(_BLOCK, size), generator=generator, dtype=torch.float64).to(device)
    block = _orthonormal(block, basis)
    limit = min(size, _krylov_rank_limit(size, cross.shape[-2]))
    check_at = min(_FIRST_CHECK, limit)
    while True:
        while block.shape[-1] and sum(q.shape[-1] for q in basis) < check_at:
            basis.append(block)
            image = (train_covariance @ block.to(dtype)).double()
            images.append(image)
            projections.append((cross @ block.to(dtype)).double())
            block = _orthonormal(image, basis)
        q = torch.cat(basis, dim=-1)
        projected = q.mT @ torch.cat(images, dim=-1)
        factor = torch.linalg.cholesky((projected + projected.mT) / 2)
        solved = torch.linalg.solve_triangular(factor, torch.cat(projections, dim=-1).mT, upper=False)
        variance = prior_diagonal.double() - solved.square().sum(0)
        rank = q.shape[-1]
        if rank >= size or not block.shape[-1]:
            return variance, VarianceEstimate("lanczos", rank, 0.0, True)
        # Galerkin solutions z = Q T^{-1} Q^T k for the probes; their quadratic-form error is
        # r^T A^{-1} r <= |r|^2 / lambda_min(A), and lambda_min(A) >= the noise variance.
        coefficients = torch.cholesky_solve(q.mT @ probe_rows, factor)
        residual = probe_rows - (train_covariance @ (q @ coefficients).to(dtype)).double()
        bound = residual.square().sum(0) / noise_floor
        remaining = variance[probes] - bound
        error = float(torch.where(remaining > 0, bound / remaining.clamp_min(1e-300),
                                  torch.full_like(bound, math.inf)).max())
        if error <= tolerance:
            return variance, VarianceEstimate("lanczos", rank, error, True)
        if rank >= limit:
            warnings.warn(
                f"the Krylov variances stopped at rank {rank} of {size}, the most that fits in "
                f"{KRYLOV_MEMORY_FRACTION:.0%} of this machine's memory, with an estimated relative error of "
                f"{error:.3g} (tolerance {tolerance:.3g}); they are too large by up to that much. Kernels with "
                "sparse Gram matrices (GRF kernels) get exact variances from variance='sparse'",
                VarianceToleranceWarning, stacklevel=4)
            return variance, VarianceEstimate("lanczos", rank, error, False)
        check_at = min(int(_GROWTH * rank), limit)


def posterior_variance(train_covariance: LinearOperator | Tensor, cross: LinearOperator | Tensor,
                       prior_diagonal: Tensor, noise_floor: float, *, method: str = "auto", tolerance: float = 0.01,
                       seed: int = 0,
                       residual: Tensor | None = None) -> tuple[Tensor, VarianceEstimate, Tensor | None]:
    r"""Latent posterior variances :math:`k(x_*, x_*) - \mathbf k_*^\top \mathbf A^{-1}\mathbf k_*`.

    :param train_covariance: :math:`\mathbf A = \mathbf K_{XX} + \sigma_n^2\mathbf I`,
        shape ``(*batch, n, n)``.
    :param cross: :math:`\mathbf K_{*X}`, shape ``(*batch, t, n)``.
    :param prior_diagonal: :math:`k(x_*, x_*)`, shape ``(*batch, t)``.
    :param noise_floor: A lower bound of the smallest eigenvalue of :math:`\mathbf A`
        (the smallest noise variance); the ``"lanczos"`` error bound divides by it.
    :param method: ``"auto"`` (up to :data:`DENSE_VARIANCE_SIZE` training points
        ``"sparse"`` where both operators have a :func:`sparse_form` and the sparse factor
        costs less than the dense one, :func:`sparse_factor_ordering`, else ``"dense"``;
        above, ``"sparse"`` where both have a :func:`sparse_form` whose factor allowance
        fits in half the physical memory, else ``"lanczos"``), ``"dense"``, ``"sparse"``
        or ``"lanczos"``.
    :param tolerance: Largest relative error the ``"lanczos"`` estimate may have.
    :param seed: Seed of the random start block of ``"lanczos"``.
    :param residual: :math:`\mathbf y - \boldsymbol\mu_X`, shape ``(*batch, n)``: the
        ``"dense"`` and ``"sparse"`` methods then also return the posterior mean correction
        :math:`\mathbf K_{*X}\mathbf A^{-1}(\mathbf y - \boldsymbol\mu_X)` from the same factor.
    :return: ``(variance, estimate, mean_shift)``: variances in float64 of shape
        ``(*batch, t)`` (clamped at zero), the :class:`VarianceEstimate` of the least
        accurate batch entry, and the mean correction in float64 (``None`` without
        ``residual`` or for ``"lanczos"``, whose caller solves for the mean itself).
    :raises ValueError: If ``method="sparse"`` and an operator has no sparse form.
    """
    train_covariance = to_linear_operator(train_covariance)
    cross = to_linear_operator(cross)
    size = train_covariance.shape[-1]
    batch_shape = torch.broadcast_shapes(train_covariance.batch_shape, cross.batch_shape, prior_diagonal.shape[:-1])
    train_covariance = train_covariance.expand(*batch_shape, size, size)
    cross = cross.expand(*batch_shape, *cross.shape[-2:])
    prior_diagonal = prior_diagonal.expand(*batch_shape, prior_diagonal.shape[-1])
    if residual is not None:
        residual = residual.expand(*batch_shape, size)
    entries = [tuple(index) for index in (
        torch.cartesian_prod(*(torch.arange(s) for s in batch_shape)).reshape(-1, len(batch_shape)).tolist()
        if batch_shape else [[]])]

    def sparse_pair(entry: tuple[int, ...]) -> _SparsePair | None:
        """Sparse forms of the entry's training covariance and cross-covariance, or ``None`` if either has none."""
        train = sparse_form(train_covariance[entry] if entry else train_covariance)
        cross_matrix = None if train is None else sparse_form(cross[entry] if entry else cross)
        return None if cross_matrix is None else _SparsePair(train, cross_matrix)

    # The method is chosen once, on the first batch entry: the entries share the operators' structure.
    pairs: dict[tuple[int, ...], _SparsePair | None] = {}
    if method == "auto" and (size <= DENSE_VARIANCE_SIZE or not noise_floor > 0):
        method, first = "dense", entries[0]
        # The cross-covariance is assembled only where the training side's sparse factor pays.
        train = sparse_factor_candidate(train_covariance[first] if first else train_covariance, cross.shape[-2])
        order = None if train is None else sparse_factor_ordering(train, cross.shape[-2])
        cross_matrix = None if order is None else sparse_form(cross[first] if first else cross)
        if cross_matrix is not None:
            method, pairs[first] = "sparse", _SparsePair(train, cross_matrix, order)
    elif method in ("auto", "sparse"):
        pairs[entries[0]] = sparse_pair(entries[0])
        if pairs[entries[0]] is None and method == "sparse":
            raise ValueError(f"variance='sparse' needs sparse kernel matrices (GRF kernels); "
                             f"{type(train_covariance).__name__} has none")
        if method == "auto":
            found = pairs[entries[0]]
            method = "sparse" if found is not None and _factor_fits(found.train) else "lanczos"
    variances: list[Tensor] = []
    shifts: list[Tensor] = []
    estimates: list[VarianceEstimate] = []
    generator = torch.Generator().manual_seed(int(seed))
    for entry in entries:
        if method == "sparse":
            pair = pairs.pop(entry) if entry in pairs else sparse_pair(entry)
            variance, shift = _sparse_moments(pair, prior_diagonal[entry],
                                              None if residual is None else residual[entry])
            variances.append(variance)
            shifts.extend([] if shift is None else [shift])
            estimates.append(VarianceEstimate("sparse", size, 0.0, True))
            continue
        if method == "dense":
            variance, shift = _dense_moments(train_covariance[entry], cross[entry], prior_diagonal[entry],
                                             None if residual is None else residual[entry])
            variances.append(variance)
            shifts.extend([] if shift is None else [shift])
            estimates.append(VarianceEstimate("dense", size, 0.0, True))
        else:
            variance, estimate = _lanczos_variance(train_covariance[entry], cross[entry], prior_diagonal[entry],
                                                   noise_floor, tolerance, generator)
            variances.append(variance)
            estimates.append(estimate)
    variance = torch.stack(variances).reshape(*batch_shape, -1).clamp_min(0.0)
    mean_shift = torch.stack(shifts).reshape(*batch_shape, -1) if shifts else None
    worst = max(estimates, key=lambda estimate: (not estimate.converged, estimate.relative_error))
    return variance, worst, mean_shift


def _factor_fits(matrix: sp.csr_matrix) -> bool:
    """Whether the sparse factor's allowance (:func:`factor_bytes_bound`) fits in half the physical memory."""
    available = physical_memory()
    return available is None or factor_bytes_bound(matrix) <= 0.5 * available


def check_variance_method(method: object, tolerance: object) -> float:
    """Validate the variance method and tolerance of a public entry point; return the tolerance.

    :raises ValueError: For an unknown method or a tolerance outside (0, 1).
    :raises TypeError: For a tolerance that is not a number.
    """
    if method not in VARIANCE_METHODS:
        raise ValueError(f"variance must be one of {list(VARIANCE_METHODS)}, got {method!r}")
    return check_fraction("variance_tolerance", tolerance)
