"""The one evaluator of recipe `when` conditions.

A condition is a TOML table; every key must hold (AND); a list value means any of its items
(OR); `not`, `any`, `all` nest.  Keys:

    target = "gfx1151" | ["gfx11*", ...]      the requested gfx target (fnmatch patterns)
    family = "gfx115X-all"                     a TheRock family serving the target
    backend = "hip" | [...]                    the chosen backend
    rocm = ">=6.4"                             the toolchain's ROCm version (PEP 440 specifier)
    source_version = ">=0.3,<0.3.10"           the source's version (recipe `[source.version]`)
    cmake_option = "GGML_HIP"                  the source's CMake files declare this option/cache var
    file = "ggml/src/ggml-cuda/fattn-wmma-f16.cu"   the source tree has this file
    source_contains = { file = "...", text = "...", means = "..." }  a source file contains a
                                               text; `means` says what that code is, for the
                                               plan's reason (else a short one-line text is quoted)
    header_contains = { header = "vulkan/vulkan_core.h", text = "VkLayerSettingEXT" }
                                               a header in the toolchain's include dirs has a text
    tool = "glslc"                             a program is found (toolchain env PATH first)
    pkgconfig = "liblzma"                      `pkg-config --exists liblzma` succeeds
    rocm_file = "lib/hipblaslt/library/TensileLibrary_lazy_{target}.dat"
                                               the toolchain's ROCm has this file (glob)
    glslc_extension = "GL_KHR_cooperative_matrix"  glslc compiles a shader requiring it
    cpu_flag = "amx_int8" | [...]              the build host's CPU has this flag (/proc/cpuinfo)
    toolchain_found = true                     the backend's toolchain was found (a dry run
                                               without one skips checks on its headers)
    rocblas_hipblaslt = false                  the HIP toolchain's rocBLAS does (true) / does not
                                               (false) link libhipblaslt, read from its ELF NEEDED
                                               entries as the resolver does; unknown: both False

Facts come from a `Facts` object (what is known about the request, the source and the host);
a fact that is unknown (no toolchain) makes its test False, and `explain()` says so — conditions
never raise on missing facts.  Before the source is read (a dry run downloads nothing) its facts
are not false but unknown: `judge()` answers True, False or None — None when only the source can
tell (`source_version`, `cmake_option`, `file`, `source_contains`), with the condition left to
decide as its reason — in three-valued logic: a key that is False decides an AND whatever the
source says, a True decides an OR, `not` keeps None.  `source_version` is known before the
fetch for the recipe's pinned source (`Facts.pinned_version`, the recipe's
`[source] pinned_version`).  In `text` values `{target}` stands for the requested target and
`{TARGET}` for it in capitals (`ROCWMMA_ARCH_{TARGET}`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocforge_build.errors import ConfigError

KEYS = (
    "target", "family", "backend", "rocm", "source_version", "cmake_option", "file",
    "source_contains", "header_contains", "tool", "glslc_extension", "toolchain_found",
    "pkgconfig", "rocm_file", "rocblas_hipblaslt", "cpu_flag", "not", "any", "all",
)

_OPTION_RE = re.compile(r"""\boption\s*\(\s*"?([A-Za-z_][A-Za-z0-9_]*)"?""", re.I)
_CACHE_RE = re.compile(r"""\bset\s*\(\s*"?([A-Za-z_][A-Za-z0-9_]*)"?\s[^)]*\bCACHE\b""", re.I | re.S)
_DEP_OPTION_RE = re.compile(r"""\bcmake_dependent_option\s*\(\s*"?([A-Za-z_][A-Za-z0-9_]*)""", re.I)
_SKIP_DIRS = {".git", "build", "node_modules", "__pycache__"}


def _cmake_files(tree: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("build-")]
        for name in filenames:
            if name == "CMakeLists.txt" or name.endswith(".cmake"):
                found.append(Path(dirpath) / name)
    return sorted(found)


def scan_cmake_options(tree: Path) -> dict[str, str]:
    """Option / cache variable names the tree's CMake files declare -> the file declaring it."""
    declared: dict[str, str] = {}
    for path in _cmake_files(tree):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        text = re.sub(r"#[^\n]*", "", text)
        rel = path.relative_to(tree).as_posix()
        for rx in (_OPTION_RE, _DEP_OPTION_RE, _CACHE_RE):
            for m in rx.finditer(text):
                declared.setdefault(m.group(1), rel)
    return declared


@dataclass
class SourceFacts:
    """Facts about a source tree, computed lazily and once."""

    tree: Path
    version: str | None = None

    @cached_property
    def cmake_options(self) -> dict[str, str]:
        return scan_cmake_options(self.tree)

    def has_file(self, rel: str) -> bool:
        return (self.tree / rel).is_file()

    def contains(self, rel: str, text: str) -> bool:
        try:
            return text in (self.tree / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False


def cpu_flags(root) -> frozenset[str] | None:
    """The CPU flags of the (inspected) host, from its /proc/cpuinfo; None when unreadable."""
    from rocforge_build.rootfs import open_regular

    try:
        with open_regular(root.host("/proc/cpuinfo"), "r", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return None


@dataclass
class HostFacts:
    """Facts about the build host: include dirs, programs, glslc abilities (probed lazily)."""

    include_dirs: tuple[Path, ...] = ()
    path: str | None = None  # PATH for program lookup (toolchain first)
    probe_glslc: Callable[[str], bool] | None = None
    _cache: dict = field(default_factory=dict)
    rocm_root: Path | None = None  # the HIP toolchain's ROCm tree (host path)
    cpu_flags: frozenset[str] | None = None  # the build host's CPU flags; None: unknown

    def header_contains(self, header: str, text: str) -> bool | None:
        for d in self.include_dirs:
            f = d / header
            if f.is_file():
                return text in f.read_text(encoding="utf-8", errors="replace")
        return None  # header absent: unknown

    def tool(self, name: str) -> str | None:
        from rocforge_build.proc import which

        return which(name, self.path)

    def pkgconfig(self, module: str) -> bool | None:
        """`pkg-config --exists MODULE`; None when pkg-config itself is missing."""
        from rocforge_build.proc import run

        exe = self.tool("pkg-config")
        if exe is None:
            return None
        key = ("pkg-config", module)
        if key not in self._cache:
            self._cache[key] = run([exe, "--exists", module], check=False).returncode == 0
        return self._cache[key]

    def glslc_extension(self, ext: str) -> bool | None:
        if self.probe_glslc is None:
            return None
        key = ("glslc", ext)
        if key not in self._cache:
            self._cache[key] = self.probe_glslc(ext)
        return self._cache[key]


@dataclass
class Facts:
    target: str | None = None
    families: tuple[str, ...] = ()
    backend: str | None = None
    rocm_version: str | None = None
    source: SourceFacts | None = None
    host: HostFacts | None = None
    toolchain_found: bool = False
    rocblas_hipblaslt: tuple[bool | None, str] = (None, "rocBLAS not read")
    # before the source is read: the version of the recipe's pinned source (its sha256 fixes it)
    pinned_version: str | None = None


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    m = re.search(r"\d+(\.\d+)*", text)
    if not m:
        return None
    try:
        return Version(m.group(0))
    except InvalidVersion:
        return None


def _spec(value: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ConfigError(f"{where}: {value!r} is not a version range such as '>=6.4,<7'") from exc


def validate(cond, where: str) -> None:
    """Check a condition's shape (called by the recipe loader): keys, types, specifiers."""
    import difflib

    if not isinstance(cond, Mapping):
        raise ConfigError(f"{where}: a condition must be a table, got {type(cond).__name__}")
    for key, value in cond.items():
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(KEYS)}"
            raise ConfigError(f"{where}: unknown condition key {key!r}", hint)
        sub = f"{where}.{key}"
        if key == "not":
            validate(value, sub)
        elif key in ("any", "all"):
            if not isinstance(value, list) or not value:
                raise ConfigError(f"{sub}: must be a non-empty list of conditions")
            for i, item in enumerate(value):
                validate(item, f"{sub}[{i}]")
        elif key in ("rocm", "source_version"):
            _spec(value, sub) if isinstance(value, str) else _bad(sub, "a version range string")
        elif key in ("toolchain_found", "rocblas_hipblaslt"):
            if not isinstance(value, bool):
                _bad(sub, "true or false")
        elif key == "source_contains":
            for item in _as_list(value):
                if not (isinstance(item, Mapping) and {"file", "text"} <= set(item)
                        <= {"file", "text", "means"}
                        and all(isinstance(v, str) for v in item.values())):
                    _bad(sub, "a table {file = ..., text = ...} (and optionally means = ...)")
        elif key == "header_contains":
            for item in _as_list(value):
                if not (isinstance(item, Mapping) and set(item) == {"header", "text"}):
                    _bad(sub, "a table {header = ..., text = ...}")
        else:
            if not all(isinstance(v, str) for v in _as_list(value)):
                _bad(sub, "a string or a list of strings")


_QUOTE_MAX = 60  # a longer or multi-line text is code a person should not have to read


def _looked_for(item: Mapping, f) -> str:
    """What a source_contains item looks for, as a plan's reason says it: its `means`, a short
    one-line text in backquotes, else only that the recipe names code there."""
    if item.get("means"):
        return str(item["means"])
    text = _text(item["text"], f)
    if "\n" not in text.strip() and len(text) <= _QUOTE_MAX:
        return f"`{text.strip()}`"
    return "the code the recipe names"


def _bad(where: str, what: str):
    raise ConfigError(f"{where}: must be {what}")


def evaluate(cond: Mapping | None, facts: Facts) -> bool:
    """True when every key of `cond` holds for `facts` (an absent condition holds)."""
    return explain(cond, facts)[0]


def explain(cond: Mapping | None, facts: Facts) -> tuple[bool, str]:
    """(holds, reason): the reason names the first key that failed, or all that held.  What
    only the unread source could tell does not hold here (`judge` says it is unknown)."""
    holds, why = judge(cond, facts)
    return bool(holds), why


def judge(cond: Mapping | None, facts: Facts) -> tuple[bool | None, str]:
    """(True | False | None, reason): None when the answer depends on the source, which is not
    read yet; the reason is then the condition still to decide ("the source declares GGML_HIP")."""
    if not cond:
        return True, "always"
    held: list[str] = []
    open_: list[str] = []
    for key, value in cond.items():
        ok, why = _test(key, value, facts)
        if ok is False:
            return False, why
        (held if ok else open_).append(why)
    if open_:
        return None, " and ".join(open_)
    return True, "; ".join(held)


@dataclass(frozen=True, kw_only=True)
class AfterFetch:
    """A rule only the unread source decides, as a dry run lists it: its kind (`rule`: option,
    env, stop, backend, ...), what it names, the condition the fetch settles (`when`), and what
    describes it (the value it would set, its reason, stage, message, hint, evidence)."""

    rule: str
    name: str
    when: str
    value: str | None = None
    reason: str | None = None
    stage: str | None = None
    message: str | None = None
    hint: str | None = None
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict:
        described = {"value": self.value, "reason": self.reason, "stage": self.stage,
                     "message": self.message, "hint": self.hint}
        return {"rule": self.rule, "name": self.name, "when": self.when,
                **{k: v for k, v in described.items() if v is not None},
                **({"evidence": list(self.evidence)} if self.evidence else {})}


@dataclass(frozen=True)
class Verdict:
    """Whether a recipe rule applies, and why; a rule only the unread source decides does not
    apply in the plan, and `after_fetch` says what the fetch will decide."""

    holds: bool
    why: str
    after_fetch: AfterFetch | None = None


def judge_rule(rule, facts: Facts, kind: str, name: str, *, evidence=None, **described) -> Verdict:
    """`judge` of a rule's `when`, as a verdict; `described` (value, reason, stage, hint) and the
    rule's evidence describe the rule in its after-the-fetch entry."""
    holds, why = judge(rule.when, facts)
    if holds is None:
        return Verdict(False, why, AfterFetch(rule=kind, name=name, when=why, evidence=tuple(evidence or ()),
                                              **described))
    return Verdict(holds, why)


def _text(text: str, f: Facts) -> str:
    """`{target}` / `{TARGET}` in a condition's text: the requested target (as is / capitals)."""
    if f.target is None:
        return text
    return text.replace("{target}", f.target).replace("{TARGET}", f.target.upper())


_COMBINATORS = ("not", "any", "all")
_PLAN_KEYS = ("target", "family", "backend", "toolchain_found", "rocblas_hipblaslt", "rocm")
_SOURCE_KEYS = ("source_version", "cmake_option", "file", "source_contains")


def _test(key: str, value, f: Facts) -> tuple[bool | None, str]:
    """One condition key against the facts, by where its facts come from: combinators, facts
    every plan has, facts of the fetched source, facts of the host."""
    if key in _COMBINATORS:
        return _test_combinator(key, value, f)
    if key in _PLAN_KEYS:
        return _test_plan(key, value, f)
    if key in _SOURCE_KEYS:
        return _test_source(key, value, f)
    return _test_host(key, _as_list(value), f)


def _test_combinator(key: str, value, f: Facts) -> tuple[bool | None, str]:
    """not / any / all: the reason is the one of the condition that decided (or, unknown, the
    conditions still open)."""
    if key == "not":
        ok, why = judge(value, f)
        return (None if ok is None else not ok), f"not ({why})"
    if key == "any":
        reasons, open_ = [], []
        for c in value:
            ok, why = judge(c, f)
            if ok:
                return True, why
            (reasons if ok is False else open_).append(why)
        if open_:
            return None, " or ".join(open_)
        return False, " and ".join(reasons)
    open_ = []
    for c in value:
        ok, why = judge(c, f)
        if ok is False:
            return False, why
        if ok is None:
            open_.append(why)
    return (None, " and ".join(open_)) if open_ else (True, "all held")


def _test_plan(key: str, value, f: Facts) -> tuple[bool, str]:
    """Keys every plan can answer before fetching: target, family, backend, toolchain, ROCm."""
    items = _as_list(value)
    if key == "target":
        ok = f.target is not None and any(fnmatch.fnmatchcase(f.target, p) for p in items)
        return ok, f"target {f.target} {'is' if ok else 'is not'} {' / '.join(items)}"
    if key == "family":
        ok = any(fam in f.families for fam in items)
        return ok, f"target {f.target} {'is' if ok else 'is not'} in family {' / '.join(items)}"
    if key == "backend":
        ok = f.backend in items
        return ok, f"backend {f.backend} {'is' if ok else 'is not'} {' / '.join(items)}"
    if key == "toolchain_found":
        ok = f.toolchain_found == value
        return ok, f"toolchain {'found' if f.toolchain_found else 'missing'}"
    if key == "rocblas_hipblaslt":
        links, why = f.rocblas_hipblaslt
        if links is None:
            return False, f"whether rocBLAS links hipBLASLt is unknown ({why})"
        return links == value, why
    v = _version(f.rocm_version)
    if v is None:
        return False, f"ROCm version unknown (wanted {value})"
    ok = v in _spec(value, "rocm")
    return ok, f"ROCm {v} {'matches' if ok else 'does not match'} {value}"


def _test_source(key: str, value, f: Facts) -> tuple[bool | None, str]:
    """Keys read from the fetched source tree: unknown (None, with the condition) until it is
    read; `source_version` is known before for the recipe's pinned source."""
    items = _as_list(value)
    if key == "source_version":
        return _test_version(value, f)
    if f.source is None:
        if key == "cmake_option":
            return None, f"the source declares {' / '.join(items)}"
        if key == "file":
            return None, f"the source has {' / '.join(items)}"
        return None, " or ".join(f"{i['file']} has {_looked_for(i, f)}" for i in items)
    if key == "cmake_option":
        opts = f.source.cmake_options
        hit = [o for o in items if o in opts]
        if hit:
            return True, f"source declares {hit[0]} ({opts[hit[0]]})"
        return False, f"source does not declare {' / '.join(items)}"
    if key == "file":
        hit = [p for p in items if f.source.has_file(p)]
        return (bool(hit), f"source has {hit[0]}" if hit else f"source has no {' / '.join(items)}")
    for it in items:
        if f.source.contains(it["file"], _text(it["text"], f)):
            return True, f"{it['file']} has {_looked_for(it, f)}"
    return False, "source does not have " + " / ".join(
        f"{_looked_for(i, f)} in {i['file']}" for i in items)


def _test_version(value: str, f: Facts) -> tuple[bool | None, str]:
    """The source's version (an unknown version of a read source never matches)."""
    if f.source is None and f.pinned_version is None:
        return None, f"the source's version matches {value}"
    known = f.source.version if f.source is not None else f.pinned_version
    v = _version(known)
    if v is None:
        return False, f"source version unknown (wanted {value})"
    ok = _spec(value, "source_version").contains(v, prereleases=True)
    pinned = " (the recipe's pinned source)" if f.source is None else ""
    return ok, f"source version {v}{pinned} {'matches' if ok else 'does not match'} {value}"


def _test_host(key: str, items: list, f: Facts) -> tuple[bool, str]:
    """Keys read from the host: installed headers, tools, ROCm files, pkg-config modules,
    glslc extensions; false (with why) when host facts are unknown."""
    if f.host is None:
        return False, f"host facts unknown ({key})"
    if key == "header_contains":
        for it in items:
            r = f.host.header_contains(it["header"], _text(it["text"], f))
            if r:
                return True, f"<{it['header']}> has {_text(it['text'], f)}"
        return False, "installed headers lack " + " / ".join(
            f"{_text(i['text'], f)} (<{i['header']}>)" for i in items)
    if key == "tool":
        hit = [t for t in items if f.host.tool(t)]
        return (bool(hit), f"{hit[0]} found" if hit else f"{' / '.join(items)} not found")
    if key == "rocm_file":
        if f.host.rocm_root is None:
            return False, f"no ROCm to look in ({' / '.join(_text(i, f) for i in items)} unknown)"
        for pattern in items:
            if any(f.host.rocm_root.glob(_text(pattern, f))):
                return True, f"the ROCm has {_text(pattern, f)}"
        return False, f"the ROCm at {f.host.rocm_root} has no {' / '.join(_text(i, f) for i in items)}"
    if key == "pkgconfig":
        if f.host.tool("pkg-config") is None:
            return False, f"pkg-config not found (wanted {' / '.join(items)})"
        hit = [m for m in items if f.host.pkgconfig(m)]
        return (bool(hit), f"pkg-config finds {hit[0]}" if hit
                else f"pkg-config does not find {' / '.join(items)}")
    if key == "cpu_flag":
        if f.host.cpu_flags is None:
            return False, f"the CPU's flags are unknown ({' / '.join(items)})"
        hit = [x for x in items if x in f.host.cpu_flags]
        return (bool(hit), f"the CPU has {hit[0]}" if hit else f"the CPU lacks {' / '.join(items)}")
    if key == "glslc_extension":
        for ext in items:
            if f.host.glslc_extension(ext):
                return True, f"glslc supports {ext}"
        return False, f"glslc cannot compile {' / '.join(items)}"
    raise ConfigError(f"unknown condition key {key!r}")  # pragma: no cover - validate() rejects
