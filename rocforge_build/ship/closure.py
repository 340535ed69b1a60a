"""The shared-library closure of a build prefix, staged for a slim runtime image.

Never a hand-kept list: every ELF file of the host's architecture in the prefix goes through
`ldd` (the dynamic loader's own answer, honouring RUNPATH, `$ORIGIN`, LD_LIBRARY_PATH and
ld.so.cache; it lists the whole transitive closure).  What the loader cannot see (dlopen()ed
libraries, kernel data beside a library, Vulkan ICD plugins) comes from rules in
`containers/closure.toml`, each with its reason; the libraries those add go through `ldd` in
turn, until nothing new appears.

`stage()` copies the closure into a directory *preserving paths*: a path such as
`/lib/x86_64-linux-gnu/libc.so.6` whose `/lib` is a link to `usr/lib` is staged as the link plus
the real file, so `COPY closure/ /` recreates exactly the builder's view, in a `scratch` image too.

It inspects the live system (ldd runs the loader), so it is what a builder stage calls:
`rocforge container closure PREFIX --out DIR`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import struct
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rocforge_build import ownership, proc, replace, rootfs, shellsafe
from rocforge_build.errors import BuildError, ConfigError, ToolchainError, reason
from rocforge_build.resources import containers_dir, load_toml

_ELF_MAGIC = b"\x7fELF"
_ET_EXEC, _ET_DYN = 2, 3
# e_machine of the host, so AMDGPU code objects (ELF too, e_machine 224) are never fed to ldd.
_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "riscv64": 243}
_LDD_BATCH = 64
_MAX_LINK_HOPS = 40
# written at the top of a staged closure: what makes `--out` a tree rocforge may replace
MARKER = ".rocforge-closure"

_LDD_ARROW = re.compile(r"^\s*(\S+)\s+=>\s+(.*?)\s*(?:\(0x[0-9a-f]+\))?\s*$")
_LDD_PLAIN = re.compile(r"^\s*(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


@dataclass(frozen=True)
class Rule:
    name: str
    library: str
    why: str
    siblings: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()
    library_key: str | None = None


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...] = ()
    dirs: tuple[tuple[str, int], ...] = ()


@dataclass
class Entry:
    """One path of the closure and why it is there."""

    path: str
    reason: str
    kind: str  # "library" | "companion" | "data" | "manifest"


@dataclass
class Closure:
    roots: list[str]
    elf_files: list[str]
    entries: dict[str, Entry] = field(default_factory=dict)
    dirs: tuple[tuple[str, int], ...] = ()

    @property
    def libraries(self) -> list[str]:
        return sorted(p for p, e in self.entries.items() if e.kind in ("library", "companion"))

    def to_json(self) -> dict:
        return {
            "roots": self.roots,
            "elf_files": len(self.elf_files),
            "entries": [
                {"path": e.path, "kind": e.kind, "reason": e.reason}
                for e in sorted(self.entries.values(), key=lambda e: e.path)
            ],
            "dirs": [{"path": p, "mode": oct(m)} for p, m in self.dirs],
        }


# -- rules ------------------------------------------------------------------------------------
_RULE_KEYS = {"name", "library", "why", "siblings", "data", "manifests", "library_key"}


def load_rules(path: Path | None = None) -> Rules:
    path = path or containers_dir() / "closure.toml"
    data = load_toml(path, "closure rules")
    rules = []
    for i, raw in enumerate(data.get("rule", [])):
        unknown = set(raw) - _RULE_KEYS
        if unknown or "library" not in raw or "why" not in raw:
            raise ConfigError(
                f"{path}: rule {i + 1} ({raw.get('name', '?')}): "
                + (f"unknown keys {sorted(unknown)}" if unknown else "needs `library` and `why`"),
                f"allowed keys: {', '.join(sorted(_RULE_KEYS))}",
            )
        if raw.get("manifests") and not raw.get("library_key"):
            raise ConfigError(f"{path}: rule {raw.get('name')}: `manifests` needs `library_key`")
        rules.append(Rule(
            name=raw.get("name", f"rule-{i + 1}"), library=raw["library"], why=raw["why"],
            siblings=tuple(raw.get("siblings", ())), data=tuple(raw.get("data", ())),
            manifests=tuple(raw.get("manifests", ())), library_key=raw.get("library_key"),
        ))
    dirs = tuple((d["path"], int(d.get("mode", 0o755))) for d in data.get("dir", []))
    return Rules(tuple(rules), dirs)


# -- ELF ------------------------------------------------------------------------------------------
def host_machine() -> int | None:
    return _MACHINES.get(os.uname().machine)


def elf_type(path: Path, machine: int | None = None) -> int | None:
    """ET_EXEC / ET_DYN for an ELF file of the host architecture, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != _ELF_MAGIC:
        return None
    endian = "<" if head[5] == 1 else ">"
    e_type, e_machine = struct.unpack(endian + "HH", head[16:20])
    if e_type not in (_ET_EXEC, _ET_DYN):
        return None
    if (machine if machine is not None else host_machine()) not in (None, e_machine):
        return None
    return e_type


def scan_elf(root: Path) -> list[Path]:
    """Regular ELF files (executables, shared libraries) of the host architecture below root."""
    if root.is_file():
        return [root] if elf_type(root) else []
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if not p.is_symlink() and p.is_file() and elf_type(p):
                found.append(p)
    return found


def parse_ldd(output: str, files: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """ldd output (one or many files) -> {file: (resolved paths, missing sonames)}."""
    result: dict[str, tuple[list[str], list[str]]] = {}
    current = files[0] if len(files) == 1 else None
    for line in output.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1]
            continue
        if current is None:
            continue
        found, missing = result.setdefault(current, ([], []))
        m = _LDD_ARROW.match(line)
        if m:
            name, where = m.group(1), m.group(2)
            if where == "not found":
                missing.append(name)
            elif where.startswith("/"):
                found.append(where)
            continue
        m = _LDD_PLAIN.match(line)
        if m:
            found.append(m.group(1))  # the program interpreter, e.g. /lib64/ld-linux-x86-64.so.2
    return result


def ldd(files: list[Path], env: Mapping[str, str | None] | None = None) -> dict[str, tuple[list[str], list[str]]]:
    out: dict[str, tuple[list[str], list[str]]] = {}
    hint = "install libc-bin (it provides ldd) in the builder"
    for i in range(0, len(files), _LDD_BATCH):
        batch = [str(f) for f in files[i:i + _LDD_BATCH]]
        res = proc.run(["ldd", *batch], env=env, check=False, hint=hint)  # a probe: proc.PROBE
        out.update(parse_ldd(res.stdout or "", batch))
    return out


# -- closure ----------------------------------------------------------------------------------------
def _inside(path: str, roots: Iterable[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _json_key(obj, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def compute(
    roots: list[Path], *, env: Mapping[str, str | None] | None = None, rules: Rules | None = None,
    manifest_root: Path = Path("/"),
) -> Closure:
    """The closure of every ELF file below `roots` (the roots themselves are not part of it).

    `manifest_root` is where the absolute manifest globs of the rules are looked up (tests)."""
    rules = rules if rules is not None else load_rules()
    roots = [Path(os.path.abspath(r)) for r in roots]
    for r in roots:
        if not r.exists():
            raise BuildError(f"{r} does not exist", "give the install prefix `rocforge build` reported")
    root_strs = [str(r) for r in roots]
    elf = [p for r in roots for p in scan_elf(r)]
    closure = Closure(roots=root_strs, elf_files=[str(p) for p in elf], dirs=rules.dirs)
    missing: dict[str, set[str]] = {}
    queue = list(elf)
    done: set[str] = set()
    fired: set[tuple[str, str]] = set()

    def add(path: str, reason: str, kind: str) -> bool:
        if _inside(path, root_strs) or path in closure.entries:
            return False
        closure.entries[path] = Entry(path, reason, kind)
        return True

    while queue:
        batch = [p for p in dict.fromkeys(str(q) for q in queue) if p not in done]
        queue = []
        if not batch:
            break
        done.update(batch)
        for file, (found, lost) in ldd([Path(b) for b in batch], env).items():
            for soname in lost:
                missing.setdefault(soname, set()).add(file)
            for lib in found:  # ldd lists the whole transitive closure: no need to ldd these again
                add(lib, f"needed by {file}", "library")
        # rules over every library known so far (closure members and the prefix's own)
        candidates = list(closure.entries) + [str(p) for p in elf]
        for lib in candidates:
            base = os.path.basename(lib)
            for rule in rules.rules:
                if (rule.name, lib) in fired or not fnmatch.fnmatch(base, rule.library):
                    continue
                fired.add((rule.name, lib))
                libdir = os.path.dirname(lib)
                why = f"{rule.why} (rule {rule.name}, for {base})"
                for pattern in rule.siblings:
                    for sib in sorted(Path(libdir).glob(pattern)):
                        if add(str(sib), why, "companion") and elf_type(sib):
                            queue.append(sib)
                for rel in rule.data:  # a glob: Debian's rocBLAS keeps rocblas/<version>/library
                    for d in sorted(Path(libdir).glob(rel)):
                        if d.is_dir():
                            add(str(d), why, "data")
                for pattern in rule.manifests:
                    for man in sorted(manifest_root.glob(pattern.lstrip("/"))):
                        add(str(man), why, "manifest")
                        try:
                            target = _json_key(json.loads(man.read_text(encoding="utf-8")), rule.library_key or "")
                        except (OSError, ValueError):
                            target = None
                        if isinstance(target, str) and target.startswith("/") and Path(target).exists():
                            if add(target, f"{why}; named by {man}", "companion"):
                                queue.append(Path(target))
    if missing:
        lines = "; ".join(f"{so} (needed by {', '.join(sorted(by)[:3])})" for so, by in sorted(missing.items()))
        raise BuildError(
            f"the library closure is incomplete: ldd cannot find {lines}",
            "install the package providing it in the builder, or set LD_LIBRARY_PATH/RUNPATH so the "
            "loader finds it (pass the build's environment with --env-file)",
        )
    return closure


# -- staging ----------------------------------------------------------------------------------------
def _stage_path(path: str, out: Path, *, tree: bool = False) -> int:
    """Stage `path` under `out`, recreating every link on the way; returns bytes copied."""
    parts = list(PurePosixPath(path).parts[1:])
    cur = PurePosixPath("/")
    hops = 0
    while parts:
        part = parts.pop(0)
        cur = cur / part
        src = Path(cur)
        dest = out / str(cur).lstrip("/")
        if src.is_symlink():
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise BuildError(f"too many levels of symbolic links staging {path}")
            link = os.readlink(src)
            if dest.is_symlink():
                if os.readlink(dest) != link:
                    raise BuildError(f"staging conflict at {cur}: two different links")
            elif dest.exists():
                raise BuildError(f"staging conflict at {cur}: a link in the builder, a directory in the closure")
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(link, dest)
            target = link if link.startswith("/") else os.path.normpath(str(cur.parent / link))
            parts = list(PurePosixPath(target).parts[1:]) + parts
            cur = PurePosixPath("/")
            continue
        if parts:
            continue  # a real directory on the way
        if src.is_dir():
            if not tree:
                dest.mkdir(parents=True, exist_ok=True)
                return 0
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
            return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file() and not f.is_symlink())
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(src, dest)
        return dest.stat().st_size
    return 0


def stage(closure: Closure, out: Path) -> dict:
    """Copy the closure into `out` (replaced atomically: a failed run leaves no half tree; only
    an empty directory or an earlier closure is replaced, see `replace.check_replaceable`)."""
    out = Path(out)
    replace.check_replaceable(out, MARKER, "--out")
    tmp = out.with_name(out.name + ".rocforge-partial")  # marked while staged, MARKER at the end
    ownership.remove_owned(tmp, "an earlier run's partial closure", marks=(ownership.MARK, MARKER))
    tmp.mkdir(parents=True)
    ownership.write_mark(tmp, "a library closure being staged")
    total = 0
    try:
        for entry in sorted(closure.entries.values(), key=lambda e: e.path):
            total += _stage_path(entry.path, tmp, tree=entry.kind == "data")
        for path, mode in closure.dirs:
            d = tmp / path.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, mode)
        files = sum(1 for f in tmp.rglob("*") if not f.is_dir() or f.is_symlink()) - 1  # the mark
        (tmp / MARKER).write_text(f"staged by `rocforge container closure`: {files} files of the "
                                  "library closure of " + " ".join(closure.roots) + "\n",
                                  encoding="utf-8")
        (tmp / ownership.MARK).unlink()  # MARKER marks it from here on
    except BaseException:
        ownership.discard(tmp, "a partial closure", marks=(ownership.MARK, MARKER))
        raise
    replace.swap(tmp, out, MARKER)
    return {"files": files, "bytes": total}


# -- dotenv ------------------------------------------------------------------------------------------
def parse_dotenv(text: str) -> dict[str, str]:
    """`rocforge env --shell dotenv`: Docker/Podman `--env-file` semantics.

    `KEY=value` with the value literal (no quotes, no expansion, everything after the first `=`);
    lines starting with `#` are comments (that is how dotenv lists variables to unset).  Lines
    end at LF alone, as Docker's reader splits them (`str.splitlines` would also split at U+2028
    and make a second variable out of one value)."""
    env: dict[str, str] = {}
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"dotenv line {n} is not KEY=value: {raw!r}",
                              "the file must come from `rocforge env --shell dotenv`")
        problem = shellsafe.env_value_problem(value)
        if problem:  # never written by `rocforge env`, which refuses it; no image gets it either
            raise ConfigError(f"dotenv line {n}: {key}: {problem}", shellsafe.BREAK_HINT)
        env[key] = value
    return env


REPORT_BY = "rocforge container closure"  # the report's first key says who wrote it


def report_made_by_rocforge(head: bytes) -> bool:
    """Whether a file's first bytes are a closure report rocforge wrote: its `written_by` key, or
    (reports written before that key) json.dumps's layout of `Closure.to_json` with its keys."""
    text = head.decode("utf-8", errors="replace")
    if text.startswith('{\n  "written_by": ' + json.dumps(REPORT_BY)):
        return True
    return text.startswith('{\n  "roots": [') and '\n  "elf_files": ' in text


def _read_env_file(env_file: Path) -> dict[str, str]:
    """The dotenv file --env-file names, read only when it is a regular file (a FIFO is never
    waited on)."""
    try:
        with rootfs.open_regular(env_file) as fh:
            text = fh.read().decode("utf-8")
    except rootfs.NotRegularFile as exc:
        raise ConfigError(f"--env-file {env_file} is {exc.kind}, not a regular file",
                          "give the file `rocforge env --shell dotenv` wrote") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {env_file}: {reason(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--env-file {env_file} is not UTF-8 text (byte {exc.start})",
                          "give the file `rocforge env --shell dotenv` wrote") from exc
    return parse_dotenv(text)


def main_closure(prefix: Path, out: Path, *, env_file: Path | None, report: Path | None) -> dict:
    """What `rocforge container closure` does: compute, stage, write the report (only over a
    report rocforge wrote: `replace.write_own_file`)."""
    if proc.which("ldd") is None:
        raise ToolchainError("ldd was not found", "install libc-bin in the builder")
    replace.check_replaceable(out, MARKER, "--out")  # before any work (stage() checks again)
    if report is not None:
        replace.check_own_file(report, "--report", report_made_by_rocforge)
    env = _read_env_file(env_file) if env_file is not None else None
    closure = compute([prefix], env=env)
    summary = stage(closure, out)
    result = {**closure.to_json(), **summary, "out": str(out)}
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        replace.write_own_file(report, json.dumps({"written_by": REPORT_BY, **result}, indent=2)
                               + "\n", "--report", report_made_by_rocforge)
    return result


if __name__ == "__main__":  # pragma: no cover - `python -m rocforge_build.ship.closure PREFIX OUT`
    print(json.dumps(main_closure(Path(sys.argv[1]), Path(sys.argv[2]), env_file=None, report=None), indent=2))
