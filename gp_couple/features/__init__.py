"""Random features: graph random features from compiled random walks, and RFF/RLF maps."""

from .fourier import gaussian_kernel, random_fourier_features, random_laplace_features
from .graph_random_features import GraphRandomFeatures, gram_estimate
from .walks import WalkSteps, sample_walk_endpoints, sample_walks, walk_with_lengths

__all__ = [
    "GraphRandomFeatures",
    "WalkSteps",
    "sample_walks",
    "walk_with_lengths",
    "sample_walk_endpoints",
    "gram_estimate",
    "random_fourier_features",
    "random_laplace_features",
    "gaussian_kernel",
]
