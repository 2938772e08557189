"""Thread limits of the experiments' runs (their options: :mod:`gp_couple.experiments._options`).

The experiments factorise many small matrices. On a shared machine, BLAS thread pools
that busy-wait for work (OpenBLAS's, behind NumPy and SciPy) burn the other cores while
they wait, so a run bounds both torch's and the BLAS libraries' threads
(:func:`bounded_threads`), restoring them when it ends.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from .. import settings
from ._options import DEFAULT_THREADS

__all__ = ["DEFAULT_THREADS", "bounded_threads", "with_bounded_threads"]

F = TypeVar("F", bound=Callable[..., Any])


def bounded_threads(threads: int) -> contextlib.AbstractContextManager[int]:
    """Limit torch's, numba's and every BLAS/OpenMP pool to ``threads`` inside the block
    (:func:`gp_couple.settings.threads`), restoring them on exit.

    :param threads: Threads allowed (>= 1).
    :raises ValueError: If ``threads`` is not a positive int.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    return settings.threads(threads)


def with_bounded_threads(function: F) -> F:
    """Decorator: ``function`` gains a keyword ``threads`` (default :data:`DEFAULT_THREADS`)
    and runs inside :func:`bounded_threads` with it."""

    @functools.wraps(function)
    def wrapper(*args: Any, threads: int = DEFAULT_THREADS, **kwargs: Any) -> Any:
        with bounded_threads(threads):
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
