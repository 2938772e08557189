r"""Differentiable products of a sparse feature matrix (fixed pattern, learnable values) with dense matrices.

For :math:`\Phi` with pattern :math:`P` and values :math:`v` (paper, appendix on GRF
approximation: :math:`\Phi(\theta) = \sum_t f_\theta(t)\Phi_t`, so only the values
depend on :math:`\theta`):

.. math::

    \frac{\partial \langle G, \Phi X\rangle}{\partial v_{(r, c)}} = \sum_k G_{rk} X_{ck},
    \qquad
    \frac{\partial \langle G, \Phi X\rangle}{\partial X} = \Phi^\top G ,

so the gradient with respect to the values is a *sampled* dense-dense product on the
pattern (never an :math:`R \times C` matrix) and the gradient with respect to the
right-hand side is a product with :math:`\Phi^\top`.

Products by :math:`\Phi^\top` use the cached transposed pattern
(:meth:`~gp_couple.sparse_pattern.CSRPattern.transpose`) and the transposed
values, which callers gather once per set of values (``transposed_values``). On the
CPU the products run in SciPy's CSR routines and the sampled products in a compiled loop
over the pattern: torch's own CPU CSR routines cost several times more on these wide,
short-row matrices (4-80x on the transposed ones; ``benchmarks/bench_products.py``).
Other devices use torch's CSR routines.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from ..sparse_pattern import CSRPattern

__all__ = ["on_scipy", "sampled_dots", "scipy_matrix", "sparse_matmul", "spmm"]

#: Value dtypes that SciPy's sparse kernels multiply natively.
_SCIPY_DTYPES = (torch.float32, torch.float64)


def _broadcast_batch(*shapes: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError as error:
        raise ValueError(f"batch shapes {[tuple(s) for s in shapes]} do not broadcast") from error


def _reduce_to(tensor: Tensor, shape: torch.Size) -> Tensor:
    """Sum broadcast dimensions so that ``tensor`` has ``shape`` (expanding if needed)."""
    full = torch.broadcast_shapes(tensor.shape, shape)
    return tensor.expand(full).sum_to_size(shape)


def on_scipy(values: Tensor) -> bool:
    """Whether products with these values run in SciPy's sparse kernels (CPU, float32 or float64)."""
    return values.device.type == "cpu" and values.dtype in _SCIPY_DTYPES


# -------------------------------------------------------------------- CPU kernels
def _scipy_indices(pattern: CSRPattern) -> tuple[np.ndarray, np.ndarray]:
    """The pattern's index arrays in the dtype SciPy keeps (so no product copies them)."""
    def build() -> tuple[np.ndarray, np.ndarray]:
        template = scipy.sparse.csr_array(
            (np.zeros(pattern.nnz, dtype=np.float32), pattern.columns.cpu().numpy(),
             pattern.row_pointer.cpu().numpy()), shape=tuple(pattern.shape))
        return template.indptr, template.indices

    return pattern.derived("scipy_indices", build)


def scipy_matrix(pattern: CSRPattern, values: Tensor) -> Any:
    """The CSR matrix ``(pattern, values)`` as a SciPy array on the same memory."""
    indptr, indices = _scipy_indices(pattern)
    return scipy.sparse.csr_array((values.detach().numpy(), indices, indptr), shape=tuple(pattern.shape),
                                  copy=False)


def _compiled_sampled_dots() -> Any:
    # Imported lazily: numba compiles on first use, and only CPU backward passes need it.
    from ._sampled_dots_compiled import sampled_dots_rows

    return sampled_dots_rows


# -------------------------------------------------------------------- forward products
def _single_product(pattern: CSRPattern, values: Tensor, rhs: Tensor, transpose: bool,
                    transposed_values: Tensor | None) -> Tensor:
    """One 2-D product ``Phi @ rhs`` or ``Phi^T @ rhs`` (``values`` 1-D, ``rhs`` ``(C, k)``)."""
    if transpose:
        # Phi^T as a CSR matrix of its own (not Phi's arrays read as CSC): a CSC product
        # scatters into the tall output, which cost twice as much on GRF patterns.
        pattern, permutation = pattern.transpose()
        values = values[..., permutation] if transposed_values is None else transposed_values
    if on_scipy(values):
        return torch.from_numpy(np.asarray(scipy_matrix(pattern, values) @ rhs.detach().contiguous().numpy()))
    return pattern.csr(values) @ rhs


def spmm(pattern: CSRPattern, values: Tensor, rhs: Tensor, *, transpose: bool = False,
         transposed_values: Tensor | None = None) -> Tensor:
    r""":math:`\Phi\,X` (or :math:`\Phi^\top X`) without autograd.

    :param pattern: The :math:`R \times C` pattern of :math:`\Phi`.
    :param values: Values, ``(*vb, nnz)``.
    :param rhs: ``(*rb, C, k)`` (``(*rb, R, k)`` when ``transpose``).
    :param transpose: Multiply by :math:`\Phi^\top`.
    :param transposed_values: ``values[..., permutation]`` of :meth:`CSRPattern.transpose`
        if the caller caches them (otherwise they are gathered here).
    :return: ``(*broadcast, R, k)`` (``(*broadcast, C, k)`` when ``transpose``).
    """
    num_out = pattern.num_columns if transpose else pattern.num_rows
    if values.ndim == 1:
        # One sparse product for every right-hand side: fold rhs batches into columns.
        # Explicit batch counts: -1 is ambiguous when a product is empty (no shared nodes).
        lead, (inner, width) = rhs.shape[:-2], rhs.shape[-2:]
        count = math.prod(lead)
        flat = rhs.reshape(count, inner, width).transpose(0, 1).reshape(inner, count * width)
        out = _single_product(pattern, values, flat, transpose, transposed_values)
        return out.reshape(num_out, count, width).transpose(0, 1).reshape(*lead, num_out, width)
    batch = _broadcast_batch(values.shape[:-1], rhs.shape[:-2])
    values = values.expand(*batch, pattern.nnz)
    if transposed_values is not None:
        transposed_values = transposed_values.expand(*batch, pattern.nnz)
    rhs = rhs.expand(*batch, *rhs.shape[-2:])
    out = rhs.new_empty(*batch, num_out, rhs.shape[-1])
    for index in itertools.product(*(range(size) for size in batch)):
        out[index] = _single_product(pattern, values[index], rhs[index], transpose,
                                     None if transposed_values is None else transposed_values[index])
    return out


# -------------------------------------------------------------------- sampled products
def _sampled_pair(pattern: CSRPattern, left: Tensor, right: Tensor) -> Tensor:
    """Entry ``u = (r, c)``: ``left[r] . right[c]`` for 2-D ``left`` ``(R, k)``, ``right`` ``(C, k)``."""
    if on_scipy(left) and left.dtype == right.dtype and not torch.is_grad_enabled():
        indptr, indices = _scipy_indices(pattern)
        out = np.empty(pattern.nnz, dtype=left.detach().numpy().dtype)
        _compiled_sampled_dots()(indptr, indices, left.detach().contiguous().numpy(),
                                 right.detach().contiguous().numpy(), out)
        return torch.from_numpy(out)
    zeros = pattern.csr(left.new_zeros(pattern.nnz))
    return torch.sparse.sampled_addmm(zeros, left.contiguous(), right.t().contiguous(), beta=0.0).values()


def sampled_dots(pattern: CSRPattern, left: Tensor, right: Tensor, shape: torch.Size) -> Tensor:
    r"""Gradient of :math:`\langle L, \Phi R\rangle` w.r.t. the values, reduced to ``shape``.

    Entry ``u = (r, c)`` is :math:`\sum_k L_{rk} R_{ck}` (summed over batches that the
    values broadcast over): a sampled dense-dense product that never forms the
    :math:`R \times C` matrix.

    :param pattern: The pattern of :math:`\Phi`.
    :param left: ``(*b1, R, k)``.
    :param right: ``(*b2, C, k)``.
    :param shape: The values' shape ``(*vb, nnz)``.
    :return: A tensor of ``shape``.
    """
    batch = _broadcast_batch(left.shape[:-2], right.shape[:-2])
    if len(shape) == 1:
        # Unbatched values: the batch sum folds into the inner dimension.
        left = left.expand(*batch, *left.shape[-2:]).movedim(-2, 0).reshape(pattern.num_rows, -1)
        right = right.expand(*batch, *right.shape[-2:]).movedim(-2, 0).reshape(pattern.num_columns, -1)
        return _sampled_pair(pattern, left, right)
    batch = _broadcast_batch(batch, shape[:-1])
    left = left.expand(*batch, *left.shape[-2:])
    right = right.expand(*batch, *right.shape[-2:])
    out = left.new_empty(*batch, pattern.nnz)
    for index in itertools.product(*(range(size) for size in batch)):
        out[index] = _sampled_pair(pattern, left[index], right[index])
    return _reduce_to(out, shape)


# -------------------------------------------------------------------- autograd
class _SparseMatmul(torch.autograd.Function):
    r""":math:`\Phi X` or :math:`\Phi^\top X` with gradients w.r.t. both the values and :math:`X`."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, rhs: Tensor, pattern: CSRPattern, transpose: bool,
                transposed_values: Tensor | None) -> Tensor:
        ctx.pattern, ctx.transpose, ctx.transposed_values = pattern, transpose, transposed_values
        ctx.save_for_backward(values, rhs)
        return spmm(pattern, values, rhs, transpose=transpose, transposed_values=transposed_values)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        values, rhs = ctx.saved_tensors
        pattern, transpose = ctx.pattern, ctx.transpose
        grad_values = grad_rhs = None
        if ctx.needs_input_grad[0]:
            # Phi X pairs rows of G with rows of X; Phi^T X pairs rows of X with rows of G.
            left, right = (rhs, grad_output) if transpose else (grad_output, rhs)
            grad_values = sampled_dots(pattern, left, right, values.shape)
        if ctx.needs_input_grad[1]:
            # Through apply, so that a double backward stays differentiable in grad_output.
            grad_rhs = _reduce_to(_SparseMatmul.apply(values, grad_output, pattern, not transpose,
                                                      ctx.transposed_values), rhs.shape)
        return grad_values, grad_rhs, None, None, None


def sparse_matmul(pattern: CSRPattern, values: Tensor, rhs: Tensor, *, transpose: bool = False,
                  transposed_values: Tensor | None = None) -> Tensor:
    """Differentiable product of the CSR matrix ``(pattern, values)`` (or its transpose) with dense ``rhs``.

    :param pattern: The :math:`R \\times C` pattern.
    :param values: Values, shape ``(*batch, nnz)``.
    :param rhs: Dense ``(*batch2, C, k)`` or ``(*batch2, C)`` (``R`` rows when ``transpose``).
    :param transpose: Multiply by the transpose of the matrix.
    :param transposed_values: Cached ``values[..., pattern.transpose()[1]]`` (optional;
        saves a gather of the values per product).
    :return: ``(*broadcast, R, k)`` (or ``(*broadcast, R)`` for a vector ``rhs``; ``C``
        rows when ``transpose``).
    :raises TypeError: If ``rhs`` and ``values`` have different dtypes.
    :raises ValueError: If the inner dimensions do not match.
    """
    if rhs.dtype != values.dtype:
        raise TypeError(f"rhs has dtype {rhs.dtype} but the sparse matrix has dtype {values.dtype}")
    vector = rhs.ndim == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    inner = pattern.num_rows if transpose else pattern.num_columns
    if rhs.shape[-2] != inner:
        shape = tuple(pattern.shape)[::-1] if transpose else tuple(pattern.shape)
        raise ValueError(f"cannot multiply a {shape} matrix with rhs of shape {tuple(rhs.shape)}")
    out = _SparseMatmul.apply(values, rhs, pattern, bool(transpose), transposed_values)
    return out.squeeze(-1) if vector else out
