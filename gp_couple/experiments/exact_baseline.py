r"""The exact graph GP fitted by its own maximum likelihood: the baseline of the graph-GP experiments.

The protocol of :mod:`gp_couple.experiments.graph_gp` evaluates the exact kernel *at the
hyperparameters the GRF-GP trained*; that measures the GRF approximation, not how well
an exact GP would do. This module fits the exact GP of a graph kernel family from
scratch, maximising its marginal likelihood

.. math::

    \log p(\mathbf y \mid \kappa, \theta, \sigma_n^2) = -\tfrac12 \mathbf y^\top
    (\kappa \mathbf K_\theta + \sigma_n^2 \mathbf I)^{-1}\mathbf y
    - \tfrac12 \log\det(\kappa \mathbf K_\theta + \sigma_n^2 \mathbf I) - \tfrac n2 \log 2\pi

with L-BFGS from several starting values of the kernel's range hyperparameter, and keeps
the best restart. :math:`\mathbf K_\theta = U g_\theta(\Lambda) U^\top` comes from one
eigendecomposition of :math:`\widetilde{\mathbf W}` (:func:`gp_couple.exact.normalized_adjacency_eigh`),
so each likelihood evaluation costs one Cholesky factorisation of the training block:
cheap for graphs of a few thousand nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..evaluation import gp_posterior, nlpd, rmse
from ..exact import exact_kernel_matrix, normalized_adjacency_eigh
from ..graphs import Graph
from ..kernel_families import KernelFamily, get_kernel_family
from ..optimize import Convergence, minimize

__all__ = ["ExactFit", "RANGE_HYPERPARAMETERS", "fit_exact_gp", "kernel_family_at", "exact_predictions"]

#: The hyperparameter that sets each family's range, and the values restarts start from.
RANGE_HYPERPARAMETERS: dict[str, tuple[str, tuple[float, ...]]] = {
    "diffusion": ("gamma", (1.0, 4.0, 16.0)),
    "regularised-laplacian": ("sigma", (1.0, 4.0, 16.0)),
    "p-step": ("alpha", (2.01, 3.0, 10.0)),
}

#: Starting outputscale and noise (targets are standardised).
_INITIAL_OUTPUTSCALE = 1.0
_INITIAL_NOISE = 0.1
_LBFGS_ITERATIONS = 500
#: Each restart's stopping rule: the negative log-likelihood per point changed by at most
#: 1e-10 and no parameter moved by more than 1e-6.
_CONVERGENCE = Convergence(loss_tolerance=1e-10, parameter_tolerance=1e-6)


@dataclass(frozen=True)
class ExactFit:
    """The exact GP's maximum-likelihood hyperparameters (best of the restarts).

    :ivar family_name: Kernel family name.
    :ivar hyperparameters: The family's hyperparameters (e.g. ``{"gamma": 8.06}``).
    :ivar outputscale: :math:`\\kappa`.
    :ivar noise: :math:`\\sigma_n^2` (standardised units).
    :ivar negative_log_likelihood: :math:`-\\log p(\\mathbf y)` in nats (total, not per point).
    :ivar restarts: Per restart: the starting value and where it ended.
    """

    family_name: str
    hyperparameters: dict[str, Any]
    outputscale: float
    noise: float
    negative_log_likelihood: float
    restarts: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for reports."""
        return asdict(self)


def kernel_family_at(family_name: str, hyperparameters: dict[str, Any]) -> KernelFamily:
    """The float64 kernel family ``family_name`` with exactly these hyperparameter values.

    Values are set after the conversion to float64, so they are not rounded to float32.
    """
    family = get_kernel_family(family_name).double()
    for name, value in hyperparameters.items():
        setattr(family, name, value)
    return family


def fit_exact_gp(graph: Graph, family_name: str, train_nodes: np.ndarray, train_targets: np.ndarray, *,
                 initial_values: Sequence[float] | None = None) -> ExactFit:
    r"""Fit :math:`\kappa`, the kernel's hyperparameters and :math:`\sigma_n^2` by exact maximum likelihood.

    One L-BFGS-B run (:func:`gp_couple.optimize.minimize`, to a tight stopping rule) per
    starting value of the family's range hyperparameter (:data:`RANGE_HYPERPARAMETERS`);
    the run with the highest likelihood wins. Parameters are optimised through the kernel's
    own gpytorch constraints, and :math:`\kappa, \sigma_n^2` through their logarithms.

    :param graph: The graph (dense eigendecomposition: a few thousand nodes at most).
    :param family_name: ``"diffusion"``, ``"regularised-laplacian"`` or ``"p-step"``.
    :param train_nodes: Training node indices.
    :param train_targets: Their (standardised) targets.
    :param initial_values: Starting values of the range hyperparameter (default: the
        family's in :data:`RANGE_HYPERPARAMETERS`).
    :return: The best fit and every restart's outcome.
    :raises ValueError: For an unknown family or when every restart fails.
    """
    if family_name not in RANGE_HYPERPARAMETERS:
        raise ValueError(f"family_name must be one of {sorted(RANGE_HYPERPARAMETERS)}, got {family_name!r}")
    name, defaults = RANGE_HYPERPARAMETERS[family_name]
    starts = tuple(defaults if initial_values is None else initial_values)
    eigenvalues, eigenvectors = normalized_adjacency_eigh(graph)
    basis = eigenvectors[torch.as_tensor(np.asarray(train_nodes, dtype=np.int64))]
    targets = torch.as_tensor(np.asarray(train_targets, dtype=np.float64))
    restarts, best = [], None
    for start in starts:
        outcome = _lbfgs_restart(family_name, {name: float(start)}, eigenvalues, basis, targets)
        restarts.append({f"initial_{name}": float(start), **outcome})
        if math.isfinite(outcome["negative_log_likelihood"]) and (
                best is None or outcome["negative_log_likelihood"] < best["negative_log_likelihood"]):
            best = outcome
    if best is None:
        raise ValueError(f"every exact-GP restart failed for the {family_name} kernel: {restarts}")
    return ExactFit(family_name=family_name, hyperparameters=best["hyperparameters"], outputscale=best["outputscale"],
                    noise=best["noise"], negative_log_likelihood=best["negative_log_likelihood"],
                    restarts=restarts)


def _negative_log_likelihood(family: KernelFamily, log_scale: torch.Tensor, log_noise: torch.Tensor,
                             eigenvalues: torch.Tensor, basis: torch.Tensor,
                             targets: torch.Tensor) -> torch.Tensor:
    spectrum = log_scale.exp() * family.spectrum(eigenvalues).reshape(-1)
    covariance = (basis * spectrum) @ basis.T
    covariance = covariance + log_noise.exp() * torch.eye(len(targets), dtype=covariance.dtype)
    factor = _cholesky(covariance)
    if factor is None:
        return torch.tensor(math.inf, dtype=covariance.dtype)
    alpha = torch.cholesky_solve(targets.unsqueeze(-1), factor).squeeze(-1)
    return (0.5 * targets @ alpha + torch.log(torch.diagonal(factor)).sum()
            + 0.5 * len(targets) * math.log(2 * math.pi))


def _cholesky(covariance: torch.Tensor) -> torch.Tensor | None:
    """The Cholesky factor of ``covariance``, with a jitter of relative size 1e-12 to 1e-6
    of its mean diagonal when it is numerically singular; ``None`` when even that fails.

    A line search may probe absurd hyperparameters (amplitudes of 10^16): a finite, large
    loss there, with its gradient, lets it step back, where an infinite one stops it.
    """
    factor, info = torch.linalg.cholesky_ex(covariance)
    scale = covariance.diagonal().mean().detach()
    for relative in (1e-12, 1e-10, 1e-8, 1e-6):
        if not bool(info):
            return factor
        jittered = covariance + relative * scale * torch.eye(len(covariance), dtype=covariance.dtype)
        factor, info = torch.linalg.cholesky_ex(jittered)
    return None if bool(info) else factor


def _lbfgs_restart(family_name: str, start: dict[str, float], eigenvalues: torch.Tensor, basis: torch.Tensor,
                   targets: torch.Tensor) -> dict[str, Any]:
    family = kernel_family_at(family_name, start)
    # log-parameterised: maximum-likelihood amplitudes span 10^-1 to 10^5 (a regularised
    # Laplacian with a large sigma is tiny), far beyond what L-BFGS's box allows softplus.
    log_scale = torch.nn.Parameter(torch.tensor(math.log(_INITIAL_OUTPUTSCALE), dtype=torch.float64))
    log_noise = torch.nn.Parameter(torch.tensor(math.log(_INITIAL_NOISE), dtype=torch.float64))
    parameters = {**dict(family.named_parameters()), "log_outputscale": log_scale, "log_noise": log_noise}
    try:
        # Per point, like gpytorch's marginal log-likelihood: L-BFGS-B's first step is the whole
        # gradient, which for the total over thousands of points leaps far beyond the optimum.
        history = minimize(lambda: _negative_log_likelihood(family, log_scale, log_noise, eigenvalues, basis,
                                                            targets) / len(targets),
                           parameters, iterations=_LBFGS_ITERATIONS, optimizer="lbfgs", convergence=_CONVERGENCE,
                           seed=0, num_data=len(targets))
        with torch.no_grad():
            value = float(_negative_log_likelihood(family, log_scale, log_noise, eigenvalues, basis, targets))
    except (RuntimeError, ValueError, FloatingPointError) as error:  # e.g. a constraint violation
        return {"negative_log_likelihood": math.inf, "error": str(error)}
    with torch.no_grad():
        return {"hyperparameters": family.hyperparameters(), "outputscale": float(log_scale.exp()),
                "noise": float(log_noise.exp()), "negative_log_likelihood": value,
                "iterations": len(history) - 1, "converged": history.converged}


def exact_predictions(graph: Graph, kernel_family: KernelFamily, outputscale: float, noise: float,
                      train_nodes: np.ndarray, test_nodes: np.ndarray, standardised: np.ndarray,
                      shift: float, scale: float) -> dict[str, float]:
    """Test RMSE and NLPD of the exact GP at given hyperparameters, in the targets' units.

    :param standardised: Standardised targets at every node (``(values - shift) / scale``).
    """
    with torch.no_grad():
        gram = outputscale * exact_kernel_matrix(kernel_family, graph).numpy()
    posterior = gp_posterior(gram, train_nodes, test_nodes, standardised[train_nodes], noise)
    observed = standardised[test_nodes] * scale + shift
    return {"test_rmse": rmse(posterior.mean * scale + shift, observed),
            "test_nlpd": nlpd(posterior.mean * scale + shift, posterior.variance * scale**2, observed)}
