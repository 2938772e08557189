"""Point metrics: relative Frobenius Gram error, RMSE and NLPD."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._nodes import node_index_array
from ._arrays import as_float64, check_finite
from .sources import GramSource, gram_source, is_lazy_source, row_chunks


def relative_frobenius_error(exact: Any, estimate: Any, *, nodes: Any = None) -> float:
    r"""Relative Frobenius error :math:`\|K - \widehat K\|_F / \|K\|_F` (paper, Figure 3, Section
    4.2 [fig:permuton_grf]).

    A scipy sparse ``estimate`` (e.g. :math:`\Phi\Phi^\top` of graph random features) is
    never densified: :math:`\|K - \widehat K\|_F^2 = \|K\|_F^2 - 2\langle K, \widehat K\rangle
    + \|\widehat K\|_F^2` with the inner product over the stored entries only. A linear
    operator, kernel or model is read in blocks of rows (never the whole matrix at once),
    so a GRF kernel's error is that of the very estimate its model predicts with.

    :param exact: Exact Gram matrix: array, tensor, scipy sparse, linear operator, a
        gpytorch kernel on node indices or a trained ExactGP (its kernel; see
        :func:`gp_couple.evaluation.sources.gram_source`).
    :param estimate: Estimated Gram matrix, any of the same kinds.
    :param nodes: Compare only the block of these node indices (default: all points;
        needed when neither side knows its size, e.g. two kernels off graphs).
    :raises ValueError: If the shapes differ, the exact matrix is zero, or either holds
        NaN or infinite values (naming ``exact`` or ``estimate``).
    """
    if nodes is not None or is_lazy_source(exact) or is_lazy_source(estimate):
        return _blockwise_error(gram_source(exact, "exact"), gram_source(estimate, "estimate"), nodes)
    k = as_float64(exact, "exact")
    if sp.issparse(estimate):
        if k.shape != estimate.shape:
            raise ValueError(f"shapes differ: exact {k.shape} vs estimate {estimate.shape}")
        coo = sp.coo_matrix(estimate)
        coo.sum_duplicates()
        check_finite(coo.data, "estimate")
        norm_sq = float(np.sum(k * k))
        if norm_sq == 0.0:
            raise ValueError("exact Gram matrix is zero: relative error undefined")
        cross = float(np.dot(k[coo.row, coo.col], coo.data))
        squared = max(norm_sq - 2.0 * cross + float(np.dot(coo.data, coo.data)), 0.0)
        return float(np.sqrt(squared / norm_sq))
    k_hat = as_float64(estimate, "estimate")
    if k.shape != k_hat.shape:
        raise ValueError(f"shapes differ: exact {k.shape} vs estimate {k_hat.shape}")
    norm = np.linalg.norm(k)
    if norm == 0.0:
        raise ValueError("exact Gram matrix is zero: relative error undefined")
    return float(np.linalg.norm(k - k_hat) / norm)


def _blockwise_error(exact: GramSource, estimate: GramSource, nodes: Any) -> float:
    if nodes is None:
        if exact.size is None or estimate.size is None:
            raise ValueError("pass nodes: a kernel that is not on a graph does not know its size")
        if exact.size != estimate.size:
            raise ValueError(f"shapes differ: exact {(exact.size,) * 2} vs estimate {(estimate.size,) * 2}")
        index = np.arange(exact.size, dtype=np.int64)
    else:
        sizes = [size for size in (exact.size, estimate.size) if size is not None]
        index = node_index_array(nodes, "nodes", min(sizes) if sizes else None)
    norm_sq = difference_sq = 0.0
    for start, stop in row_chunks(index.size, index.size):
        rows = index[start:stop]
        k = exact.block(rows, index)
        norm_sq += float(np.sum(k * k))
        difference_sq += float(np.sum((k - estimate.block(rows, index)) ** 2))
    if norm_sq == 0.0:
        raise ValueError("exact Gram matrix is zero: relative error undefined")
    return float(np.sqrt(difference_sq / norm_sq))


def rmse(prediction: Any, target: Any) -> float:
    """Root mean square error between predictions and targets (same shape).

    :raises ValueError: If the shapes differ, there are no points, or either holds NaN
        or infinite values (naming ``prediction`` or ``target``).
    """
    pred = as_float64(prediction, "prediction")
    y = as_float64(target, "target")
    if pred.shape != y.shape:
        raise ValueError(f"shapes differ: prediction {pred.shape} vs target {y.shape}")
    if pred.size == 0:
        raise ValueError("rmse of zero points is undefined")
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def nlpd(mean: Any, variance: Any, target: Any) -> float:
    r"""Mean negative log predictive density of independent Gaussian predictions.

    .. math::

        \mathrm{NLPD} = \frac{1}{n}\sum_i \tfrac12 \log(2\pi v_i) + \frac{(y_i - \mu_i)^2}{2 v_i}

    :param mean: Predictive means :math:`\mu_i`.
    :param variance: Predictive variances :math:`v_i > 0` of the *observations*
        (include the likelihood noise).
    :param target: Observed values :math:`y_i`.
    :raises ValueError: If the shapes differ, there are no points, an argument holds NaN
        or infinite values, or a variance is zero or negative (naming the argument).
    """
    mu = as_float64(mean, "mean")
    var = as_float64(variance, "variance")
    y = as_float64(target, "target")
    if not (mu.shape == var.shape == y.shape):
        raise ValueError(f"shapes differ: mean {mu.shape}, variance {var.shape}, target {y.shape}")
    if mu.size == 0:
        raise ValueError("nlpd of zero points is undefined")
    if np.any(var <= 0):
        index = int(np.argmin(var.reshape(-1)))
        raise ValueError(f"variance must be positive (predictive variances), got {var.reshape(-1)[index]:g} "
                         f"at index {index}")
    return float(np.mean(0.5 * np.log(2 * math.pi * var) + 0.5 * (y - mu) ** 2 / var))
