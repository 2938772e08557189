r"""Reusing the pivots of gpytorch's pivoted-Cholesky preconditioner across training steps.

CG on :math:`\widehat{\mathbf K} + \sigma^2 I` (paper, appendix on GRF-GP details,
Appendix F "GRFs for GPs: additional details and experimental results" [app:grfs_for_gps]) is
preconditioned by gpytorch with a rank-:math:`m` pivoted Cholesky
factor :math:`\mathbf L` of :math:`\widehat{\mathbf K}`, rebuilt every Adam step. Given its
pivots :math:`P` (chosen greedily, one row of :math:`\widehat{\mathbf K}` per step), the
factor is the Nyström factor

.. math::

    \mathbf L = \widehat{\mathbf K}_{:, P}\, \mathbf C^{-\top}, \qquad
    \mathbf C \mathbf C^\top = \widehat{\mathbf K}_{P, P},

which is also what linear_operator's backward pass differentiates. The pivots depend on
the hyperparameters only through the ordering of residual diagonals, which moves
little between Adam steps, so under :class:`~gp_couple.settings.preconditioner_pivot_reuse`
(on in :func:`~gp_couple.settings.grf_gp_settings`) a Gram matrix
whose feature pattern already chose pivots keeps them while its diagonal (normalised
by its largest entry) moved by at most the tolerance, and computes :math:`\mathbf L` in
one block product. With the same pivots the factor is the same; with older pivots it
is another valid preconditioner: CG still stops at its tolerance and the stochastic
log-determinant (preconditioner term plus the probe estimate) stays unbiased.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..settings import preconditioner_pivot_reuse

if TYPE_CHECKING:
    from .grf_gram import GRFGramLinearOperator

__all__ = ["pivoted_cholesky", "preconditioner_pivot_reuse"]

_CACHE_KEY = "preconditioner_pivots"


def _nystrom_factor(gram: GRFGramLinearOperator, pivots: Tensor) -> Tensor:
    r""":math:`\widehat{\mathbf K}_{:, P}\,\mathrm{chol}(\widehat{\mathbf K}_{P,P})^{-\top}` (differentiable)."""
    columns = gram[torch.arange(gram.size(-2), device=gram.device).unsqueeze(-1), pivots.unsqueeze(-2)]
    factor = psd_safe_cholesky(columns[pivots, :])
    return torch.linalg.solve_triangular(factor, columns.mT, upper=False).mT


def pivoted_cholesky(gram: GRFGramLinearOperator, rank: int, error_tol: float | None,
                     compute: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The rank-``rank`` pivoted Cholesky factor of ``gram`` and its permutation, reusing pivots if allowed.

    :param gram: A symmetric, unbatched GRF Gram operator.
    :param rank: The factor's largest rank.
    :param error_tol: linear_operator's early-stopping tolerance (part of the cache key).
    :param compute: linear_operator's pivoted Cholesky, returning ``(factor, permutation)``.
    :return: ``(factor, permutation)`` as linear_operator returns them.
    """
    tolerance: Any = preconditioner_pivot_reuse.value()
    if tolerance is None:
        return compute()
    with torch.no_grad():
        diagonal = gram._diagonal()
        diagonal = diagonal / diagonal.max().clamp_min(torch.finfo(diagonal.dtype).tiny)
    cache = gram.left.pattern._cache
    memo = cache.get(_CACHE_KEY)
    if memo is not None and memo["key"] == (rank, error_tol, diagonal.dtype) \
            and float((diagonal - memo["diagonal"]).abs().max()) <= tolerance:
        return _nystrom_factor(gram, memo["pivots"]), memo["permutation"]
    factor, permutation = compute()
    cache[_CACHE_KEY] = {"key": (rank, error_tol, diagonal.dtype), "diagonal": diagonal,
                         "pivots": permutation[..., :factor.shape[-1]].clone(), "permutation": permutation.clone()}
    return factor, permutation
