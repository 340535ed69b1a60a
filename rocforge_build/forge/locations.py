"""Where a build's trees live, derived from its prefix alone: the work area, the staging and
DESTDIR siblings that the swap renames, the copy of the source, the private venv, and the
default prefix in the builds directory; and what rocforge keeps in its cache directory, whose root
it claims as its own only while everything there carries its mark.  Every module that must find
them asks here."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from rocforge_build import ownership, paths
from rocforge_build.manifest_schema import MANIFEST

__all__ = ["CACHE_LAYOUT", "CACHE_TOP", "MANIFEST", "claim_cache_root", "default_prefix", "destdir", "own_builds_dir", "project_dir", "staging_dir",
           "is_plain_dir", "venv_dir", "work_dir"]


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


# (category, directory under the cache dir, whether its entries are the directory's children)
CACHE_LAYOUT = (
    ("sources", "sources/git", True),
    ("sources", "sources/trees", True),
    ("sources", "sources/refs.json", False),
    ("sources", "downloads", True),
    ("work", "work", True),
    ("bisect", "bisect", True),
    ("containers", "containers", True),
    ("verify", "verify/refs", True),
    ("verify", "verify", True),  # the model texts (text-*.txt); refs/ is listed above
    ("llama-help", "llama-help", True),
    ("env", "env", True),
)
CACHE_TOP = {"sources", "downloads", "work", "bisect", "containers", "verify", "llama-help", "env"}


def is_plain_dir(p: Path) -> bool:
    """A directory itself, never a link to one (lstat): a link in the cache is never followed."""
    return stat.S_ISDIR(os.lstat(p).st_mode)


def claim_cache_root() -> None:
    """Tag the cache root as rocforge's (CACHEDIR.TAG with rocforge's line) when rocforge makes
    it, or when everything in it carries rocforge's mark: called where rocforge first writes into
    the cache.  A root holding anything unmarked (an earlier rocforge's, or someone's) stays
    untagged, so a tag never vouches for what rocforge did not make."""
    base = paths.cache_dir()
    if _only_marked(base):
        ownership.tag_cache_root(base, CACHE_TOP)


def _only_marked(base: Path) -> bool:
    try:
        if ownership.foreign_names(base, CACHE_TOP):
            return False
        for _category, rel, children in CACHE_LAYOUT:
            where = base / rel
            if not os.path.lexists(where):
                continue
            if not children or not is_plain_dir(where):
                return False
            for name in os.listdir(where):
                if name == ownership.MARK or (rel == "verify" and name == "refs") \
                        or (rel == "work" and name.endswith(".lock")):
                    continue
                if not ownership.is_marked(where / name):
                    return False
    except OSError:
        return False
    return True
