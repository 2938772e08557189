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

from .couplings import (
    AntitheticCoupling,
    AntitheticTermination,
    FrequencyCoupling,
    GaussianCopulaCoupling,
    IIDLengths,
    PairwiseNormCoupling,
    SigmaCoupling,
    WalkLengthCoupling,
    get_frequency_coupling,
)
from .graphs import Graph, grid_graph, icosphere_graph
from .kernels import CoupledRFFKernel, CoupledRLFKernel, ExactGraphKernel, GRFKernel, fit_coupling
from .models import GraphGP, fit_gp, predict
from .modulation import Diffusion, InverseCosine, PowerSeries, PStepRandomWalk, RegularisedLaplacian
from .operators import GRFGramLinearOperator, SparseFeatureLinearOperator
from .settings import GRFGPSettings, grf_gp_settings

__version__ = "0.1.0"

__all__ = [
    "Graph",
    "grid_graph",
    "icosphere_graph",
    "Diffusion",
    "RegularisedLaplacian",
    "PStepRandomWalk",
    "InverseCosine",
    "PowerSeries",
    "WalkLengthCoupling",
    "IIDLengths",
    "AntitheticTermination",
    "SigmaCoupling",
    "GRFKernel",
    "ExactGraphKernel",
    "FrequencyCoupling",
    "PairwiseNormCoupling",
    "GaussianCopulaCoupling",
    "AntitheticCoupling",
    "get_frequency_coupling",
    "CoupledRFFKernel",
    "CoupledRLFKernel",
    "fit_coupling",
    "GRFGramLinearOperator",
    "SparseFeatureLinearOperator",
    "GraphGP",
    "fit_gp",
    "predict",
    "GRFGPSettings",
    "grf_gp_settings",
    "__version__",
]
