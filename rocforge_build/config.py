"""rocforge's configuration: package defaults (`data/defaults.toml`) under the user's config file
(`paths.config_file()`), read and written with tomlkit so comments and layout survive edits.

Keys are dotted (`nightly.sources.cdn.url`). A key must exist in the defaults (with the same
type), except under an *open* table (`nightly.sources`) where a new entry may be added with
the fields its siblings have. Unknown keys are errors with a "did you mean" suggestion.
Every value is checked in `_check` (its type, and for a number its range from BOUNDS: finite,
no nan/inf) when set with `rocforge config set` and whenever the user's file is read: a
hand-edited out-of-range value is one ConfigError (exit 2) naming the key, the range and the file.
"""

from __future__ import annotations

import os
from functools import cache

from rocforge_build import paths
from rocforge_build.errors import ConfigError
from rocforge_build.records import Record, init
from rocforge_build.resources import load_toml, package_data
from rocforge_build.toml_subset import tomllib_parse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on `rocforge env`'s path
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

DEFAULTS_FILE = package_data("defaults.toml")
_MAX_CHARS = 4 << 20  # a config file is a few kB: 4 Mi characters is far past any meant
OPEN_TABLES = ("nightly.sources",)


@cache
def _defaults_cached() -> dict:
    return load_toml(DEFAULTS_FILE, "defaults")


def defaults() -> dict:
    return _copy(_defaults_cached())


def _copy(value):
    """copy.deepcopy of TOML data, without importing copy (weakref) on `rocforge env`'s path:
    tables and arrays are the only mutable values TOML has, and it shares none of them."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def config_file() -> Path:
    return paths.config_file()


def _read(path: str | os.PathLike[str]) -> str | None:
    """The config file's text (None when there is none); anything unreadable is one ConfigError.
    Opened without waiting (O_NONBLOCK: a FIFO at that name would otherwise hang every command,
    `rocforge env` in each new shell too) and read only when it is a regular file; a link to one
    is followed (dotfile managers link config files)."""
    import errno
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # what opening a socket answers
            raise _not_regular(path) from exc
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"config file {path} is a directory, not a file",
                              f"remove or rename {path}; `rocforge config set` creates the file")
        if not stat.S_ISREG(mode):
            raise _not_regular(path)
        with os.fdopen(fd, encoding="utf-8", closefd=False) as fh:  # as Path.read_text reads
            text = fh.read(_MAX_CHARS + 1)  # bounded: a huge file is never held in memory
        if len(text) > _MAX_CHARS:
            raise ConfigError(f"config file {path} is longer than {_MAX_CHARS >> 20} Mi "
                              "characters: not a config file rocforge reads",
                              f"remove or rename {path}; `rocforge config set` creates the file")
        return text
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); TOML files "
                          "are UTF-8", f"fix or delete {path}") from exc
    finally:
        os.close(fd)


def _not_regular(path: str | os.PathLike[str]) -> ConfigError:
    return ConfigError(f"config file {path} is not a regular file (a FIFO, socket or device): "
                       "rocforge does not read from it",
                       f"remove or rename {path}; `rocforge config set` creates the file")


def _load_doc():
    import tomlkit

    path = config_file()
    text = _read(path)
    if text is None:
        return tomlkit.document()
    try:
        doc = tomlkit.parse(text)
    except Exception as exc:  # tomlkit raises its own ParseError family
        raise ConfigError(f"{path} is not valid TOML: {exc}",
                          f"fix or delete {path}; `rocforge config list` shows the defaults") from exc
    _check_ours(doc, path)
    return doc


def _check_ours(doc, path) -> None:
    """Refuse to rewrite a TOML file whose top-level tables are not rocforge's: a config.toml
    linked to a pyproject.toml ([project]) or a Cargo.toml is someone else's file, and
    `config set` would reformat it and add rocforge's keys to it."""
    foreign = [name for name in doc if name not in _defaults_cached()]
    if foreign:
        shown = f"{path} (a link to {os.path.realpath(path)})" if os.path.islink(path) else path
        raise ConfigError(
            f"{shown} is not rocforge's config file: its table(s) {', '.join(foreign)} are not "
            "rocforge's; nothing was written",
            "point config.toml at a file of rocforge's own, or remove it; rocforge's tables are "
            + ", ".join(_defaults_cached()))


def user() -> dict:
    """The user's config as plain data (empty when there is no file)."""
    path = paths.config_file_str()
    text = _read(path)
    if text is None:
        return {}
    import tomllib  # only for a config file that is there

    try:
        return tomllib_parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}",
                          f"fix or delete {path}; `rocforge config list` shows the defaults") from exc


def effective() -> dict:
    """Defaults with the user's file laid over them (validated)."""
    merged = defaults()
    overrides = user()
    for key, value in _flatten(overrides).items():
        _check(key, value, source=paths.config_file_str())
        _put(merged, key, value)
    if overrides:
        _check_whole(merged, source=paths.config_file_str())
    return merged


def nightly_prefix(cfg: dict | None = None) -> Path:
    """Where `rocforge nightly install` puts TheRock trees: `nightly.prefix` when set, else
    `paths.nightly_prefix()`."""
    from pathlib import Path

    return Path(nightly_prefix_str(cfg))


def nightly_prefix_str(cfg: dict | None = None) -> str:
    """nightly_prefix() as a string: `rocforge env` asks for it without importing pathlib."""
    configured = (cfg or effective())["nightly"].get("prefix", "")
    if not configured:
        return paths.nightly_prefix_str()
    path = os.path.expanduser(configured)  # as Path(configured).expanduser().absolute()
    return paths.path_str(path if path.startswith("/") else os.path.join(os.getcwd(), path))


def get(key: str) -> Any:
    value = _lookup(effective(), key)
    if value is _MISSING:
        raise ConfigError(f"unknown configuration key {key!r}", _suggest(key))
    return value


def origin(key: str) -> str:
    return "user" if _lookup(user(), key) is not _MISSING else "default"


def items() -> list[tuple[str, Any, str]]:
    """Every leaf key: (key, effective value, "default" | "user")."""
    eff = _flatten(effective())
    mine = _flatten(user())
    return [(k, v, "user" if k in mine else "default") for k, v in sorted(eff.items())]


def parse_value(raw: str) -> Any:
    """A command-line value: a TOML literal when it is one (`3`, `true`, `["a", "b"]`, `"x"`),
    otherwise the plain string."""
    import tomllib

    try:
        return tomllib_parse(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def set_value(key: str, value: Any) -> None:
    """Write one key into the user's config file, keeping its comments and layout."""
    import tomlkit

    _check(key, value, source="the command line")
    merged = defaults()  # the file's other keys as they are: a bad one is no reason to refuse
    for other, was in _flatten(user()).items():
        try:
            _check(other, was, source="")
        except ConfigError:
            continue
        _put(merged, other, was)
    _put(merged, key, value)
    _check_whole(merged, source="the command line")
    doc = _load_doc()
    table = doc
    parts = key.split(".")
    for part in parts[:-1]:
        if part not in table:
            table[part] = tomlkit.table()
        table = table[part]
        if not hasattr(table, "keys"):
            raise ConfigError(f"{key}: {part} is not a table in {config_file()}")
    table[parts[-1]] = value
    _write(doc)


def unset(key: str) -> bool:
    """Drop a key from the user's file (the default applies again). False if it was not set."""
    doc = _load_doc()
    parts = key.split(".")
    chain = [doc]
    for part in parts[:-1]:
        if part not in chain[-1]:
            return False
        chain.append(chain[-1][part])
    if parts[-1] not in chain[-1]:
        return False
    del chain[-1][parts[-1]]
    # drop tables left empty
    for depth in range(len(parts) - 1, 0, -1):
        if len(chain[depth]) == 0:
            del chain[depth - 1][parts[depth - 1]]
    _write(doc)
    return True


# -- internals -------------------------------------------------------------------------------------

class _Missing:
    pass


_MISSING = _Missing()


def _write(doc) -> None:
    import tomlkit

    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():  # a dotfile manager's link: change the file it points to, keep the link
        path = path.resolve()
    paths.write_whole(path, tomlkit.dumps(doc))


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _lookup(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _put(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def _schema_default(key: str) -> Any:
    """The default value that gives `key` its type (a sibling's for new open-table entries)."""
    base = _defaults_cached()
    found = _lookup(base, key)
    if found is not _MISSING:
        return found
    for table in OPEN_TABLES:
        if key.startswith(table + "."):
            rest = key[len(table) + 1:].split(".")
            siblings = _lookup(base, table)
            if len(rest) == 2 and isinstance(siblings, dict) and siblings:
                template = next(iter(siblings.values()))
                if rest[1] in template:
                    return template[rest[1]]
    return _MISSING


# TOML 1.0.0, Integer: "Arbitrary 64-bit signed integers ... should be accepted and handled
# losslessly"; a larger one is an error in other readers (and in tomlkit round trips)
TOML_MAX_INT = 2 ** 63 - 1


class Bound(Record):
    """The allowed range of a numeric key: what the reliability promises say of it
    (docs/concepts/reliability.md)."""

    __slots__ = ("least", "strict", "integer", "most")

    def __init__(self, least: float,
                 strict: bool = False,  # `> least` (a zero would divide, or stop everything at once)
                 integer: bool = False,
                 most: float | None = None):  # socket timeouts past a few years overflow time_t
        init(self, least, strict, integer, most)

    @property
    def limit(self) -> float | None:
        """The largest value: `most`, and for an integer key at most TOML's largest integer."""
        return min(self.most, TOML_MAX_INT) if self.integer and self.most is not None else (
            TOML_MAX_INT if self.integer else self.most)

    def allows(self, value: Any) -> bool:
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, int) and abs(value) > TOML_MAX_INT:  # any numeric key
            return False
        import math  # only for a value the user set

        if not math.isfinite(value):
            return False
        low_ok = value > self.least if self.strict else value >= self.least
        return low_ok and (self.limit is None or value <= self.limit)

    def text(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        rng = f"{'more than' if self.strict else 'at least'} {self.least:g}"
        most = self.limit
        return kind + " " + rng + (
            "" if most is None else f" and at most {most}" if isinstance(most, int)
            else f" and at most {most:g}")


_DAY = 86400.0
# Every numeric key of data/defaults.toml and its range, checked here only (`config set`, a
# hand-edited config file, and download_policy.policy_from_config all come through `_check`).
BOUNDS: dict[str, Bound] = {
    "nightly.extract_ratio": Bound(0),
    "nightly.keep": Bound(0, integer=True),
    "download.attempts": Bound(1, integer=True),
    "download.connect_timeout": Bound(0, strict=True, most=_DAY),
    "download.read_timeout": Bound(0, strict=True, most=_DAY),
    "download.min_rate": Bound(0),  # 0 turns the rate check off
    "download.rate_window": Bound(0, strict=True, most=_DAY),
    "download.deadline": Bound(0, strict=True, most=7 * _DAY),
    "download.listing_deadline": Bound(0, strict=True, most=_DAY),
    "download.max_listing_bytes": Bound(1, integer=True),
    "download.max_unsized_bytes": Bound(1, integer=True),
    "build.distribute_jobs": Bound(0, integer=True),
    "substitute.max_layer_bytes": Bound(1, integer=True),
    "substitute.timeout": Bound(0, strict=True, most=_DAY),
}
_ANY_NUMBER = Bound(float("-inf"))  # a numeric key nobody bounded yet: still finite


def check_value(key: str, value: Any, *, source: str) -> None:
    """Raise a ConfigError unless `value` is a valid value of `key` (type, then range)."""
    _check(key, value, source=source)


def _check(key: str, value: Any, *, source: str) -> None:
    want = _schema_default(key)
    if want is _MISSING:
        raise ConfigError(f"unknown configuration key {key!r} (from {source})", _suggest(key))
    if isinstance(want, dict):
        raise ConfigError(f"{key} is a table; set one of its keys (see `rocforge config list`)")
    if not _same_type(want, value):
        raise ConfigError(
            f"{key} must be {_type_name(want)}, got {_type_name(value)} {value!r} (from {source})",
            f"e.g. rocforge config set {key} {_example(want)}",
        )
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        bound = BOUNDS.get(key, _ANY_NUMBER)
        if isinstance(value, int) and abs(value) > TOML_MAX_INT:
            raise ConfigError(f"{key} must be {bound.text()}, got {value!r} (from {source}): "
                              f"TOML integers are 64-bit, at most {TOML_MAX_INT}",
                              f"e.g. rocforge config set {key} {want!r}, or rocforge config "
                              f"unset {key}")
        if not bound.allows(value):
            raise ConfigError(f"{key} must be {bound.text()}, got {value!r} (from {source})",
                              f"e.g. rocforge config set {key} {want!r}, or rocforge config "
                              f"unset {key}")
    elif value != want:  # a default is good by construction: `rocforge env` checks no more
        from rocforge_build.config_values import problem

        wrong = problem(key, value)
        if wrong:
            shown = ("a URL (not shown: it may hold a password)" if key == "cache.remote" else
                     "(not shown: it may hold a credential)" if key == "substitute.stores" else
                     repr(value))
            raise ConfigError(f"{key} {wrong}, got {shown} (from {source})",
                              f"e.g. rocforge config set {key} {_example(want)}, or rocforge "
                              f"config unset {key}")


def _check_whole(merged: dict, *, source: str) -> None:
    """The rules between keys (config_values.problem_of_whole) on the merged configuration."""
    from rocforge_build.config_values import problem_of_whole

    wrong = problem_of_whole(merged)
    if wrong:
        key, what = wrong
        raise ConfigError(f"{key} {what} (from {source})",
                          f"define the source (rocforge config set nightly.sources.NAME.url URL) "
                          f"or rocforge config unset {key}")


def _same_type(want: Any, value: Any) -> bool:
    if isinstance(want, bool) or isinstance(value, bool):
        return isinstance(want, bool) and isinstance(value, bool)
    if isinstance(want, float):
        return isinstance(value, (int, float))
    if isinstance(want, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(want))


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list of strings", dict: "a table"}.get(type(v), type(v).__name__)


def _example(v: Any) -> str:
    if isinstance(v, list):
        return "'[\"a\", \"b\"]'"
    if isinstance(v, bool):
        return "true"
    return repr(v) if not isinstance(v, str) or not v else v


def _suggest(key: str) -> str:
    known = list(_flatten(_defaults_cached()))
    import difflib  # only for the error

    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if close:
        return f"did you mean {', '.join(close)}?"
    return "`rocforge config list` shows every key"
