"""Deprecated: the kernel families moved to :mod:`gp_couple.kernel_families`.

``GraphKernelSeries`` is now :class:`~gp_couple.kernel_families.KernelFamily` and
``get_graph_kernel`` is :func:`~gp_couple.kernel_families.get_kernel_family`; every
name of this module still resolves, with a ``DeprecationWarning`` naming its new home.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import kernel_families
from ._deprecation import deprecated_aliases

_RENAMED = {"GraphKernelSeries": "KernelFamily", "get_graph_kernel": "get_kernel_family"}
_MOVED = ("Diffusion", "RegularisedLaplacian", "PStepRandomWalk", "InverseCosine", "PowerSeries",
          "convolutional_sqrt", "convolve_series")


def _new_home(name: str) -> tuple[str, Callable[[], Any]]:
    return f"gp_couple.kernel_families.{name}", lambda: getattr(kernel_families, name)


__getattr__ = deprecated_aliases(__name__, {
    **{old: _new_home(new) for old, new in _RENAMED.items()},
    **{name: _new_home(name) for name in _MOVED}})
