"""gp_couple: variance-reducing couplings for random features, for GPyTorch and Pyro.

Implements Reid et al., "Variance-Reducing Couplings for Random Features" (ICLR 2025).

Graph half: :class:`Graph` → walk-length coupling (:mod:`gp_couple.couplings`) → compiled
walk sampler (:mod:`gp_couple.features`) → sparse features → :class:`GRFKernel` (a
gpytorch kernel returning a sparse :class:`~gp_couple.operators.GRFGramLinearOperator`)
→ :class:`GraphGP` → evaluators (:mod:`gp_couple.evaluation`).

Euclidean half: frequency couplings → random Fourier / Laplace features →
:class:`CoupledRFFKernel` / :class:`CoupledRLFKernel` (low-rank operators).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public names by the submodule that defines them. They are imported on first use
#: (PEP 562), so that ``import gp_couple`` and ``gp-couple --help`` do not load torch,
#: gpytorch and numba until something needs them; ``from gp_couple import GRFKernel``
#: works as usual. Add a new public name here.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "graphs": ("Graph", "grid_graph", "icosphere_graph"),
    "kernel_families": ("Diffusion", "RegularisedLaplacian", "PStepRandomWalk", "InverseCosine", "PowerSeries",
                        "KernelFamily", "get_kernel_family"),
    # Every public coupling of the four families (each family's classes and its lookup by name);
    # tests/test_exports.py checks that every registered built-in class is here.
    "couplings": ("WalkLengthCoupling", "PairedWalkLengthCoupling", "IIDWalkLengthCoupling",
                  "AntitheticWalkLengthCoupling", "SigmaCoupling", "get_walk_length_coupling",
                  "NeighbourProposal", "UniformProposal", "WeightedProposal", "get_proposal",
                  "DirectionCoupling", "IndependentDirections", "RepellingDirections", "get_direction_coupling",
                  "FrequencyCoupling", "OrthogonalNormCoupling", "IIDFrequencyCoupling", "HaltonCoupling",
                  "SobolCoupling", "OrthogonalCoupling", "PairwiseNormCoupling", "PositiveMonotoneCoupling",
                  "GaussianCopulaCoupling", "AntitheticFrequencyCoupling", "get_frequency_coupling"),
    "features.sigma_fit": ("fit_sigma_coupling",),
    "kernels": ("GRFKernel", "ExactGraphKernel", "MatrixFreeGraphKernel", "CoupledRFFKernel",
                "CoupledRLFKernel", "WalkSchedule", "fit_coupling"),
    "operators": ("GRFGramLinearOperator", "SparseFeatureLinearOperator"),
    "marginal_likelihood": ("DenseMarginalLogLikelihood",),
    "models": ("GraphGP", "Prediction", "fit_gp", "predict"),
    "recipes": ("fit_graph_gp", "fit_graph_kernel", "fit_grf_gp"),
    "optimize": ("Convergence",),
    "variational": ("GraphVariationalGP",),
    "settings": ("GRFGPSettings", "grf_gp_settings"),
    "bayes": ("run_nuts", "load_samples", "posterior_predictive"),
}
_SOURCE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [*_SOURCE, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _SOURCE:
        value = getattr(importlib.import_module(f".{_SOURCE[name]}", __name__), name)
    else:
        try:  # a submodule, e.g. gp_couple.couplings after a plain ``import gp_couple``
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
