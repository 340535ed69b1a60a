"""Safe tarball extraction into a directory rocforge owns (a staging dir inside the prefix).

Every member is checked before anything is written, and refused (IntegrityError, nothing kept)
when it is: an absolute path, a path with `..`, a symbolic link whose target is absolute or
leaves the destination, a hard link to anything but an earlier regular member, a device, a FIFO
or another special file.  While writing, the member's directory and a link's target are
resolved through links already on disk and must stay inside (catching chains of individually
harmless links), and once every member is in place each link in the tree must still resolve
inside it (a later link can make an earlier one escape); the stdlib `data` filter is a further
guard where Python has it (3.11.4+).  Nothing of the archive's owners or modes is applied:
files become 0644 or 0755 (executable), directories 0755, on every Python.  The compressed
stream is read to its end, so a gzip CRC32/length mismatch or trailing bytes are refused, and
free space is checked against the members' declared sizes as they come (a zero bomb stops
before the disk is full).  Layering (extracting a second archive over the first) replaces
files and links rather than writing through them.  `staging(parent)` makes a temporary
directory (0755) that is removed on any failure, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import lzma
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import ownership
from rocforge_build.errors import DiskFullError, IntegrityError, reason
from rocforge_build.progress import human_size
from rocforge_build.rootfs import open_regular


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


def member_parts(raw: str) -> list[str]:
    """A member name's path components ([] for the root itself); ValueError(why) for an absolute
    path or one with `..` (shared with the bundle reader, which words its own refusal)."""
    if raw.startswith("/") or raw.startswith("\\") or (len(raw) > 1 and raw[1] == ":"):
        raise ValueError("absolute path")
    parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("path with '..'")
    return parts


def _clean_name(archive: Path, raw: str) -> str | None:
    """Member name relative to the destination ("" for the root itself), or refuse it."""
    try:
        return "/".join(member_parts(raw))
    except ValueError as exc:
        raise _refuse(archive, raw, str(exc)) from exc


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
                 on_member: Callable[[tarfile.TarInfo], None] | None = None,
                 free_space: Callable[[Path], tuple[int, int]] | None = None) -> ExtractStats:
    """Extract `archive` into the existing directory `dest` (layering over what is there).

    Raises IntegrityError for a hostile, truncated or corrupt archive (a gzip CRC/length that
    does not match, bytes after the compressed stream, a link that ends up outside) and
    DiskFullError when the disk fills or the members' declared sizes would not fit; the caller
    discards `dest` (see `staging`).  `free_space(path) -> (available, total)` is the space probe
    (statvfs of the filesystem holding `dest` unless given)."""
    archive = Path(archive)
    dest = Path(dest)
    probe = free_space or filesystem_space
    regular: set[str] = set()
    dirs: list[tuple[Path, int]] = []
    count = files = nbytes = 0
    budget: int | None = None  # bytes that may still be written before the next statvfs
    try:
        with _open_archive(archive) as (tar, drain):
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
                    dirs.append((target, m.mtime))
                    continue
                # through links already on disk, the member's directory and a link's target
                # must stay inside (a chain of harmless-looking links cannot walk out)
                _inside(archive, dest, target.parent, name)
                if m.issym():
                    _inside(archive, dest, Path(os.path.realpath(target.parent), m.linkname), name)
                if m.isreg() and m.size:
                    if budget is None or m.size > budget:
                        budget = _room_for(archive, dest, name, m.size, probe)
                    budget -= m.size
                try:
                    # no attributes from the archive: owners are never applied, modes and
                    # times are set below by rocforge (the stdlib filter is missing or older
                    # on Debian's 3.11.2 and would apply setuid bits and foreign uids there)
                    tar.extract(m, dest, set_attrs=False, **_DATA_FILTER)
                except _FILTER_ERRORS as exc:
                    raise _refuse(archive, name, str(exc)) from exc
                if not m.issym():
                    _set_attrs(target, file_mode(m.mode), m.mtime)
                if m.isreg():
                    files += 1
                    nbytes += m.size
            drain()
        for path in check_links(archive, dest):
            _set_attrs(path, DIR_MODE, None)
        for path, mtime in reversed(dirs):  # archive times last: chmod above does not move them
            _set_attrs(path, DIR_MODE, mtime)
    except (tarfile.ReadError, EOFError, tarfile.CompressionError, tarfile.StreamError,
            zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise IntegrityError(
            f"{archive.name} is truncated or corrupt ({_reason(exc)}); nothing was installed",
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


# Modes rocforge gives what it unpacks: never setuid/setgid/sticky, never group/other-writable,
# owner read/write always; directories 0755 so a shared prefix or a container user can read.
DIR_MODE = 0o755


def file_mode(mode: int) -> int:
    return 0o755 if mode & 0o100 else 0o644


def _set_attrs(path: Path | str, mode: int, mtime: float | None) -> None:
    """chmod + utime on what is there, never through a link (Linux has no lchmod)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if mtime is not None:
        with contextlib.suppress(OSError, OverflowError, ValueError):
            os.utime(path, (mtime, mtime), follow_symlinks=False)


def filesystem_space(path: Path) -> tuple[int, int]:
    """(bytes available to this user, filesystem size) of the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


# what an extraction leaves free at least: 1% of the filesystem, at most 256 MiB
RESERVE_FRACTION = 0.01
RESERVE_MAX = 256 << 20


def _room_for(archive: Path, dest: Path, name: str, size: int, probe,
              elsewhere: str = "install elsewhere with --prefix") -> int:
    """Bytes that may be written from here (members' declared sizes count against it), or
    DiskFullError when `size` does not fit: a zero bomb stops before the disk is full."""
    avail, total = probe(dest)
    room = avail - min(int(total * RESERVE_FRACTION), RESERVE_MAX)
    if size > room:
        raise DiskFullError(
            f"{archive.name}: member {name} declares {human_size(size)} but only "
            f"{human_size(max(avail, 0))} is free where it unpacks (rocforge keeps "
            f"{human_size(avail - room)} spare); stopped before filling the disk, the partial "
            "tree was removed",
            f"free space on {dest.parent} (`df -h {dest.parent}`) or {elsewhere}; an archive "
            "that unpacks to far more than its size may be hostile",
        )
    return room


def check_links(archive: Path, dest: Path) -> list[str]:
    """Every symbolic link in the finished tree must resolve inside it.  Links are checked one
    by one while unpacking, but a link can escape only once a later member makes another link
    (`p -> q/q/../../../x` before `q -> .`), so the whole tree is checked at the end.
    Returns the tree's real directories (the walk does not follow links)."""
    root = os.path.realpath(dest)
    real_dirs = [str(dest)]
    for dirpath, dirnames, filenames in os.walk(dest):
        real_dirs += [os.path.join(dirpath, d) for d in dirnames
                      if not os.path.islink(os.path.join(dirpath, d))]
        for entry in (*dirnames, *filenames):
            path = os.path.join(dirpath, entry)
            if not os.path.islink(path):
                continue
            real = os.path.realpath(path)
            if real != root and not real.startswith(root + os.sep):
                rel = os.path.relpath(path, dest)
                raise _refuse(archive, rel, f"symbolic link {os.readlink(path)!r} resolves "
                              "outside the tree once all links are in place")
    return real_dirs


class _Trailing(Exception):
    pass


class _GzipStream(io.RawIOBase):
    """A gzip file decompressed to its very end: zlib checks every member's CRC32 and ISIZE
    trailer, and anything after the last member is an error (tarfile stops reading at the tar
    end marker, so without this the trailer is never looked at)."""

    IN, OUT = 1 << 16, 1 << 20

    def __init__(self, raw):
        self._raw = raw
        self._z = zlib.decompressobj(31)
        self._buf = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf and not self._done:
            self._fill()
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _fill(self) -> None:
        z = self._z
        if z.unconsumed_tail:
            self._buf = z.decompress(z.unconsumed_tail, self.OUT)
            return
        if z.eof:
            rest = z.unused_data
            while len(rest) < 2:
                more = self._raw.read(self.IN)
                if not more:
                    break
                rest += more
            if not rest:
                self._done = True
                return
            if rest[:2] != b"\x1f\x8b":
                raise zlib.error(f"data after the end of the gzip stream (bytes {rest[:8].hex(' ')} ...)")
            self._z = zlib.decompressobj(31)  # a further gzip member (RFC 1952 allows several)
            self._buf = self._z.decompress(rest, self.OUT)
            return
        data = self._raw.read(self.IN)
        if not data:
            raise EOFError("the compressed stream ends before its end")
        self._buf = z.decompress(data, self.OUT)


@contextlib.contextmanager
def _open_archive(archive: Path):
    """(tar opened for streaming, drain) where drain() reads the compressed stream to its end
    so that its integrity check (gzip CRC32/ISIZE, xz/bz2 checks) runs."""
    with open_regular(archive) as raw, open_tar_stream(raw) as opened:
        yield opened


@contextlib.contextmanager
def open_tar_stream(raw):
    """`_open_archive` on an open binary file (the bundle reader opens its archive itself)."""
    gz = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    if gz:
        stream = io.BufferedReader(_GzipStream(raw), 1 << 16)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            yield tar, lambda: _drain(stream)
    else:
        with tarfile.open(fileobj=raw, mode="r|*") as tar:
            yield tar, lambda: _drain(tar.fileobj)


def _drain(stream) -> None:
    while stream.read(1 << 16):
        pass


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "incorrect data check" in text:
        return "gzip CRC32 does not match the data"
    if "incorrect length check" in text:
        return "gzip length does not match the data"
    return reason(exc) if text else "the archive's data is damaged (no details given)"


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
def staging(parent: Path, prefix: str = ".staging-", what: str | None = None) -> Iterator[Path]:
    """A fresh directory inside `parent`, removed unless the caller moved it away; with `what`
    it carries rocforge's mark (`ownership.MARK`), so a killed run's leftover is rocforge's.

    Removal happens on every exception, KeyboardInterrupt included, by `ownership.scratch_dir`:
    only while it is still the directory made here, never across a mount."""
    with ownership.scratch_dir(parent, prefix, what) as path:
        os.chmod(path, DIR_MODE)  # mkdtemp makes 0700; the tree becomes an install others read
        yield path


def write_own_file(path: Path, text: str) -> None:
    """Write a file of rocforge's own into an unpacked tree: whatever the archive put at that
    name is removed first and the new file is made with O_EXCL|O_NOFOLLOW, so the write never
    follows a link out of the tree.  A directory the archive put there is refused, not removed."""
    if os.path.lexists(path):
        if path.is_dir() and not path.is_symlink():
            raise IntegrityError(f"the archive holds a directory {path.name}, where rocforge "
                                 "writes a file of its own; refusing to unpack it",
                                 "the archive was not made for this; get it from its publisher")
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.fchmod(fd, 0o644)  # whatever the umask: others read the tree
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def remove_tree(path: Path, what: str, marks: tuple[str, ...] = (ownership.MARK,)) -> None:
    """Remove an unpacked tree that holds one of `marks` (ownership.remove_owned: read-only
    directories too, never across a mount or through a link); one without is left, with a
    warning.  It gets `ownership.MARK` first and loses its other marks first, so what a kill
    leaves is still recognisably rocforge's and never taken for a whole tree."""
    if ownership.owner(path, marks) == Path(os.path.abspath(path)):
        with contextlib.suppress(OSError):
            ownership.write_mark(path, what)
    ownership.warn_left(ownership.remove_owned(
        path, what, marks=marks, first=tuple(m for m in marks if m != ownership.MARK),
        refuse=False))
