"""Compatibility imports: the sparse feature operator's pieces live in their own modules.

* :mod:`gp_couple.operators.csr_pattern`: :class:`CSRPattern` (and :func:`segment_sum`);
* :mod:`gp_couple.operators.sparse_products`: the differentiable sparse products;
* :mod:`gp_couple.operators.sparse_feature_operator`: :class:`SparseFeatureLinearOperator`.
"""

from __future__ import annotations

from .csr_pattern import CSRPattern, segment_sum
from .sparse_feature_operator import SparseFeatureLinearOperator
from .sparse_products import sparse_matmul

__all__ = ["CSRPattern", "SparseFeatureLinearOperator", "segment_sum", "sparse_matmul"]
