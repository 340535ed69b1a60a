"""Build recipes: TOML files in `recipes/`, loaded and validated in one place.

A recipe is declarations only (spack-style): where the source comes from, which backends exist,
which CMake options / environment / patches / stops / notes apply `when` a condition holds
(see `conditions.py`), what to build and how to smoke-test it.  Every error names the recipe and
the key; unknown keys get a "did you mean" from difflib.
"""

from __future__ import annotations

import difflib
import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocforge_build import argtypes, refs, resources, shellsafe
from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.forge import conditions
from rocforge_build.toml_subset import tomllib_parse

TOOLCHAINS = ("hip", "vulkan", "host")

RULE_KINDS = ("default", "option", "env", "patch", "stop", "note", "smoke", "depends", "output",
              "jobs")
# every text of a recipe (a reason, an evidence item, a message, a path) is printed on one line
# and recorded in the manifest: a few sentences at most
MAX_TEXT = 2000


@dataclass(frozen=True)
class _Key:
    """One key of the recipe format as `_check_keys` enforces it: its types, the types of a
    list's items, and a range (an integer's value, a list's length) so that no value is one the
    code that reads it cannot use."""
    types: tuple[type, ...]
    required: bool = False
    items: tuple[type, ...] = ()
    bounds: tuple[int, int] | None = None  # an integer's lowest and highest value
    most: int | None = None  # a list's most items


def _key(*types: type, required: bool = False, items: tuple[type, ...] = (),
         bounds: tuple[int, int] | None = None, most: int | None = None) -> _Key:
    return _Key(types, required, items, bounds, most)


# beside every `reason` (one sentence saying why): its evidence, one source or figure per string
# (upstream issues and PRs, measurements, other projects' practice), printed under it in a plan
_EVIDENCE = _key(list, most=32)  # a reason's sources: a few, not a file

# table -> {key: its _Key}; lists of tables are validated per item.
_SCHEMA: dict[str, dict[str, _Key]] = {
    "": {
        "recipe": _key(dict, required=True), "source": _key(dict, required=True),
        "backends": _key(dict, required=True), "build": _key(dict), "venv": _key(dict),
        "verify": _key(dict), "known_bad": _key(list, items=(dict,), most=64),
        **{kind: _key(list, items=(dict,)) for kind in RULE_KINDS},
    },
    "recipe": {
        "name": _key(str, required=True), "description": _key(str), "homepage": _key(str),
    },
    "source": {
        "git": _key(str), "ref": _key(str), "url": _key(str),
        "sha256": _key(str), "subdir": _key(str), "version": _key(list, items=(dict,)),
        "sparse": _key(list, items=(str,)), "submodules": _key(bool),
        "pinned_version": _key(str),
    },
    "source.version": {"file": _key(str), "regex": _key(str), "git": _key(str)},
    "backends.*": {
        "description": _key(str), "toolchain": _key(str, required=True),
        "when": _key(dict), "unavailable": _key(str), "hint": _key(str),
    },
    "default": {"backend": _key(str, required=True), "when": _key(dict),
                "reason": _key(str, required=True), "evidence": _EVIDENCE},
    "option": {
        "name": _key(str, required=True), "when": _key(dict),
        # a CMake option's value: a list is joined with `;`; CMake reads integers as 64-bit
        "value": _key(str, bool, int, list, required=True, items=(str, bool, int),
                      bounds=(-2 ** 63, 2 ** 63 - 1)),
        "reason": _key(str, required=True), "evidence": _EVIDENCE, "declared": _key(bool),
    },
    "env": {
        "name": _key(str, required=True), "value": _key(str, required=True), "when": _key(dict),
        "reason": _key(str, required=True), "evidence": _EVIDENCE, "stage": _key(str),
    },
    "patch": {"file": _key(str, required=True), "when": _key(dict),
              "reason": _key(str, required=True), "evidence": _EVIDENCE},
    "stop": {"when": _key(dict, required=True), "message": _key(str, required=True),
             "hint": _key(str)},
    "note": {"when": _key(dict), "message": _key(str, required=True)},
    "build": {"targets": _key(list, items=(str,), most=argtypes.CMAKE_TARGETS_MAX),
              "generator": _key(str), "install": _key(str)},
    "smoke": {"run": _key(list, required=True, items=(str,)), "when": _key(dict)},
    # another recipe built first for the same target; `prepend` maps an environment variable to
    # a directory of the dependency's prefix ("." = the prefix) put in front of it for this
    # build; `source_include` is where the headers it installs live in its source (header
    # checks of a plan made before the dependency is built look there); `use_existing`: a rocforge
    # build of it for the target already in the builds directory is used as it is (not re-planned)
    "depends": {
        "recipe": _key(str, required=True), "when": _key(dict), "reason": _key(str, required=True),
        "evidence": _EVIDENCE,
        "backend": _key(str), "prepend": _key(dict), "source_include": _key(str),
        "use_existing": _key(bool),
    },
    # a file (glob) the install must contain, checked before the install replaces the old one
    "output": {"path": _key(str, required=True), "when": _key(dict),
               "reason": _key(str, required=True), "evidence": _EVIDENCE},
    # verify tools: CMake targets built only when a build names them (--cmake-target), with the
    # options that make them; installed under PREFIX/libexec/, not bin/ (forge/pipeline.py)
    "verify": {"targets": _key(list, required=True, items=(str,), most=argtypes.CMAKE_TARGETS_MAX),
               "options": _key(dict, required=True), "reason": _key(str, required=True),
               "evidence": _EVIDENCE},
    # a llama.cpp fault seen at one serving shape (measure/known_bad.py applies it): `when` on
    # facts a build's manifest records, the shape it breaks (flash attention, sequences in one
    # unified KV cache, their cells), what was seen, where the evidence is
    "known_bad": {"when": _key(dict, required=True), "fa": _key(bool),
                  "parallel_min": _key(int, bounds=(2, 4096)),
                  "cells_over": _key(int, bounds=(0, 2 ** 31)),
                  "symptom": _key(str, required=True), "seen": _key(str, required=True),
                  "hint": _key(str), "evidence": _key(list, required=True, items=(str,), most=32)},
    # a private virtual environment in the build directory with the source's Python requirements
    "venv": {"requirements": _key(list, items=(str,)), "packages": _key(list, items=(str,)),
             "reason": _key(str, required=True), "evidence": _EVIDENCE},
    # peak memory of one build job (the heaviest translation units), for the default -j
    # (forge/jobs.py: min(cores, MemAvailable / memory_mb)); a later rule that holds wins
    # (1 MB to 16 TiB: 0 would divide by zero, a negative or huge one means nothing)
    "jobs": {"memory_mb": _key(int, required=True, bounds=(1, 2 ** 24)), "when": _key(dict),
             "reason": _key(str, required=True), "evidence": _EVIDENCE},
}


# recipe, backend, dependency and patch names become path components (the default prefix
# `<recipe>-<target>-<backend>`, `patches/<recipe>/<file>`): plain names only, no `/`, no leading `.`
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_PLACEHOLDER_HINT = ("placeholders are plain names such as {target} or {prefix}; write a literal "
                     "brace as {{ or }}")


def _plain(value: str, where: str) -> None:
    if not _PLAIN.fullmatch(value):
        raise ConfigError(f"{where}: {value!r} is not a plain name (letters, digits, '_', '-', "
                          "'+', '.'; no '/', no leading '.')")


def placeholders(text: str, where: str) -> list[str]:
    """The `{name}` placeholders of a recipe value.  Only plain names: `{x.attr}`, `{x[0]}`,
    `{x!r}` and `{x:spec}` would reach into Python objects or formatting, so they are refused."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc} in {text!r}", _PLACEHOLDER_HINT) from exc
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ConfigError(f"{where}: placeholder {{{shown}}} in {text!r} is not a plain name",
                              _PLACEHOLDER_HINT)
        names.append(name)
    return names


def fill(text: str, ctx: dict, where: str = "value") -> str:
    """`text` with its `{name}` placeholders replaced from `ctx` (plain lookups, nothing else)."""
    placeholders(text, where)
    out = []
    for literal, name, _, _ in string.Formatter().parse(text):
        out.append(literal)
        if name is not None:
            if name not in ctx:
                raise ConfigError(f"value {text!r}: unknown placeholder {name!r}")
            out.append(str(ctx[name]))
    return "".join(out)


@dataclass(frozen=True)
class Rule:
    """One conditional declaration (option, env, patch, stop, note, default, smoke)."""

    kind: str
    data: dict[str, Any]
    when: dict | None = None

    def get(self, key: str, default=None):
        return self.data.get(key, default)


@dataclass(frozen=True)
class Backend:
    name: str
    toolchain: str
    description: str = ""
    when: dict | None = None
    unavailable: str | None = None
    hint: str | None = None


@dataclass(frozen=True)
class Source:
    git: str | None = None
    ref: str | None = None
    url: str | None = None
    sha256: str | None = None
    subdir: str | None = None
    version: tuple[dict, ...] = ()
    sparse: tuple[str, ...] = ()  # git: sparse (cone) checkout of these paths, shallow, blob-less
    submodules: bool = False  # git: check out submodules too (shallow)
    # the version of the tree at `url` (its sha256 pins it): `source_version` conditions are
    # decided before the download for it (a dry run, the checks before a fetch)
    pinned_version: str | None = None


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    description: str
    source: Source
    backends: dict[str, Backend]
    rules: tuple[Rule, ...]
    build_targets: tuple[str, ...] = ()
    text: str = field(default="", repr=False, compare=False)
    venv: dict | None = None
    install: str = "cmake"  # "ninja": the build step is `ninja install` (projects that need it)
    verify: dict | None = None  # `[verify]`: targets built only when named, and their options
    known_bad: tuple[dict, ...] = ()  # `[[known_bad]]`: faults of the built program at a shape

    @property
    def verify_targets(self) -> tuple[str, ...]:
        return tuple(self.verify["targets"]) if self.verify else ()

    def of(self, kind: str) -> list[Rule]:
        return [r for r in self.rules if r.kind == kind]

    @property
    def patches_dir(self) -> Path:
        """`<recipes dir>/../patches/<name>/` — for packaged and path recipes alike."""
        return self.path.parent.parent / "patches" / self.name

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "description": self.description,
            "source": {k: v for k, v in vars(self.source).items() if v not in (None, ())},
            "backends": {
                b.name: {"toolchain": b.toolchain, "description": b.description, "when": b.when}
                for b in self.backends.values()
            },
            "defaults": [r.data for r in self.of("default")],
            "options": [r.data for r in self.of("option")],
            "env": [r.data for r in self.of("env")],
            "patches": [r.data for r in self.of("patch")],
            "stops": [r.data for r in self.of("stop")],
            "notes": [r.data for r in self.of("note")],
            "smoke": [r.data for r in self.of("smoke")],
            "build_targets": list(self.build_targets),
            "depends": [r.data for r in self.of("depends")],
            "outputs": [r.data for r in self.of("output")],
            "venv": self.venv,
            "known_bad": list(self.known_bad),
        }


def _env_entry(item: dict, where: str) -> None:
    """An `[[env]]` name reaches shell scripts (`rocforge env`, the bundle launcher, image ENV
    lines) at every stage: it must be a plain name, and its value one line, checked here before
    anything else reads the recipe."""
    if "name" in item:
        shellsafe.check_env(item["name"], None, f"{where}.name", ConfigError)
    problem = isinstance(item.get("value"), str) and shellsafe.env_value_problem(item["value"])
    if problem:
        raise ConfigError(f"{where}.value: {problem}",
                          "environment values cannot carry a line break or NUL byte safely")


def _check_evidence(table: dict, where: str) -> None:
    """`evidence` is what a plan prints line by line under the reason: texts, none empty (that
    each is one line is `_check_texts`'s part, as for every text of a recipe)."""
    for i, item in enumerate(table.get("evidence", [])):
        if not isinstance(item, str) or not item.strip():
            got = "an empty string" if isinstance(item, str) else type(item).__name__
            raise ConfigError(f"{where}.evidence[{i}]: must be a one-line string (one source or "
                              f"figure), got {got}", 'evidence = ["owner/repo #123: what it shows", ...]')


def _check_texts(value: Any, where: str, key_path: str) -> None:
    """Every string anywhere in a recipe, keys too, is printed on one line (a plan, a build's
    progress, `recipe show`, an error) and recorded in the manifest: none holds a character a
    terminal takes as a line break or a control (`shellsafe.TERMINAL_CONTROLS`), and none is
    longer than `MAX_TEXT`."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where, f"{key_path}: a key" if key_path else "a key")
            _check_texts(item, where, f"{key_path}.{key}" if key_path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_texts(item, where, f"{key_path}[{i}]")
    elif isinstance(value, str):
        _check_text(value, where, key_path)


# the code a `source_contains` / `header_contains` condition looks for may span lines: it is
# searched for, and shown in a plan only when it is one short line (conditions._looked_for)
_CODE_TEXT = re.compile(r".*\b(source|header)_contains(\[[0-9]+\])?\.text")
_CODE_CONTROLS = shellsafe.TERMINAL_CONTROLS - {"\n"}


def _check_text(text: str, where: str, key_path: str) -> None:
    controls = _CODE_CONTROLS if _CODE_TEXT.fullmatch(key_path) else shellsafe.TERMINAL_CONTROLS
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{where}: {key_path}: {len(text)} characters, at most {MAX_TEXT}",
                          "a recipe's texts are a sentence or a source each; link to the rest")
    bad = next((c for c in text if c in controls), None)
    if bad is not None:
        raise ConfigError(f"{where}: {key_path}: holds U+{ord(bad):04X}, a line break or "
                          "terminal control character", "a recipe's texts are one plain line each")


def evidence_lines(items, indent: str) -> list[str]:
    """A reason's evidence as shown under it (plans, `recipe show`): `evidence:`, then one source
    or figure a line, aligned."""
    label = "evidence: "
    return [f"{indent}{label if i == 0 else ' ' * len(label)}{item}"
            for i, item in enumerate(items or ())]


def _check_keys(table: dict, schema_key: str, where: str) -> None:
    """`table` against its `_SCHEMA` entry: known keys, each of its types (a list's items too)
    and in its range, the required ones present."""
    schema = _SCHEMA[schema_key]
    for key, value in table.items():
        if key not in schema:
            close = difflib.get_close_matches(key, schema, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(schema)}"
            raise ConfigError(f"{where}: unknown key {key!r}", hint)
        spec = schema[key]
        _check_value(value, spec.types, spec, f"{where}.{key}")
        if isinstance(value, list) and spec.most is not None and len(value) > spec.most:
            raise ConfigError(f"{where}.{key}: {len(value)} items, at most {spec.most}")
        if isinstance(value, list) and spec.items:
            for i, item in enumerate(value):
                _check_value(item, spec.items, spec, f"{where}.{key}[{i}]")
    for key, spec in schema.items():
        if spec.required and key not in table:
            raise ConfigError(f"{where}: missing required key {key!r}")
    _check_evidence(table, where)


def _check_value(value: Any, types: tuple[type, ...], spec: _Key, where: str) -> None:
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{where}: must be {names}, got {type(value).__name__}")
    if spec.bounds and isinstance(value, int) and not isinstance(value, bool):
        low, high = spec.bounds
        if not low <= value <= high:
            raise ConfigError(f"{where}: {value} is out of range (give {low} to {high})")


def parse(text: str, path: Path) -> Recipe:
    """Validate and build a Recipe from TOML text; errors say `recipe NAME: key: problem`."""
    label = path.stem
    try:
        raw = tomllib_parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"recipe {label} ({path}): invalid TOML: {exc}") from exc
    name = raw.get("recipe", {}).get("name", label) if isinstance(raw.get("recipe"), dict) else label
    where = f"recipe {name if isinstance(name, str) and _PLAIN.fullmatch(name) else label}"
    _check_texts(raw, f"{where} ({path})", "")  # before any other check prints a part of it
    _check_keys(raw, "", where)
    _check_keys(raw["recipe"], "recipe", f"{where}: recipe")
    _plain(name, f"recipe ({path}): recipe.name")
    source = _parse_source(raw["source"], name, path, where)
    backends = _parse_backends(raw["backends"], where)
    rules = _parse_rules(raw, backends, name, path, where)
    build = raw.get("build", {})
    _check_keys(build, "build", f"{where}: build")
    if build.get("install", "cmake") not in ("cmake", "ninja"):
        raise ConfigError(f"{where}: build.install: must be \"cmake\" (cmake --install after the "
                          "build) or \"ninja\" (the build step is `ninja install`, into DESTDIR)")
    for i, target in enumerate(build.get("targets", [])):  # each reaches ninja's command line
        problem = argtypes.cmake_target_problem(target)
        if problem:
            raise ConfigError(f"{where}: build.targets[{i}]: {problem}")
    venv = raw.get("venv")
    if venv is not None:
        _check_keys(venv, "venv", f"{where}: venv")
    verify = raw.get("verify")
    if verify is not None:
        _check_verify(verify, f"{where}: verify")
    known_bad = _parse_known_bad(raw.get("known_bad", []), where)
    return Recipe(
        name=name, path=path, description=raw["recipe"].get("description", ""), source=source,
        backends=backends, rules=tuple(rules), build_targets=tuple(build.get("targets", [])),
        text=text, venv=venv, install=build.get("install", "cmake"), verify=verify,
        known_bad=known_bad,
    )


# what a build's manifest records, so a fault's `when` can be decided for a finished build
KNOWN_BAD_WHEN = ("backend", "source_version", "target")


def _parse_known_bad(items: list, where: str) -> tuple[dict, ...]:
    """The `[[known_bad]]` table: each entry's `when` uses only facts a build's manifest records
    (a fault is matched against a finished build, never a plan) and names at least one shape
    limit, so that an entry never condemns every shape of a build."""
    for i, item in enumerate(items):
        iwhere = f"{where}: known_bad[{i}]"
        _check_keys(item, "known_bad", iwhere)
        conditions.validate(item["when"], f"{iwhere}.when")
        for key in item["when"]:
            if key not in KNOWN_BAD_WHEN:
                raise ConfigError(f"{iwhere}.when: {key!r} is not recorded in a build's manifest",
                                  f"a known fault's `when` uses {', '.join(KNOWN_BAD_WHEN)}")
        if not any(k in item for k in ("fa", "parallel_min", "cells_over")):
            raise ConfigError(f"{iwhere}: names no shape (fa, parallel_min, cells_over)",
                              "a known fault names the shape it was seen at")
    return tuple(items)


def _check_verify(verify: dict, where: str) -> None:
    """The `[verify]` table: its targets reach ninja's command line and its options CMake's, as a
    `[[option]]`'s do (plain names; a boolean, integer or string value)."""
    _check_keys(verify, "verify", where)
    for i, target in enumerate(verify["targets"]):
        problem = argtypes.cmake_target_problem(target)
        if problem:
            raise ConfigError(f"{where}: targets[{i}]: {problem}")
    for name, value in verify["options"].items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not isinstance(value, (bool, int, str)):
            raise ConfigError(f"{where}: options.{name}: an option is a plain CMake name with a "
                              "boolean, integer or string value")


def _parse_source(src: dict, name: str, path: Path, where: str) -> Source:
    """The [source] table: a pinned git ref or a checksummed tarball, since a build must be
    reproducible and its ref becomes a git argument."""
    _check_keys(src, "source", f"{where}: source")
    if not (src.get("git") or src.get("url")):
        raise ConfigError(f"{where}: source: needs `git` (+ `ref`) or `url` (+ `sha256`)")
    if src.get("url") and not src.get("sha256") and not src["url"].startswith("file:"):
        raise ConfigError(f"{where}: source.sha256: required with a remote `url`",
                          "pin the tarball: sha256sum FILE")
    if src.get("git") and not src.get("ref"):
        raise ConfigError(f"{where}: source.ref: required with `git` (a tag or commit)")
    if isinstance(src.get("ref"), str):  # it becomes a git argument: never an option
        refs.check_git_ref(src["ref"], f"recipe {name} ({path}): source.ref", ConfigError)
    if isinstance(src.get("git"), str):  # never a transport that runs a program (ext::)
        refs.check_git_url(src["git"], f"recipe {name} ({path}): source.git", ConfigError)
    for i, probe in enumerate(src.get("version", [])):
        _check_keys(probe, "source.version", f"{where}: source.version[{i}]")
    if src.get("pinned_version") and not (src.get("url") and src.get("sha256")):
        raise ConfigError(f"{where}: source.pinned_version: the version of the pinned `url` "
                          "(+ `sha256`), which this source lacks")
    source = Source(
        git=src.get("git"), ref=src.get("ref"), url=src.get("url"), sha256=src.get("sha256"),
        subdir=src.get("subdir"), version=tuple(src.get("version", [])),
        sparse=tuple(src.get("sparse", [])), submodules=src.get("submodules", False),
        pinned_version=src.get("pinned_version"),
    )
    if (source.sparse or source.submodules) and not source.git:
        raise ConfigError(f"{where}: source.sparse / source.submodules need a `git` source")
    if not all(isinstance(p, str) and p and not p.startswith("/") for p in source.sparse):
        raise ConfigError(f"{where}: source.sparse: must be a list of relative directory paths")
    return source


def _parse_backends(table: dict, where: str) -> dict[str, Backend]:
    """The [backends.*] tables: each names a known toolchain and a valid `when`, so a plan
    never meets an unknown toolchain; a recipe needs at least one."""
    backends: dict[str, Backend] = {}
    for bname, b in table.items():
        bwhere = f"{where}: backends.{bname}"
        _plain(bname, f"{where}: backends")
        if not isinstance(b, dict):
            raise ConfigError(f"{bwhere}: must be a table")
        _check_keys(b, "backends.*", bwhere)
        if b["toolchain"] not in TOOLCHAINS:
            raise ConfigError(f"{bwhere}.toolchain: {b['toolchain']!r} is not one of {', '.join(TOOLCHAINS)}")
        if "when" in b:
            conditions.validate(b["when"], f"{bwhere}.when")
        backends[bname] = Backend(bname, b["toolchain"], b.get("description", ""), b.get("when"),
                                  b.get("unavailable"), b.get("hint"))
    if not backends:
        raise ConfigError(f"{where}: backends: declare at least one backend")
    return backends


def _parse_rules(raw: dict, backends: dict[str, Backend], name: str, path: Path,
                 where: str) -> list[Rule]:
    """The [[default]], [[option]], [[env]], ... arrays of tables, checked here so that a bad
    rule fails at load time with its place named, not half-way through a build."""
    rules: list[Rule] = []
    for kind in RULE_KINDS:
        for i, item in enumerate(raw.get(kind, [])):
            iwhere = f"{where}: {kind}[{i}]"
            if kind == "env":
                _env_entry(item, f"recipe {name} ({path}): env[{i}]")
            label_key = item.get("name") or item.get("file") or item.get("backend")
            if label_key:
                iwhere = f"{where}: {kind}[{i}] ({label_key})"
            _check_keys(item, kind, iwhere)
            _check_rule(kind, item, backends, name, path, iwhere)
            rules.append(Rule(kind, item, item.get("when")))
    return rules


def _check_rule(kind: str, item: dict, backends: dict[str, Backend], name: str, path: Path,
                iwhere: str) -> None:
    """The checks one rule's kind calls for beyond its key schema: conditions, names that become
    paths, placeholders, self-dependency, patch files present, smoke commands as argv lists."""
    if "when" in item:
        conditions.validate(item["when"], f"{iwhere}.when")
    if kind == "default" and item["backend"] not in backends:
        raise ConfigError(f"{iwhere}.backend: {item['backend']!r} is not a declared backend")
    if kind == "env" and item.get("stage", "configure") not in ("configure", "build", "runtime",
                                                                "export"):
        raise ConfigError(f"{iwhere}.stage: must be configure, build, runtime or export")
    if kind in ("depends", "patch"):
        _plain(item["recipe" if kind == "depends" else "file"],
               f"{iwhere}.{'recipe' if kind == 'depends' else 'file'}")
    for key in ("value", "path"):  # what plan fills in: option/env values, output paths
        for v in item.get(key, []) if isinstance(item.get(key), list) else [item.get(key)]:
            if kind in ("option", "env", "output") and isinstance(v, str):
                placeholders(v, f"{iwhere}.{key}")
    if kind == "depends" and item["recipe"] == name:
        raise ConfigError(f"{iwhere}.recipe: a recipe cannot depend on itself")
    if kind == "patch" and not (path.parent.parent / "patches" / name / item["file"]).is_file():
        raise ConfigError(f"{iwhere}.file: {item['file']} not found in "
                          f"{path.parent.parent / 'patches' / name}")


def load_file(path: Path) -> Recipe:
    from rocforge_build import userpath  # at most 4 MiB: never a huge file held in memory

    try:
        text = userpath.read_text(path, "recipe file")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"recipe file {path} is not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"recipe file {path} is unreadable: {exc.strerror}") from exc
    return parse(text, path.resolve())


def available() -> dict[str, Path]:
    """Packaged recipes by name."""
    return {p.stem: p for p in sorted(resources.recipes_dir().glob("*.toml"))}


def load(name_or_path: str) -> Recipe:
    """A packaged recipe by name, or a recipe file by path (anything ending in .toml)."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        p = Path(name_or_path)
        from rocforge_build import userpath  # a FIFO would hang the read, a loop is no file

        userpath.require(p, "recipe file", hint="give the recipe's .toml file")
        return load_file(p)
    table = available()
    if name_or_path not in table:
        close = difflib.get_close_matches(name_or_path, table, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "see `rocforge recipe list`"
        raise UsageError(f"unknown recipe {name_or_path!r}", hint)
    return load_file(table[name_or_path])
