"""Conversion of tensors, linear operators and array-likes to finite float64 numpy arrays, and the noise check.

Every evaluator reads its inputs through :func:`as_float64`, so a NaN or an infinity in
a prediction, a variance or a Gram matrix is an error naming the argument rather than a
metric that silently comes out NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch


def as_float64(value: Any, name: str) -> np.ndarray:
    """``value`` as a finite float64 numpy array; linear operators are densified (small inputs only).

    :param value: Array-like, tensor, scipy sparse matrix or linear operator.
    :param name: Argument name used in error messages.
    :raises TypeError: If ``value`` is not numeric (complex numbers included).
    :raises ValueError: If it holds NaN or infinite values.
    """
    if hasattr(value, "to_dense") and not isinstance(value, np.ndarray):
        value = value.to_dense()
    if isinstance(value, torch.Tensor):
        if value.dtype.is_complex:
            raise TypeError(f"{name} must be real, got dtype {value.dtype}")
        value = value.detach().cpu().to(torch.float64).numpy()
    if sp.issparse(value):
        value = value.toarray()
    array = np.asarray(value)
    if array.dtype == object or not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise TypeError(f"{name} must be real and numeric, got dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    check_finite(array, name)
    return array


def check_finite(array: np.ndarray, name: str) -> None:
    """Raise if a float array holds NaN or infinite values.

    :raises ValueError: Naming ``name``, the count and the first position.
    """
    bad = ~np.isfinite(array)
    if np.any(bad):
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} contains {int(bad.sum())} NaN or infinite value(s) (the first at index "
                         f"{position[0] if len(position) == 1 else position}: {array[position]})")


def check_noise_variance(noise_variance: Any) -> float:
    """A likelihood noise variance as a float.

    :param noise_variance: The value.
    :return: It as a float.
    :raises ValueError: If it is not positive and finite.
    """
    value = float(noise_variance)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"noise_variance must be positive and finite, got {noise_variance}")
    return value
