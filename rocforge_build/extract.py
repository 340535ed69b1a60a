"""Safe tarball extraction into a directory rocforge owns (a staging dir inside the prefix).

Every member is checked before anything is written, and refused (IntegrityError, nothing kept)
when it is: an absolute path, a path with `..`, a symbolic link whose target is absolute or
leaves the destination, a hard link to anything but an earlier regular member, a device, a FIFO
or another special file.  While writing, the member's directory and a link's target are
resolved through links already on disk and must stay inside (catching chains of individually
harmless links); the stdlib `data` filter is a further guard where Python has it (3.11.4+).
Layering (extracting a second archive over the first) replaces files and links rather than
writing through them.  `staging(parent)` makes a temporary directory that is removed on any
failure, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.errors import DiskFullError, IntegrityError


@dataclass(frozen=True)
class ExtractStats:
    members: int
    files: int
    bytes: int


# The stdlib `data` filter (Python 3.11.4+, PEP 706) is a second guard where it exists; Debian
# 12's python3 is 3.11.2, so the checks above and `_inside` must hold on their own.
_DATA_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
_FILTER_ERRORS = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()


def _refuse(archive: Path, name: str, why: str) -> IntegrityError:
    return IntegrityError(
        f"{archive.name}: refusing member {name!r}: {why}; nothing was installed",
        "the archive is corrupt or hostile: do not unpack it by hand; report the URL, or "
        "choose another version (`rocforge nightly list`)",
    )


def _clean_name(archive: Path, raw: str) -> str | None:
    """Member name relative to the destination ("" for the root itself), or refuse it."""
    if raw.startswith("/") or raw.startswith("\\") or (len(raw) > 1 and raw[1] == ":"):
        raise _refuse(archive, raw, "absolute path")
    parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(archive, raw, "path with '..'")
    return "/".join(parts)


def _check_link(archive: Path, name: str, target: str) -> None:
    if not target or target.startswith("/") or target.startswith("\\"):
        raise _refuse(archive, name, f"symbolic link to absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        raise _refuse(archive, name, f"symbolic link {target!r} points outside the tree")


def check_member(archive: Path, m: tarfile.TarInfo, regular: set[str]) -> str:
    """Validate one member; returns its clean relative name."""
    name = _clean_name(archive, m.name)
    if m.issym():
        _check_link(archive, name, m.linkname)
    elif m.islnk():
        target = _clean_name(archive, m.linkname)
        if target not in regular:
            raise _refuse(archive, m.name, f"hard link to {m.linkname!r}, not a file of this archive")
    elif m.ischr() or m.isblk():
        raise _refuse(archive, m.name, "device file")
    elif m.isfifo():
        raise _refuse(archive, m.name, "FIFO")
    elif not (m.isreg() or m.isdir()):
        raise _refuse(archive, m.name, "special file")
    if m.isreg():
        regular.add(name)
    return name


def safe_extract(archive: Path, dest: Path, *,
                 on_member: Callable[[tarfile.TarInfo], None] | None = None) -> ExtractStats:
    """Extract `archive` into the existing directory `dest` (layering over what is there).

    Raises IntegrityError for a hostile, truncated or corrupt archive and DiskFullError when the
    disk fills; the caller discards `dest` (see `staging`)."""
    archive = Path(archive)
    dest = Path(dest)
    regular: set[str] = set()
    dirs: list[tuple[Path, int]] = []
    count = files = nbytes = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar:
                name = check_member(archive, m, regular)
                count += 1
                if on_member:
                    on_member(m)
                if not name:
                    continue
                m.name = name
                if m.islnk():
                    m.linkname = _clean_name(archive, m.linkname)
                target = dest / name
                _make_room(target, m)
                if m.isdir():
                    # created now, modes set at the end (a 0555 dir must still take its files)
                    _inside(archive, dest, target, name)
                    target.mkdir(parents=True, exist_ok=True)
                    dirs.append((target, m.mode))
                    continue
                # through links already on disk, the member's directory and a link's target
                # must stay inside (a chain of harmless-looking links cannot walk out)
                _inside(archive, dest, target.parent, name)
                if m.issym():
                    _inside(archive, dest, Path(os.path.realpath(target.parent), m.linkname), name)
                try:
                    tar.extract(m, dest, set_attrs=True, **_DATA_FILTER)
                except _FILTER_ERRORS as exc:
                    raise _refuse(archive, name, str(exc)) from exc
                if m.isreg():
                    files += 1
                    nbytes += m.size
        for path, mode in reversed(dirs):
            os.chmod(path, (mode & 0o755) | 0o700)
    except (tarfile.ReadError, EOFError, tarfile.CompressionError, zlib.error) as exc:
        raise IntegrityError(
            f"{archive.name} is truncated or corrupt ({exc}); nothing was installed",
            "the download was damaged: run the install again (the file is fetched anew)",
        ) from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"no space left while unpacking {archive.name}; the partial tree was removed",
                f"free space on {dest.parent} (`df -h {dest.parent}`) or install elsewhere "
                "with --prefix",
            ) from exc
        raise
    return ExtractStats(count, files, nbytes)


def _make_room(path: Path, m: tarfile.TarInfo) -> None:
    """Layering: replace an existing file or link instead of writing through it."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    elif not m.isdir():
        raise IntegrityError(
            f"layering conflict: {m.name} is a file in this archive but a directory below it",
            "these archives cannot be layered; install them separately",
        )


def _inside(archive: Path, dest: Path, target: Path, name: str) -> None:
    """A directory member must not land outside through a link already on disk."""
    real = os.path.realpath(target)
    root = os.path.realpath(dest)
    if real != root and not real.startswith(root + os.sep):
        raise _refuse(archive, name, "directory reached through a link that leaves the tree")


@contextlib.contextmanager
def staging(parent: Path, prefix: str = ".staging-") -> Iterator[Path]:
    """A fresh directory inside `parent`, removed unless the caller moved it away.

    Removal happens on every exception, KeyboardInterrupt included."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        if path.exists():
            remove_tree(path)


def remove_tree(path: Path) -> None:
    """rmtree that also clears read-only directories (tarballs may carry 0555 dirs)."""
    def onerror(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755) if os.path.isdir(p) and not os.path.islink(p) else None
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)
