"""Shared behaviour of the registered, parameter-described walk components (proposals, direction couplings)."""

from __future__ import annotations

import json

__all__ = ["ValueEquality"]


class ValueEquality:
    """Mixin for :class:`~gp_couple.registry.Registered` classes: equal when class and ``params()`` are."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params() == other.params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), json.dumps(self.params(), sort_keys=True)))  # type: ignore[attr-defined]
