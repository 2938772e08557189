r"""The matching problem behind :math:`\sigma`-couplings (paper, Section 4.1 "Approximating and
solving the OT problem for GRFs" [sec:approximating_and_solving_grfs_ot]).

Both objectives approximate the variance of an estimator built from a pair of walkers
whose length quantiles are matched by a permutation :math:`\sigma` of :math:`n` bins,
and reduce to a linear assignment problem solved exactly by
``scipy.optimize.linear_sum_assignment``.

**Graph random features** (paper, eq. (56), the tractable matching problem, Appendix C.3
[eq:tractable_ot_formulation], the :math:`q_1 = q_2` approximation of Appendix C.3 "Approximating
the OT problem" [app:what_are_the_approximations]). With :math:`\widehat\psi(q, i)` the average
projection of walks from node :math:`i` whose length lies in quantile bin :math:`q`,
estimated by simulation,

.. math::

    C[q, q'] = \sum_{i, j} \Big[\big(\widehat\psi(q, i) + \widehat\psi(q', i)\big)^\top
               \big(\widehat\psi(q, j) + \widehat\psi(q', j)\big)\Big]^2
             = \big\| A_{qq'} A_{qq'}^\top \big\|_F^2,
    \qquad A_{qq'} = \widehat\Psi_q + \widehat\Psi_{q'},

and :math:`\sigma = \arg\min_\sigma \sum_q C[q, \sigma(q)]`.

**PageRank** (paper, eq. (82), the PageRank matching problem, Appendix E.2 [eq:matching_pagerank]):
with :math:`H_q[j, i]` the probability that a walk from
:math:`j` with length in bin :math:`q` ends at :math:`i`,
:math:`C[q, q'] = \sum_{i, j} H_q[j, i]\, H_{q'}[j, i]`.

This module holds what needs no walks: the length bins, the GRF cost from given
projections, the assignment and the fitting graph. Estimating the costs needs the walk
sampler, which sits downstream of the couplings, so the fitting functions
(:func:`~gp_couple.features.sigma_fit.fit_sigma_coupling`,
:func:`~gp_couple.features.sigma_fit.fit_pagerank_sigma_coupling`) live in
:mod:`gp_couple.features.sigma_fit`.

The paper fits on an Erdős–Rényi graph with :math:`N = 100` nodes and transfers the
permutation to other graphs (:func:`default_fitting_graph`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..graphs import Graph, erdos_renyi_graph
from .walk_lengths import SigmaCoupling, geometric_quantile

__all__ = [
    "grf_matching_cost",
    "quantile_bin_lengths",
    "default_fitting_graph",
    "sigma_coupling_from_cost",
]


def default_fitting_graph(num_nodes: int = 100, edge_probability: float = 0.1, seed: int = 0) -> Graph:
    """The paper's fitting graph: an Erdős–Rényi graph (:func:`gp_couple.graphs.erdos_renyi_graph`)."""
    return erdos_renyi_graph(num_nodes, edge_probability, seed)


def quantile_bin_lengths(bin_index: int, order: int, shape: tuple[int, ...], p_halt: float,
                         rng: np.random.Generator) -> np.ndarray:
    r"""Geometric lengths :math:`F^{-1}(u)` with :math:`u \sim U((q-1)/n, q/n]` for 0-based bin ``q - 1``."""
    u = (bin_index + rng.random(shape)) / order
    return geometric_quantile(np.minimum(u, np.nextafter(1.0, 0.0)), p_halt)


def grf_matching_cost(projections: np.ndarray) -> np.ndarray:
    r"""The linear matching cost :math:`C[q, q'] = \|A_{qq'}A_{qq'}^\top\|_F^2` (paper, eq. (56),
    the tractable matching problem, Appendix C.3 [eq:tractable_ot_formulation]).

    :param projections: :math:`\widehat\Psi_q`, shape ``(order, rows, N)``.
    """
    psi = torch.as_tensor(projections, dtype=torch.float64)
    order, rows, columns = psi.shape
    cost = torch.empty(order, order, dtype=torch.float64)
    for q in range(order):
        # A_{qq'} = A_{q'q}: the cost is symmetric, so row q needs only q' >= q.
        summed = psi[q].unsqueeze(0) + psi[q:]
        # ||A A^T||_F = ||A^T A||_F (both are the sum of the fourth powers of A's singular values).
        gram = summed @ summed.mT if rows <= columns else summed.mT @ summed
        cost[q, q:] = (gram**2).sum(dim=(1, 2))
        cost[q + 1:, q] = cost[q, q + 1:]
    return cost.numpy()


def sigma_coupling_from_cost(cost: np.ndarray, p_halt: float, metadata: dict[str, Any]) -> SigmaCoupling:
    r"""The :math:`\sigma`-coupling minimising :math:`\sum_q C[q, \sigma(q)]` (exact linear assignment).

    :param cost: Square matching cost :math:`C`, shape ``(order, order)``.
    :param p_halt: Termination probability of the coupling.
    :param metadata: Provenance; the optimal and the identity costs are added as
        ``"cost"`` and ``"identity_cost"``.
    :return: The coupling, with ``metadata``.
    """
    rows, permutation = linear_sum_assignment(cost)
    return SigmaCoupling(permutation[np.argsort(rows)], p_halt=p_halt, metadata={
        **metadata, "cost": float(cost[rows, permutation].sum()),
        "identity_cost": float(np.trace(cost))})
