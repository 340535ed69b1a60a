"""Where a build's trees live, derived from its prefix alone: the work area, the staging and
DESTDIR siblings that the swap renames, the copy of the source, the private venv, and the
default prefix in the builds directory.  Every module that must find them asks here."""

from __future__ import annotations

import hashlib
from pathlib import Path

from rocforge_build import paths
from rocforge_build.manifest_schema import MANIFEST

__all__ = ["MANIFEST", "default_prefix", "destdir", "own_builds_dir", "project_dir", "staging_dir",
           "venv_dir", "work_dir"]


STAGED = "a build's staged install"  # what the scratch trees beside a prefix hold


def work_dir(prefix: Path) -> Path:
    """The work area of the build that installs into `prefix`: source copy, build dir, log."""
    return paths.cache_dir() / "work" / hashlib.sha256(str(prefix).encode()).hexdigest()[:12]


def staging_dir(prefix: Path) -> Path:
    """Where the install goes before it replaces `prefix` (a sibling: the swap is a rename)."""
    return Path(f"{prefix}.rocforge-new")


def destdir(prefix: Path) -> Path:
    """`DESTDIR` of recipes that install with `ninja install`; moved to the staging dir after."""
    return Path(f"{prefix}.rocforge-destdir")


def venv_dir(work: Path) -> Path:
    """The recipe's private virtual environment, in the build dir (`{venv}` in recipe values)."""
    return work / "build" / "venv"


def project_dir(work: Path, source) -> Path:
    """The CMake project in the work copy of `source` (forge/sources.py): its subdirectory where
    the whole fetched tree is copied (a sparse monorepo checkout), else the copy itself."""
    if source.copies_whole_tree and source.subdir:
        return work / "src" / source.subdir
    return work / "src"


def default_prefix(recipe: str, target: str, backend: str, toolchain: str = "hip") -> Path:
    """`<recipe>-<target>-<backend>` for a HIP build (it runs on its one GPU target);
    `<recipe>-<backend>` for a host (CPU) or Vulkan build, which runs on any GPU or none — but the
    `<recipe>-<target>-<backend>` such a build had before, where it is and the new name is not, so
    that it is rebuilt in place, never beside itself."""
    base = paths.builds_prefix()
    named = base / f"{recipe}-{target}-{backend}"
    if toolchain == "hip":
        return named
    unnamed = base / f"{recipe}-{backend}"
    if target and not unnamed.exists() and (named / MANIFEST).is_file():
        return named
    return unnamed


def own_builds_dir(made_for: str) -> Path | None:
    """Where a rocforge command builds for itself (Request.made_for): tune's candidates below the
    builds directory (no `rocforge build` default is one word), bisect's steps in the cache; None
    for an owner whose prefixes are named elsewhere (verify's references: measure/verify_reference)."""
    return {"tune": paths.builds_prefix() / "tune", "bisect": paths.cache_dir() / "bisect"}.get(made_for)
