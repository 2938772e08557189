r"""Progress of long work: a bar on a terminal, a log line now and then everywhere else.

Long loops in the library (training, :math:`\sigma`-coupling fits, experiment repeats)
iterate through :func:`progress`, which reports in one of two ways:

* on a terminal (standard error is a TTY), a :class:`tqdm.tqdm` bar, transient;
* anywhere else (a pipe, a file, a notebook cell's captured output, a CI log), a line
  through :mod:`logging` (logger ``gp_couple.progress``, level INFO) at most every
  :data:`LOG_INTERVAL` seconds, so long runs leave their progress in the log. A program
  that does not configure logging at INFO sees nothing (Python's default handler shows
  warnings only); the ``gp-couple`` command line logs INFO to standard error.

Both are on by default; switch them off for a block of code with the context manager
:func:`progress_bars`::

      from gp_couple.progress import progress_bars

      with progress_bars(False):      # e.g. inside a larger application with its own UI
          fit_gp(model, likelihood, iterations=1000)

The ``gp-couple`` command line does this for ``--quiet``.

Like :mod:`gp_couple.settings`, the switch is a context manager restored on exit (also
when an exception escapes); it is a :class:`contextvars.ContextVar`, so threads and
asyncio tasks each see their own value. Messages other than progress go through
:mod:`logging` (logger names ``gp_couple.*``), never ``print``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["LOG_INTERVAL", "progress", "progress_bars", "progress_enabled"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: Seconds between two progress lines in a log (standard error not a terminal).
LOG_INTERVAL = 30.0

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("gp_couple_progress_bars", default=True)


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[None]:
    """Switch progress bars on or off inside a ``with`` block (restored on exit).

    :param enabled: ``False`` silences every bar the library would draw; ``True`` allows
        them again (they still appear only when standard error is a terminal).
    :raises TypeError: If ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def progress_enabled() -> bool:
    """Whether a bar would be drawn now: switched on and standard error is a terminal."""
    return _ENABLED.get() and _stderr_is_a_terminal()


def _stderr_is_a_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress(iterable: Iterable[T], *, description: str, total: int | None = None,
             unit: str = "it") -> Iterable[T]:
    """Iterate over ``iterable``, reporting progress (see the module docstring).

    Bars are transient (``leave=False``): nested loops show one line each while they run
    and leave the terminal clean for the results. Log lines say how many items are done,
    of how many, and for how long the loop has run.

    :param iterable: What to iterate over.
    :param description: Short label shown before the bar or at the start of the line
        (e.g. ``"training"``).
    :param total: Number of items when ``iterable`` has no ``len``.
    :param unit: Name of one item (``"step"``, ``"repeat"``, ...).
    :return: An iterable yielding the same items in the same order.
    """
    if not _ENABLED.get():
        return iterable
    if _stderr_is_a_terminal():
        from tqdm import tqdm  # imported only when a bar is actually drawn

        return tqdm(iterable, desc=description, total=total, unit=unit, leave=False,
                    file=sys.stderr, dynamic_ncols=True)
    if not logger.isEnabledFor(logging.INFO):
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return _logged(iterable, description, total, unit)


def _logged(iterable: Iterable[T], description: str, total: int | None, unit: str) -> Iterator[T]:
    start = last = time.monotonic()
    of = "" if total is None else f"/{total}"
    for done, item in enumerate(iterable, 1):
        yield item  # resumed when the caller has finished with the item
        now = time.monotonic()
        if now - last >= LOG_INTERVAL:
            logger.info("%s: %d%s %s%s done (%.0f s)", description, done, of, unit, "s" if done > 1 else "",
                        now - start)
            last = now
