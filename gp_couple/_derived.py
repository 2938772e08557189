"""Objects that never change, and what is computed from them once and kept with them.

A :class:`~gp_couple.graphs.Graph` and a :class:`~gp_couple.sparse_pattern.CSRPattern`
are immutable, so anything computed from one alone (degrees, proposal tables, a
Chebyshev basis, a transposed pattern, the pivots a preconditioner chose) stays valid
as long as the object lives. :class:`DerivedCache` is the one place such results are
kept: modules that build something from a graph or a pattern call :meth:`DerivedCache.derived`
instead of keeping caches of their own, and every holder of the object (kernels, their
copies, the operators of every training step) shares the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DerivedCache"]

T = TypeVar("T")


class DerivedCache:
    """Mixin of immutable objects: :meth:`derived` computes a result once per key and keeps it."""

    __slots__ = ()

    def derived(self, key: str, build: Callable[[], T], *, keep: bool = True) -> T:
        """What ``build()`` returns for this object, computed on the first call with ``key`` and kept.

        Keys are names shared by the whole package: one key holds one kind of result
        (modules outside the class prefix theirs, e.g. ``"proposal_tables:..."``).
        ``build`` must depend on this object alone, never on mutable state.

        :param key: Name of the result.
        :param build: Computes it (called at most once per object and key, when kept).
        :param keep: ``False`` for a one-off use of a large intermediate: the kept result if
            there is one, else ``build()`` without keeping it (e.g. weighted degrees that only
            the walk tables needed, once).
        :return: The (kept) result.
        """
        cache: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        if key in cache:
            return cache[key]
        if not keep:
            return build()
        cache[key] = build()
        return cache[key]
