"""Deprecated aliases of renamed public names and keywords, resolved with a warning."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Decorator: the function still accepts old keyword names (``old="new"``), with a ``DeprecationWarning``.

    :param renames: Old keyword -> new keyword.
    :return: The decorator; the decorated function raises ``TypeError`` when given both
        the old and the new name.
    """

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got both {new!r} and its "
                                        f"deprecated name {old!r}")
                    warnings.warn(f"{function.__qualname__}(): the keyword {old!r} is deprecated; "
                                  f"use {new!r}", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
