"""GPyTorch kernels."""

from .random_features import CoupledRandomFeatureKernel, CoupledRFFKernel, CoupledRLFKernel, fit_coupling, gram_rmse
from .grf import ExactGraphKernel, GraphNodeKernel, GRFKernel
from .matrix_free import MatrixFreeGraphKernel

__all__ = [
    "CoupledRandomFeatureKernel",
    "CoupledRFFKernel",
    "CoupledRLFKernel",
    "fit_coupling",
    "gram_rmse",
    "ExactGraphKernel",
    "GraphNodeKernel",
    "GRFKernel",
    "MatrixFreeGraphKernel",
]
