"""Run-time options of the experiments: thread limits, progress messages and the torch device.

The experiments factorise many small matrices. On a shared machine, BLAS thread pools
that busy-wait for work (OpenBLAS's, behind NumPy and SciPy) burn the other cores while
they wait, so a run bounds both torch's and the BLAS libraries' threads
(:func:`bounded_threads`), restoring them when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import time
from typing import Any, Callable, TypeVar

from .. import settings
from ..devices import resolve_device
from ._report import positive_int

__all__ = ["DEFAULT_THREADS", "add_device_argument", "add_runtime_arguments", "apply_runtime_arguments",
           "bounded_threads", "device_option", "with_bounded_threads"]

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)

#: Threads of a run unless ``--threads`` says otherwise: one thread was fastest for the
#: 256-point factorisations of the paper's protocol on a loaded 2-core machine (the
#: kernel-estimation benchmark in benchmarks/RESULTS.md).
DEFAULT_THREADS = 1


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


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--threads`` and ``--progress`` (shared by the Euclidean experiments)."""
    parser.add_argument("--threads", type=positive_int, default=DEFAULT_THREADS,
                        help="torch and BLAS threads for this run (default %(default)s: fastest "
                             "for these small matrices, especially on a busy machine)")
    parser.add_argument("--progress", action="store_true", help="report progress on stderr")


def device_option(text: str) -> str:
    """``--device`` value: ``cpu``, ``cuda`` or ``cuda:N``, refused at once when unavailable."""
    try:
        resolve_device(text, "--device")
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--device`` (the torch device the command's models train and predict on)."""
    parser.add_argument("--device", type=device_option, default="cpu",
                        help="torch device of the models: cpu, cuda or cuda:N (walks and scipy "
                             "references stay on the CPU)")


def apply_runtime_arguments(args: argparse.Namespace) -> Callable[[str], None] | None:
    """The ``--progress`` reporter (``None`` without it); ``--threads`` goes to the run's ``threads``."""
    if not args.progress:
        return None
    start = time.perf_counter()

    def report(message: str) -> None:
        # Through logging (stderr in the CLI), so that --quiet silences it like the progress bars.
        logger.info("[%7.1f s] %s", time.perf_counter() - start, message)

    return report
