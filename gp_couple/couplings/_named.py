"""Shared behaviour of the registered, parameter-described walk components (proposals, direction couplings)."""

from __future__ import annotations

import json
from typing import Any

from ..registry import Registry

__all__ = ["ValueEquality", "resolve"]


class ValueEquality:
    """Mixin for :class:`~gp_couple.registry.Registered` classes: equal when class and ``params()`` are."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params() == other.params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), json.dumps(self.params(), sort_keys=True)))  # type: ignore[attr-defined]


def resolve(value: Any, registry: Registry[Any], base: type, default: Any, argument: str) -> Any:
    """``value`` as an instance of ``base``: an instance as is, a registered name, or ``None`` (``default``).

    :raises ValueError: For an unknown name, listing the registered ones.
    :raises TypeError: For anything else.
    """
    if value is None:
        return default
    if isinstance(value, base):
        return value
    if isinstance(value, str):
        if value not in registry:
            raise registry.unknown_name_error(value, f" or pass a {base.__name__}")
        return registry.create(value)
    raise TypeError(f"{argument} must be a str or {base.__name__}, got {type(value).__name__}")
