"""Small immutable value classes for the modules `rocforge env` imports, without `dataclasses`.

`import dataclasses` pulls in inspect, ast, dis, tokenize and copy, and every `@dataclass`
generates and compiles its methods when its module is imported: together the largest share of
an uncached `rocforge env`, which runs at every shell start-up (docs/measurements/env.md).  A class
here lists its fields, in order, as `__slots__` and writes its own `__init__` (the parameters,
order and defaults `@dataclass` would generate), setting them with `init(self, ...)`;
`Record` gives it what `@dataclass(frozen=True)` gives:

- `==` between two instances of the same class, and `hash()`, over the fields in order, except
  those named in the class's `_hidden` (the dataclass `compare=False, repr=False` fields);
- `repr()` as `Name(field=value, ...)`, leaving out `_hidden`;
- assigning or deleting an attribute raises `FrozenInstanceError` (an AttributeError);
- `copy`, `deepcopy` and `pickle` rebuild it through `__init__`.

`replace(record, **changes)` is `dataclasses.replace`; `fields_of(record)` the field names.
A default that dataclasses would write as `field(default_factory=dict)` is `FRESH` in the
signature, turned into a new dict by `fresh()`.  This module imports nothing.
"""

from __future__ import annotations

_set = object.__setattr__


class FrozenInstanceError(AttributeError):
    """An attribute of a `Record` was assigned or deleted (as dataclasses' error of that name)."""


class _Fresh:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<a new dict>"


FRESH = _Fresh()  # default of a field that gets a new empty dict per instance


def fresh(value):
    """`value`, or a new dict for the `FRESH` default."""
    return {} if value is FRESH else value


def init(self, *values) -> None:
    """Set the fields of `self` (its class's `__slots__`, in order) to `values`."""
    names = type(self).__slots__
    if len(names) != len(values):
        raise TypeError(f"{type(self).__name__}: {len(values)} values for {len(names)} fields")
    for name, value in zip(names, values, strict=True):
        _set(self, name, value)


class Record:
    """Base of an immutable value class whose fields are its `__slots__` (see the module)."""

    __slots__ = ()
    _hidden: tuple[str, ...] = ()  # fields left out of ==, hash() and repr()

    def _compared(self) -> tuple:
        hidden = self._hidden
        return tuple(getattr(self, n) for n in self.__slots__ if n not in hidden)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._compared() == other._compared()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        hidden = self._hidden
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__ if n not in hidden)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self):
        return type(self), tuple(getattr(self, n) for n in self.__slots__)


def fields_of(record) -> tuple[str, ...]:
    """The field names of a `Record` (class or instance), in order."""
    return tuple((record if isinstance(record, type) else type(record)).__slots__)


def replace(record, **changes):
    """A copy of `record` with `changes` (field=value) made, built through its `__init__`."""
    names = fields_of(record)
    unknown = set(changes) - set(names)
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field(s) {', '.join(sorted(unknown))}")
    return type(record)(**{n: changes[n] if n in changes else getattr(record, n) for n in names})
