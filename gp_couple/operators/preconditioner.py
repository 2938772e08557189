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

This module knows nothing of the operator: :meth:`GRFGramLinearOperator.pivoted_cholesky
<gp_couple.operators.grf_gram.GRFGramLinearOperator.pivoted_cholesky>` keeps a
:class:`PivotMemo` with its feature pattern, asks it for reusable pivots, and hands it the
pivots linear_operator chose otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..settings import preconditioner_pivot_reuse

__all__ = ["PivotMemo", "nystrom_factor", "preconditioner_pivot_reuse"]


def nystrom_factor(columns: Tensor, pivots: Tensor) -> Tensor:
    r""":math:`\widehat{\mathbf K}_{:, P}\,\mathrm{chol}(\widehat{\mathbf K}_{P,P})^{-\top}` (differentiable).

    :param columns: The pivot columns :math:`\widehat{\mathbf K}_{:, P}` (shape ``(n, m)``).
    :param pivots: The pivots :math:`P` (shape ``(m,)``).
    :return: The factor :math:`\mathbf L` (shape ``(n, m)``).
    """
    factor = psd_safe_cholesky(columns[pivots, :])
    return torch.linalg.solve_triangular(factor, columns.mT, upper=False).mT


class PivotMemo:
    """The pivots last chosen for the Gram matrix of one feature pattern, and when they may be reused.

    One memo lives with each feature pattern (the operator keeps it with
    :meth:`~gp_couple._derived.DerivedCache.derived`), so the operators that every
    training step builds on the same rows share it.
    """

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    @staticmethod
    def _normalised(diagonal: Tensor) -> Tensor:
        diagonal = diagonal.detach()
        return diagonal / diagonal.max().clamp_min(torch.finfo(diagonal.dtype).tiny)

    def reusable(self, diagonal: Tensor, rank: int, error_tol: float | None) -> tuple[Tensor, Tensor] | None:
        """The remembered pivots if reuse is on and the normalised diagonal moved within its tolerance.

        :param diagonal: The Gram matrix's diagonal now.
        :param rank: The factor's largest rank.
        :param error_tol: linear_operator's early-stopping tolerance.
        :return: ``(pivots, permutation)`` as remembered, or ``None`` (compute new pivots).
        """
        tolerance: Any = preconditioner_pivot_reuse.value()
        last = self._last
        if tolerance is None or last is None or last["key"] != (rank, error_tol, diagonal.dtype):
            return None
        if float((self._normalised(diagonal) - last["diagonal"]).abs().max()) > tolerance:
            return None
        return last["pivots"], last["permutation"]

    def remember(self, diagonal: Tensor, rank: int, error_tol: float | None, factor: Tensor,
                 permutation: Tensor) -> None:
        """Keep the pivots of a newly computed factor.

        :param diagonal: The Gram matrix's diagonal they were chosen on.
        :param rank: The factor's largest rank.
        :param error_tol: linear_operator's early-stopping tolerance.
        :param factor: The factor linear_operator computed (its width is the number of pivots).
        :param permutation: Its permutation (pivots first).
        """
        self._last = {"key": (rank, error_tol, diagonal.dtype), "diagonal": self._normalised(diagonal),
                      "pivots": permutation[..., :factor.shape[-1]].clone(), "permutation": permutation.clone()}
