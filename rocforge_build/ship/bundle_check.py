"""`rocforge bundle check`: every file's sha256 and every link of a bundle (archive or unpacked
folder, through the same reading rules, `bundle_archive.py`) against its bundle.toml, and on
which GPUs of this machine it runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import rootfs
from rocforge_build.errors import (
    IntegrityError,
    UsageError,
)
from rocforge_build.ship.bundle_archive import (
    BUNDLE_TOML,
    MAX_TOML,
    Folder,
    Member,
    hash_regular,
    parse_bundle_toml,
    read_capped,
    refuse,
    scan_archive,
)


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

    top, info = scan_archive(path, record)
    return top, info, seen


def _entries_dir(path: Path) -> tuple[str, dict, dict[str, dict]]:
    """An unpacked bundle through the same folder rules as an archive; a FIFO, socket or device
    in it is refused from lstat, never opened (a FIFO's open would wait forever)."""
    where = str(path)
    toml_path = path / BUNDLE_TOML
    if not os.path.lexists(toml_path):
        raise IntegrityError(f"{path} has no {BUNDLE_TOML}: not an unpacked rocforge bundle")
    try:
        with rootfs.open_regular(toml_path, follow=False) as fh:
            info = parse_bundle_toml(read_capped(fh, MAX_TOML, str(toml_path)), str(toml_path))
    except rootfs.NotRegularFile as exc:
        raise refuse(where, BUNDLE_TOML, f"it is {exc.kind}, not a file") from exc
    # its name need not be [bundle] name (a plain folder name, by the schema): an unpacked bundle
    # runs from any directory, renamed or moved; `check` reports both when they differ
    name = os.path.basename(os.path.abspath(path))
    folder = Folder(where)
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
                    seen[rel] = {"sha256": hash_regular(full)}
            else:
                raise refuse(where, rel, f"it is {rootfs.file_kind(mode)}, not a file, directory or "
                              "link; rocforge makes no such bundle (not opened)")
    folder.finish()
    return name, info, seen


def verify(path: Path) -> tuple[str, dict, list[str]]:
    """Every file's sha256 (and every link) against bundle.toml: (name, bundle.toml, problems).
    An archive and an unpacked folder go through the same rules (`Folder`)."""
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
