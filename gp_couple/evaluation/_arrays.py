"""Conversion of tensors, linear operators and array-likes to float64 numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch


def as_float64(value: Any, name: str) -> np.ndarray:
    """``value`` as a float64 numpy array; linear operators are densified (small inputs only)."""
    if hasattr(value, "to_dense") and not isinstance(value, np.ndarray):
        value = value.to_dense()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().to(torch.float64).numpy()
    if sp.issparse(value):
        value = value.toarray()
    array = np.asarray(value)
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"{name} must be numeric, got dtype {array.dtype}")
    return array.astype(np.float64, copy=False)
