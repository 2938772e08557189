"""GPyTorch kernels."""

from .exact_graph import ExactGraphKernel
from .graph_node import GraphNodeKernel
from .grf_kernel import GRFKernel
from .matrix_free import MatrixFreeGraphKernel
from .random_features import CoupledRandomFeatureKernel, CoupledRFFKernel, CoupledRLFKernel, fit_coupling, gram_rmse
from .walk_schedule import WalkSchedule

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
    "WalkSchedule",
]
