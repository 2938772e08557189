"""Deprecated aliases of renamed public names, resolved lazily with a warning."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping


def deprecated_aliases(module_name: str, aliases: Mapping[str, tuple[str, Callable[[], Any]]]
                       ) -> Callable[[str], Any]:
    """A module ``__getattr__`` that resolves old names with a ``DeprecationWarning``.

    Only the old names go through it (module attributes are found first), so importing
    the module stays silent and only code that uses an old name is warned.

    :param module_name: The module's ``__name__`` (for the ``AttributeError``).
    :param aliases: Old name -> (new name, function returning the object).
    :return: The function to assign to the module's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if name in aliases:
            new_name, resolve = aliases[name]
            warnings.warn(f"{module_name}.{name} is deprecated; use {new_name}",
                          DeprecationWarning, stacklevel=2)
            return resolve()
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    # Packages re-exporting a module's names merge its table into their own.
    __getattr__.aliases = dict(aliases)  # type: ignore[attr-defined]
    return __getattr__
