r"""Progress bars for long work: shown on a terminal, silent everywhere else.

Long loops in the library (training, :math:`\sigma`-coupling fits, experiment repeats)
iterate through :func:`progress`, a thin wrapper around :class:`tqdm.tqdm` that draws a
bar on standard error **only** when

* standard error is a terminal (``tqdm``'s ``disable=None`` rule: a pipe, a file, a
  notebook cell's captured output or a CI log stay clean), and
* progress bars are switched on, which they are by default; switch them off for a
  block of code with the context manager :func:`progress_bars`::

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
import sys
from typing import Iterable, Iterator, TypeVar

__all__ = ["progress", "progress_bars", "progress_enabled"]

T = TypeVar("T")

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
    if not _ENABLED.get():
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress(iterable: Iterable[T], *, description: str, total: int | None = None,
             unit: str = "it") -> Iterable[T]:
    """Iterate over ``iterable``, drawing a progress bar on a terminal (see the module docstring).

    Bars are transient (``leave=False``): nested loops show one line each while they run
    and leave the terminal clean for the results.

    :param iterable: What to iterate over.
    :param description: Short label shown before the bar (e.g. ``"training"``).
    :param total: Number of items when ``iterable`` has no ``len``.
    :param unit: Name of one item (``"step"``, ``"repeat"``, ...).
    :return: An iterable yielding the same items in the same order.
    """
    if not progress_enabled():
        return iterable
    from tqdm import tqdm  # imported only when a bar is actually drawn

    return tqdm(iterable, desc=description, total=total, unit=unit, leave=False,
                file=sys.stderr, dynamic_ncols=True)
