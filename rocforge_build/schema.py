"""Declarative schemas for the records rocforge reads back from its stores (presets and rows of the
results database, build manifests, bundle.toml): each record passes one schema where it is read,
so code after that point works with checked types, ranges, names and paths, and a record a user
edited, was handed or that another program wrote is one line naming the file and the field.

A schema is built from the specs below (`Record`, `Str`, `Int`, `ListOf`, `EnvTable`, ...);
`check(value, spec, where, error)` returns the value with every field checked (unknown fields of a
record are kept as they are and stay unchecked: code must not read them).  Stdlib only, no `re`:
`rocforge env` reads build manifests through it on every shell start-up.
"""

from __future__ import annotations

import math
import os

from rocforge_build import shellsafe


class Bad(Exception):
    """A value that does not match its spec: `field` is its dotted path in the record."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _join(path: str, key: object) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


class Spec:
    """One value's rule: `take(value, path)` returns the checked value or raises Bad(path, ...)."""

    what = "a value"

    def take(self, value, path: str):
        raise NotImplementedError


class Str(Spec):
    """A string; `empty` allows "", `one_line` refuses line breaks and NUL."""

    what = "a string"

    def __init__(self, *, empty: bool = False, one_line: bool = False):
        self.empty, self.one_line = empty, one_line

    def take(self, value, path):
        if not isinstance(value, str):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        if not value and not self.empty:
            raise Bad(path, "is empty")
        if self.one_line and shellsafe.line_break_problem(value):  # the emitters' one set
            raise Bad(path, f"{_shown(value)} holds a line break, NUL or control character")
        return value


class Int(Spec):
    """A whole number (not a bool, not a float) from `low` to `high`."""

    def __init__(self, low: int = 0, high: int = 2 ** 63 - 1):
        self.low, self.high = low, high
        self.what = f"a whole number from {low} to {high}"

    def take(self, value, path):
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class Num(Spec):
    """A finite number (int or float, not a bool) from `low` to `high`."""

    def __init__(self, low: float = -math.inf, high: float = math.inf):
        self.low, self.high = low, high
        self.what = "a number" + ("" if math.isinf(low) and math.isinf(high) else f" from {low:g} to {high:g}")

    def take(self, value, path):
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or not self.low <= value <= self.high):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class Bool(Spec):
    what = "true or false"

    def take(self, value, path):
        if not isinstance(value, bool):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class Scalar(Spec):
    """A string, number or bool (a TOML value that is text once written out: an env value)."""

    what = "a string, number or boolean"

    def take(self, value, path):
        if not isinstance(value, (str, int, float, bool)):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class AbsPath(Spec):
    """An absolute path on one line (it becomes a word of a command or a directory to open)."""

    what = "an absolute path"

    def take(self, value, path):
        Str(one_line=True).take(value, path)
        if not value.startswith("/"):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class Name(Spec):
    """A plain name: letters, digits and '_' (a shell function name, a range, an env name)."""

    what = "a plain name (letters, digits and '_', not starting with a digit)"

    def take(self, value, path):
        if not shellsafe.is_env_name(value):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        return value


class Optional(Spec):
    """`spec`, or missing, or null (then `default`); with `fill=False` a missing field stays
    missing, so a record's fields are the ones it was stored with."""

    def __init__(self, spec: Spec, default=None, *, fill: bool = True):
        self.spec, self.default, self.fill = spec, default, fill
        self.what = spec.what + " or null"

    def take(self, value, path):
        return self.default if value is None else self.spec.take(value, path)


class _Collection(Spec):
    """A list or a table (`kind`, held as `holder`) whose `nonempty` refuses an empty one."""

    kind, holder = "list", list

    def __init__(self, nonempty: bool):
        self.nonempty = nonempty
        self.what = f"a {'non-empty ' if nonempty else ''}{self.kind}"

    def checked(self, value, path):
        if not isinstance(value, self.holder):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        if self.nonempty and not value:
            raise Bad(path, f"is an empty {self.kind}")
        return value


class ListOf(_Collection):
    """A list of `item`s; `nonempty` refuses []; `most` caps its length."""

    def __init__(self, item: Spec, *, nonempty: bool = False, most: int = 1 << 20):
        super().__init__(nonempty)
        self.item, self.most = item, most

    def take(self, value, path):
        if len(self.checked(value, path)) > self.most:
            raise Bad(path, f"has {len(value)} entries (at most {self.most})")
        return [self.item.take(v, _join(path, i)) for i, v in enumerate(value)]


class TableOf(_Collection):
    """A table whose keys pass `key` (a Spec for strings) and whose values pass `value`."""

    kind, holder = "table", dict

    def __init__(self, value: Spec, *, key: Spec | None = None, nonempty: bool = False):
        super().__init__(nonempty)
        self.key, self.value = key or Str(), value

    def take(self, value, path):
        self.checked(value, path)
        out = {}
        for k, v in value.items():
            self.key.take(k, path + " key" if path else "key")
            out[k] = self.value.take(v, _join(path, k))
        return out


class EnvTable(Spec):
    """`{NAME: value}` for a process's environment: every name an environment variable name,
    every value one line (shellsafe's rules, which every emitter applies too); a number or a
    bool, as TOML writes them, becomes its text."""

    what = "a table of NAME = \"value\""

    def take(self, value, path):
        if not isinstance(value, dict):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        out = {}
        for k, v in value.items():
            problem = shellsafe.env_name_problem(k)
            if problem:
                raise Bad(path, problem)
            if isinstance(v, (bool, int, float)):
                v = str(v).lower() if isinstance(v, bool) else str(v)
            problem = shellsafe.env_value_problem(v)
            if problem:
                raise Bad(_join(path, k), problem)
            out[k] = v
        return out


class JSONTree(Spec):
    """`spec` over a value read from JSON, first held to what RFC 8259 calls JSON and the readers
    can walk: every number finite (Python's json reads NaN and Infinity, which no JSON reader
    after rocforge takes back) and nothing nested deeper than `depth` (the readers and printers
    recurse).  It walks every key, the unread ones too, without recursing itself."""

    def __init__(self, spec: Spec, depth: int = 64):
        self.spec, self.depth = spec, depth
        self.what = spec.what

    def take(self, value, path):
        todo = [(value, path, 0)]
        while todo:
            item, where, level = todo.pop()
            if level > self.depth:
                raise Bad(where, f"is nested more than {self.depth} deep")
            if isinstance(item, float) and not math.isfinite(item):
                spelled = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
                raise Bad(where, f"{spelled} is not a JSON number")
            if isinstance(item, dict):
                todo += [(v, _join(where, k), level + 1) for k, v in item.items()]
            elif isinstance(item, list):
                todo += [(v, _join(where, i), level + 1) for i, v in enumerate(item)]
        return self.spec.take(value, path)


class Record(Spec):
    """A table with named fields: `fields` maps each name to its Spec (an `Optional` one may be
    missing: it is then given its default, so code after the check can index every declared
    field, unless it says `fill=False`); `rules` are checks across fields, `rule(record, path)` raising Bad."""

    what = "a table"

    def __init__(self, fields: dict[str, Spec], *, rules: tuple = ()):
        self.fields, self.rules = fields, rules

    def take(self, value, path):
        if not isinstance(value, dict):
            raise Bad(path, f"{_shown(value)} is not {self.what}")
        out = dict(value)
        for name, spec in self.fields.items():
            where = _join(path, name)
            if name not in value and not isinstance(spec, Optional):
                raise Bad(where, "is missing")
            if name not in value and not spec.fill:
                continue
            if value.get(name) is None and not isinstance(spec, Optional):
                raise Bad(where, f"is null, not {spec.what}")
            out[name] = spec.take(value.get(name), where)
        for rule in self.rules:
            rule(out, path)
        return out


def inside(path_of, prefix_field: str, what: str):
    """A Record rule: the program `path_of(record)` names (absolute, links resolved as they are on
    disk now) lies inside the directory in `prefix_field`, so a record cannot point a command at
    a program outside the build it names."""
    def rule(record: dict, path: str) -> None:
        field, program = path_of(record)
        prefix = record[prefix_field]
        if not isinstance(program, str) or not program.startswith("/"):
            raise Bad(_join(path, field), f"{what} {_shown(program)} is not an absolute path")
        base = os.path.realpath(prefix)
        real = os.path.realpath(program)
        if os.path.commonpath([base, real]) != base:
            shown = program if real == os.path.normpath(program) else f"{program} (-> {real})"
            raise Bad(_join(path, field), f"{what} {_shown(shown)} lies outside the build prefix "
                      f"{_join(path, prefix_field)} = {_shown(prefix)}")
    return rule


def check(value, spec: Spec, where: str, error, hint: str | None = None):
    """`value` checked against `spec`, or `error` (a RocforgeError class) with one line: `where`
    (the file, or the store and record) and the field that is wrong."""
    try:
        return spec.take(value, "")
    except Bad as bad:
        field = f"field {bad.field}" if bad.field else "the record"
        raise error(f"{where}: {field} {bad.problem}" if bad.problem.startswith("is ")
                    else f"{where}: {field}: {bad.problem}", hint) from None
