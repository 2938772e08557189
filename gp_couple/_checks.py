"""Argument checks of the public entry points, written once.

The library checks its inputs where users hand them over (constructors of kernels and
couplings, the samplers' public functions, :math:`\\sigma` fitting, the command line)
and lets inner code trust what it receives. These are the checks those edges share;
each raises ``TypeError`` for a wrong type and ``ValueError`` for a wrong value, with a
message that names the argument.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

__all__ = ["is_int", "check_p_halt", "check_int", "check_positive_int", "check_batch_shape",
           "ALWAYS_FITS_BYTES", "TooLargeError", "available_memory", "format_bytes", "check_memory"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer (``bool`` is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float in the open interval ``(0, 1)`` (probabilities, relative tolerances).

    :param name: Argument name used in the messages.
    :param value: The argument.
    :raises TypeError: If ``value`` is not a real number (``bool`` included).
    :raises ValueError: If it is NaN or outside ``(0, 1)``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    result = float(value)
    if not (0.0 < result < 1.0) or math.isnan(result):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value}")
    return result


def check_nonnegative(name: str, value: Any) -> float:
    """``value`` as a finite float of at least 0 (thresholds).

    :param name: Argument name used in the messages.
    :param value: The argument.
    :raises TypeError: If ``value`` is not a real number (``bool`` included).
    :raises ValueError: If it is negative, NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    result = float(value)
    if not (0.0 <= result < math.inf):
        raise ValueError(f"{name} must be a finite number of at least 0, got {value}")
    return result


def check_p_halt(p_halt: Any) -> float:
    """A termination probability as a float in the open interval ``(0, 1)`` (:func:`check_fraction`)."""
    return check_fraction("p_halt", p_halt)


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


def check_even_walkers(name: str, value: Any) -> int:
    """An even number of walkers per node, at least 2: antithetic and σ-coupled walkers come in pairs.

    :raises TypeError: If ``value`` is not an int.
    :raises ValueError: If it is below 2 or odd.
    """
    walkers = check_int(name, value, 2)
    if walkers % 2:
        raise ValueError(f"{name} must be even (antithetic and sigma-coupled walkers come in pairs), got {walkers}")
    return walkers


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


#: Estimates up to this many bytes are not compared with the available memory (which
#: would cost a system call for every small graph).
ALWAYS_FITS_BYTES = 64 * 2 ** 20


class TooLargeError(ValueError):
    """An input asking for more memory than is available (raised by :func:`check_memory`)."""


def available_memory() -> int | None:
    """Bytes of memory a new allocation can use without swapping, or ``None`` when unknown.

    ``psutil`` where installed, else ``MemAvailable`` of ``/proc/meminfo`` (Linux: free
    memory plus reclaimable caches), else the free physical pages of :func:`os.sysconf`.
    """
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def format_bytes(num_bytes: float) -> str:
    """``num_bytes`` in binary units for messages (``"1.5 GiB"``)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}"


def check_memory(what: str, estimate: float, hint: str = "") -> None:
    """Refuse, before allocating, a result whose estimated size exceeds the available memory.

    :param what: What would be built, for the message (e.g. ``"a graph with 10 nodes"``).
    :param estimate: Estimated peak memory in bytes.
    :param hint: Appended to the message (e.g. how to make the result smaller).
    :raises TooLargeError: (a ``ValueError``) ``"<what> needs about <estimate> of memory, more
        than the <available> available"``; nothing is refused when the available memory is
        unknown, nor an estimate up to :data:`ALWAYS_FITS_BYTES`.
    """
    if estimate <= ALWAYS_FITS_BYTES:
        return
    available = available_memory()
    if available is not None and estimate > available:
        raise TooLargeError(f"{what} needs about {format_bytes(estimate)} of memory, more than the "
                            f"{format_bytes(available)} available{hint}")
