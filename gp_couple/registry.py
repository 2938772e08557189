r"""One registration mechanism for everything users extend (couplings, proposals, ...).

Every extensible family (walk-length couplings, frequency couplings, neighbour
proposals, direction couplings) owns one :class:`Registry`, which maps a short *name*
to a class. The name is what the command line, JSON files and the kernels' saved state
use, so a class registered in a user's own module reloads, parses and round-trips like a
built-in one.

Registering
-----------
A family's base class subclasses :class:`Registered` and names its registry with a class
keyword; every subclass that sets its own string class attribute ``name`` then registers
itself when it is defined::

    WALK_LENGTH_COUPLINGS = Registry("walk-length coupling")

    class WalkLengthCoupling(Registered, ABC, registry=WALK_LENGTH_COUPLINGS):
        ...

    class QuantileMirror(PairedWalkLengthCoupling):   # in the user's module
        name = "quantile-mirror"                      # registered here

A class that does not subclass :class:`Registered` (or whose name is not a class
attribute) registers with the decorator form, ``@registry.register(name="...")``.
Pass ``register=False`` in the class statement to keep a named subclass out of its
registry (e.g. a throw-away class in a test).

Serialising
-----------
:meth:`Registered.to_dict` gives ``{"type": name, **params}`` where ``params`` are the
keyword arguments that rebuild the object (:meth:`Registered.params`; empty by
default); :meth:`Registry.from_dict` inverts it through the registered class's
``from_dict`` (by default ``cls(**params)``). Both are plain JSON.

Descriptions are checked before anything is built: ``"type"`` must be a registered name
(a string), a field that the class's constructor does not take is an error (a misspelt
field is not silently ignored), and a description nested deeper than
:data:`MAX_JSON_DEPTH` levels is refused with a ``ValueError`` rather than a
``RecursionError``.

Names are unique within a family: a second class claiming a taken name is refused with
a ``ValueError``, except a re-definition of the same class (same module and qualified
name, e.g. a re-run notebook cell), which replaces it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar, overload

__all__ = ["Registry", "Registered", "check_description_fields", "check_json_value", "json_type_name",
           "MAX_JSON_DEPTH"]

T = TypeVar("T")
C = TypeVar("C", bound=type)

#: The key naming the registered class in a serialised description.
TYPE_KEY = "type"
#: The deepest nesting of lists and objects accepted in a description (far beyond any
#: real one; bounds the recursion of parsing and rebuilding).
MAX_JSON_DEPTH = 64


def json_type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return {list: "list", dict: "object"}.get(type(value), type(value).__name__)


def check_json_value(value: Any, name: str, *, types_only_json: bool = True,
                     max_depth: int = MAX_JSON_DEPTH) -> None:
    """Check that ``value`` is plain JSON data nested at most ``max_depth`` levels (iteratively, no recursion).

    :param value: The value (decoded JSON, or what will be encoded).
    :param name: The argument or field, for messages.
    :param types_only_json: Also require JSON types: objects with string keys, lists,
        strings, numbers, booleans and ``null``.
    :param max_depth: The deepest nesting of lists and objects accepted.
    :raises TypeError: For a value that is not JSON (with ``types_only_json``), naming
        its type and where it is.
    :raises ValueError: For deeper nesting.
    """
    stack: list[tuple[Any, int, str]] = [(value, 0, name)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= max_depth:
                shown = where if len(where) <= 80 else where[:77] + "..."
                raise ValueError(f"{name} is nested more than {max_depth} levels deep (at {shown})")
            if isinstance(item, dict):
                for key, entry in item.items():
                    if types_only_json and not isinstance(key, str):
                        raise TypeError(f"{name} must be JSON-serialisable: {where} has a key of type "
                                        f"{type(key).__name__}")
                    stack.append((entry, depth + 1, f"{where}[{key!r}]"))
            elif types_only_json and isinstance(item, tuple):
                raise TypeError(f"{name} must be JSON-serialisable: {where} is a tuple")
            else:
                stack.extend((entry, depth + 1, f"{where}[{index}]") for index, entry in enumerate(item))
        elif types_only_json and item is not None and not isinstance(item, (str, int, float)):
            raise TypeError(f"{name} must be JSON-serialisable: {where} is a {type(item).__name__}")


def _constructor_fields(cls: type) -> set[str] | None:
    """The keyword arguments of ``cls(...)``; ``None`` if it takes ``**kwargs`` (anything goes)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return None
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return {parameter.name for parameter in parameters
            if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def check_description_fields(data: dict[str, Any], fields: Iterable[str] | None, what: str) -> None:
    """Refuse fields of a description other than ``"type"`` and ``fields``.

    :param data: The description.
    :param fields: The accepted fields (``None``: any).
    :param what: What is described, for the message (e.g. ``"sigma-coupling"``).
    :raises ValueError: Listing the unknown and the accepted fields.
    """
    if fields is None:
        return
    accepted = {TYPE_KEY, *fields}
    unknown = sorted(set(data) - accepted)
    if unknown:
        raise ValueError(f"{what} description has unknown field(s) {unknown}; expected {sorted(accepted)}")


def _description_type(data: Any, family: str) -> str:
    """The registered name a description gives, after checking its form (a dict, a str ``"type"``, depth)."""
    if not isinstance(data, dict):
        raise TypeError(f"a {family} description must be a dict, got {type(data).__name__}")
    if TYPE_KEY not in data:
        raise ValueError(f"a {family} description needs a {TYPE_KEY!r} key, got {sorted(map(str, data))}")
    name = data[TYPE_KEY]
    if not isinstance(name, str):
        raise TypeError(f"a {family} description's {TYPE_KEY!r} must be a string, got "
                        f"{json_type_name(name)} {name!r}")
    check_json_value(data, f"the {family} description", types_only_json=False)
    return name


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Registry(Generic[T]):
    """Names -> classes of one extensible family.

    :param family: Human-readable family name used in error messages
        (e.g. ``"walk-length coupling"``).
    """

    def __init__(self, family: str) -> None:
        if not isinstance(family, str) or not family:
            raise TypeError("family must be a non-empty str")
        self.family = family
        self._classes: dict[str, type[T]] = {}
        self._names: dict[type, str] = {}

    # ------------------------------------------------------------------ registering

    @overload
    def register(self, cls: C, *, name: str | None = None) -> C: ...

    @overload
    def register(self, cls: None = None, *, name: str | None = None) -> Callable[[C], C]: ...

    def register(self, cls: Any = None, *, name: str | None = None) -> Any:
        """Register ``cls`` under ``name`` (default: its class attribute ``name``).

        Usable directly (``registry.register(MyClass)``) or as a decorator
        (``@registry.register(name="mine")``).

        :param cls: The class to register.
        :param name: Its registered name.
        :return: ``cls`` (or a decorator returning it).
        :raises ValueError: If the name is empty or taken by another class.
        :raises TypeError: If ``cls`` is not a class or the name is not a str.
        """
        if cls is None:
            return lambda klass: self.register(klass, name=name)
        if not isinstance(cls, type):
            raise TypeError(f"only classes can be registered as a {self.family}, got {cls!r}")
        key = getattr(cls, "name", None) if name is None else name
        if not isinstance(key, str):
            raise TypeError(f"a {self.family} needs a str name to be registered; {cls.__name__} "
                            f"has name={key!r}")
        if not key.strip() or key != key.strip():
            raise ValueError(f"{self.family} names must be non-empty without surrounding spaces, "
                             f"got {key!r}")
        previous = self._classes.get(key)
        if previous is not None and previous is not cls:
            if _qualified(previous) != _qualified(cls):
                raise ValueError(
                    f"the {self.family} name {key!r} is already registered by "
                    f"{_qualified(previous)}; give {_qualified(cls)} another name")
            # The same class defined again (a re-run cell or reloaded module) replaces it.
            del self._names[previous]
        self._classes[key] = cls
        self._names[cls] = key
        return cls

    def unregister(self, name: str) -> None:
        """Remove a registered name (e.g. at the end of a test)."""
        cls = self.get(name)
        del self._classes[name]
        del self._names[cls]

    # ------------------------------------------------------------------ lookup

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._classes)

    def unknown_name_error(self, name: Any, extra: str = "") -> ValueError:
        """The error for an unknown name, listing the known ones.

        :param name: The name asked for.
        :param extra: Appended to the message (e.g. other accepted forms).
        """
        return ValueError(f"unknown {self.family} {name!r}; choose from {list(self.names())}{extra}")

    def is_registered(self, obj: Any) -> bool:
        """Whether an instance's (or a class's) exact class is registered."""
        return (obj if isinstance(obj, type) else type(obj)) in self._names

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``.

        :raises ValueError: Listing the known names, if ``name`` is unknown.
        """
        if name not in self._classes:
            raise self.unknown_name_error(name)
        return self._classes[name]

    def name_of(self, obj: Any) -> str:
        """The registered name of an instance's (or a class's) exact class.

        :raises ValueError: If that class is not registered, since its description could
            not be read back (a subclass inheriting its parent's name would reload as
            the parent).
        """
        cls = obj if isinstance(obj, type) else type(obj)
        if cls not in self._names:
            raise ValueError(
                f"{_qualified(cls)} is not a registered {self.family}, so it cannot be saved or "
                f"described: give it a unique class attribute `name` (registered: "
                f"{list(self.names())})")
        return self._names[cls]

    def create(self, name: str, **kwargs: Any) -> T:
        """An instance of the class registered as ``name``, built with ``kwargs``."""
        return self.get(name)(**kwargs)

    def resolve(self, value: Any, base: type, argument: str, *, default: Any = None, **kwargs: Any) -> T:
        """The one way a public argument names a member of the family: ``value`` as an instance of ``base``.

        An instance of ``base`` is returned as is, a registered name is built with
        ``kwargs`` (:meth:`create`), and ``None`` gives ``default`` when there is one.

        :param value: An instance, a registered name or ``None``.
        :param base: The family's base class.
        :param argument: The argument's name, for messages.
        :param default: What ``None`` stands for (``None``: ``None`` is refused).
        :param kwargs: Constructor arguments for a name.
        :raises ValueError: For an unknown name (listing the registered ones), ``kwargs``
            with an instance, or a name whose class cannot be built from ``kwargs``.
        :raises TypeError: For anything else.
        """
        if value is None and default is not None:
            value = default
        if isinstance(value, base):
            if kwargs:
                raise ValueError(f"{argument}: constructor arguments {sorted(kwargs)} can only be given "
                                 f"with a {self.family} name, not with an instance")
            return value
        if isinstance(value, str):
            if value not in self._classes:
                raise self.unknown_name_error(value, f" or pass a {base.__name__}")
            try:
                return self.create(value, **kwargs)
            except TypeError as error:
                raise ValueError(f"{argument}: the {value!r} {self.family} cannot be built from "
                                 f"{sorted(kwargs) or 'no arguments'} ({error}): pass an instance") from error
        raise TypeError(f"{argument} must be a str or {base.__name__}, got {type(value).__name__}")

    # ------------------------------------------------------------------ serialisation

    def from_dict(self, data: Any) -> T:
        """Rebuild an object from its :meth:`Registered.to_dict` description.

        :param data: A mapping with the key ``"type"`` naming a registered class.
        :raises ValueError: If ``data`` has no known ``"type"``, a field the class does
            not take, or is nested too deeply.
        :raises TypeError: If ``data`` is not a dict or its ``"type"`` is not a string.
        """
        name = _description_type(data, self.family)
        if name not in self._classes:
            raise ValueError(f"unknown {self.family} type {name!r}; registered: {list(self.names())}")
        cls: Any = self._classes[name]
        builder = getattr(cls, "from_dict", None)
        if builder is not None:
            return builder(data)
        check_description_fields(data, _constructor_fields(cls), f"{self.family} {name!r}")
        return cls(**{key: value for key, value in data.items() if key != TYPE_KEY})

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, names={list(self.names())})"


class Registered:
    """Mixin: subclasses that set a string class attribute ``name`` register themselves.

    A family's base class names its registry with the class keyword ``registry=``; its
    subclasses inherit it. See the module docstring.
    """

    #: The family's registry (set by the class keyword ``registry=`` on the base class).
    registry: ClassVar[Registry[Any]]
    #: Short name used in reports, JSON and the command line.
    name: ClassVar[str]

    def __init_subclass__(cls, registry: Registry[Any] | None = None, register: bool = True,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if registry is not None:
            # The family's base class: it names the registry but is not itself registered.
            cls.registry = registry
            return
        if register and isinstance(cls.__dict__.get("name"), str) and hasattr(cls, "registry"):
            cls.registry.register(cls)

    def params(self) -> dict[str, Any]:
        """JSON-serialisable keyword arguments that rebuild this object (default: none)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """``{"type": registered name, **params()}``; :meth:`from_dict` inverts it.

        :raises ValueError: If this exact class is not registered.
        """
        return {TYPE_KEY: type(self).registry.name_of(self), **self.params()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Rebuild from :meth:`to_dict` output: ``cls(**params)``.

        Called on the family base class, it dispatches on ``data["type"]``.

        :raises ValueError: If ``data`` describes a different class, or has a field the
            constructor does not take.
        :raises TypeError: If ``data`` is not a dict or its ``"type"`` is not a string.
        """
        registry = cls.registry
        target = registry.get(_description_type(data, registry.family))
        if target is not cls:
            if not issubclass(target, cls):
                raise ValueError(f"not a {cls.__name__} description: {TYPE_KEY}={data.get(TYPE_KEY)!r}")
            return target.from_dict(data)  # type: ignore[attr-defined]
        check_description_fields(data, _constructor_fields(cls), f"{registry.family} {data[TYPE_KEY]!r}")
        return cls(**{key: value for key, value in data.items() if key != TYPE_KEY})
