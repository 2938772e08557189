"""Counter-based random numbers for compiled (numba) loops.

A stream is a SplitMix64 sequence keyed by ``(seed, counter)``: stream ``c`` of seed
``s`` never depends on which other streams are drawn, in which order, or on how many
threads draw them. The walk sampler keys one stream per walker; i.i.d. walk lengths
use one draw per walker.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numba
import numpy as np
from numba import njit, prange

__all__ = ["SERIAL_WORK_LIMIT", "threads_for", "stream_start", "next_unit", "geometric_lengths"]

#: Below this much work (walk steps, draws) a kernel runs on the calling thread only:
#: waking the thread pool costs more than the work, and far more when the machine is busy.
SERIAL_WORK_LIMIT = 1 << 16

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


@contextlib.contextmanager
def threads_for(work: int) -> Iterator[None]:
    """Run the kernels called inside on one thread when ``work`` is small.

    ``numba.set_num_threads`` is thread-local, and results do not depend on the thread
    count (counter-based randomness), so this only changes speed.
    """
    if work >= SERIAL_WORK_LIMIT:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@njit(inline="always", cache=True)
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True)
def stream_start(seed: np.uint64, counter: np.uint64) -> np.uint64:
    """State of stream ``counter`` of ``seed``, before its first draw."""
    return _mix(seed ^ _mix(counter * _GOLDEN + _GOLDEN))


@njit(inline="always", cache=True)
def next_unit(state: np.uint64) -> tuple[np.uint64, float]:
    """Advance a stream; return the new state and a uniform in ``[0, 1)`` (53 bits)."""
    state = state + _GOLDEN
    return state, float(_mix(state) >> np.uint64(11)) * _TO_UNIT


@njit(parallel=True, cache=True)
def _fill_geometric(seed, inv_log_keep, rows, out):  # pragma: no cover - compiled
    columns = out.shape[1]
    seed_u = np.uint64(seed)
    for i in prange(out.shape[0]):
        for k in range(columns):
            _, u = next_unit(stream_start(seed_u, np.uint64(rows[i] * columns + k)))
            # Inverse CDF of Geom_0(p): floor(log(1 - u) / log(1 - p)). 1 - u is exact for
            # u on the 2**-53 grid, and math.log compiles to a much faster call than log1p.
            out[i, k] = np.int64(math.log(1.0 - u) * inv_log_keep)


def geometric_lengths(seed: int, p_halt: float, shape: tuple[int, int], rows: np.ndarray | None = None) -> np.ndarray:
    r"""i.i.d. lengths :math:`\mathrm{Geom}_0(p)` (number of moves before halting).

    Entry ``(r, k)`` is the inverse CDF of the first uniform of stream ``r * m + k``, so
    the array is the same whatever the thread count, and any of its rows can be drawn alone.

    :param seed: Non-negative integer key (e.g. from :func:`gp_couple._random.draw_seed`).
    :param p_halt: Termination probability in ``(0, 1)``.
    :param shape: ``(rows, m)``.
    :param rows: Draw only these rows of the ``shape`` array (in this order; default: all).
    """
    rows = np.arange(shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    out = np.empty((rows.size, shape[1]), dtype=np.int64)
    with threads_for(out.size):
        _fill_geometric(np.uint64(seed), 1.0 / math.log1p(-p_halt), rows, out)
    return out
