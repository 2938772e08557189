"""Argument checks of the public entry points, written once.

The library checks its inputs where users hand them over (constructors of kernels and
couplings, the samplers' public functions, :math:`\\sigma` fitting, the command line)
and lets inner code trust what it receives. These are the checks those edges share;
each raises ``TypeError`` for a wrong type and ``ValueError`` for a wrong value, with a
message that names the argument.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["is_int", "check_p_halt", "check_int", "check_positive_int", "check_batch_shape"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer (``bool`` is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_p_halt(p_halt: Any) -> float:
    """A termination probability as a float in the open interval ``(0, 1)``.

    :raises TypeError: If ``p_halt`` is not a real number (``bool`` included).
    :raises ValueError: If it is NaN or outside ``(0, 1)``.
    """
    if isinstance(p_halt, bool) or not isinstance(p_halt, (int, float, np.floating, np.integer)):
        raise TypeError(f"p_halt must be a float, got {type(p_halt).__name__}")
    value = float(p_halt)
    if not (0.0 < value < 1.0) or math.isnan(value):
        raise ValueError(f"p_halt must lie strictly between 0 and 1, got {p_halt}")
    return value


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int of at least ``minimum``.

    :param name: Argument name used in the messages.
    :param value: The argument (a Python or NumPy integer; ``bool`` is refused).
    :param minimum: Smallest value allowed.
    :raises TypeError: ``"<name> must be an int, got <type>"``.
    :raises ValueError: ``"<name> must be >= <minimum>, got <value>"``.
    """
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    (The wording of the frequency couplings: ``"<name> must be a positive int, got ..."``.)
    """
    if not is_int(value):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__}")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive int, got {int(value)}")
    return int(value)


def check_batch_shape(batch_shape: Any) -> tuple[int, ...]:
    """A batch shape (an int or a sequence of non-negative ints) as a tuple.

    :raises TypeError: If ``batch_shape`` is neither an int nor a sequence.
    :raises ValueError: If an entry is not a non-negative int.
    """
    if is_int(batch_shape):
        batch_shape = (batch_shape,)
    try:
        shape = tuple(batch_shape)
    except TypeError:
        raise TypeError(f"batch_shape must be a sequence of ints, got {type(batch_shape).__name__}") from None
    for size in shape:
        if not is_int(size) or size < 0:
            raise ValueError(f"batch_shape must hold non-negative ints, got {shape}")
    return tuple(int(size) for size in shape)
