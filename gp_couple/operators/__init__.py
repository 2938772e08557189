"""Linear operators for graph random features: the sparse feature matrix and its Gram matrix."""

from __future__ import annotations

from .grf_gram import GRFGramLinearOperator
from .sparse_features import CSRPattern, SparseFeatureLinearOperator, segment_sum, sparse_matmul

__all__ = [
    "CSRPattern",
    "GRFGramLinearOperator",
    "SparseFeatureLinearOperator",
    "segment_sum",
    "sparse_matmul",
]
