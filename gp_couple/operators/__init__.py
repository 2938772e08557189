"""Linear operators: GRF sparse features and Gram matrices, and matrix-free Chebyshev graph kernels."""

from __future__ import annotations

from ..sparse_pattern import CSRPattern, segment_sum
from .chebyshev import ChebyshevKernelLinearOperator
from .chebyshev_basis import ChebyshevBasis
from .chebyshev_series import ChebyshevExpansion, chebyshev_expansion
from .grf_gram import GRFGramLinearOperator
from .sparse_feature_operator import SparseFeatureLinearOperator
from .sparse_products import sparse_matmul

__all__ = [
    "ChebyshevBasis",
    "ChebyshevExpansion",
    "ChebyshevKernelLinearOperator",
    "chebyshev_expansion",
    "CSRPattern",
    "GRFGramLinearOperator",
    "SparseFeatureLinearOperator",
    "segment_sum",
    "sparse_matmul",
]
