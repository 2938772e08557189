"""Argument checks shared by the frequency couplings and the kernels built on them."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_positive_int", "check_batch_shape"]


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__}")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive int, got {int(value)}")
    return int(value)


def check_batch_shape(batch_shape: Any) -> tuple[int, ...]:
    if isinstance(batch_shape, (int, np.integer)) and not isinstance(batch_shape, bool):
        batch_shape = (batch_shape,)
    try:
        shape = tuple(batch_shape)
    except TypeError:
        raise TypeError(f"batch_shape must be a sequence of ints, got {type(batch_shape).__name__}") from None
    for size in shape:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"batch_shape must hold non-negative ints, got {shape}")
    return tuple(int(size) for size in shape)
