"""Linear operators: GRF sparse features and Gram matrices, and matrix-free Chebyshev graph kernels."""

from __future__ import annotations

from .chebyshev import ChebyshevBasis, ChebyshevExpansion, ChebyshevKernelLinearOperator, chebyshev_expansion
from .csr_pattern import CSRPattern, segment_sum
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
