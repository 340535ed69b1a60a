"""Ownership by mark: rocforge deletes, prunes or replaces only what carries the mark it wrote.

A location alone proves nothing (a cache dir set to HOME holds `work/` of the user's own), so
every directory rocforge makes for later removal gets a mark file when it is made (`MARK`), and a
cache root rocforge made gets a CACHEDIR.TAG (https://bford.info/cachedir/, which also keeps
backup tools out of it).  A root that is `/`, HOME or above HOME is refused for destructive
commands whatever it holds.  Removal never leaves the file system (and mount) it starts on and
never follows a link, so a tmpfs or bind mount inside the cache keeps its files.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from rocforge_build.errors import UsageError

MARK = ".rocforge-owned"
COMPLETE = ".rocforge-complete"  # forge/sources.py: a fetched tree is whole (removed first)
CACHEDIR_TAG = "CACHEDIR.TAG"
SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
TAG_TEXT = (f"{SIGNATURE}\n# This file is a cache directory tag created by rocforge.\n"
            "# For information about cache directory tags, see https://bford.info/cachedir/\n")
MAX_DEPTH = 400  # deeper than any tree rocforge makes; a deeper one is left, not recursed into
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text` unless something is already there; never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def write_mark(directory: Path, what: str) -> None:
    """Mark `directory` (made by rocforge just now) as rocforge's: `what` says what it is."""
    _write_new(Path(directory) / MARK, f"made by rocforge: {what}\n")


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_marked(directory: Path) -> bool:
    """Whether `directory` (not a link) holds rocforge's mark as a regular file."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return False
    except OSError:
        return False
    return _regular(Path(directory) / MARK)


def has_cache_tag(root: Path) -> bool:
    """Whether `root` holds a CACHEDIR.TAG that starts with the standard's signature."""
    tag = Path(root) / CACHEDIR_TAG
    if not _regular(tag):
        return False
    try:
        with open(tag, "rb") as fh:
            return fh.read(len(SIGNATURE)) == SIGNATURE.encode()
    except OSError:
        return False


def _homes() -> set[str]:
    out = {os.path.realpath(os.path.expanduser("~"))}
    try:
        out.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (KeyError, OSError):
        pass
    return out


def forbidden_root(root: Path) -> str | None:
    """Why `root` can never be a directory rocforge empties (`/`, HOME, above HOME), or None."""
    real = os.path.realpath(root)
    if real == "/":
        return "it is the root directory /"
    for home in _homes():
        if real == home:
            return "it is your home directory"
        if home.startswith(real.rstrip("/") + "/"):
            return f"it holds your home directory {home}"
    return None


def foreign_names(root: Path, own: Iterable[str]) -> list[str]:
    """The names directly in `root` that rocforge never makes there."""
    try:
        names = os.listdir(root)
    except OSError:  # absent, not a directory, unreadable: nothing in it is listed or removed
        return []
    allowed = set(own) | {CACHEDIR_TAG}
    return sorted(n for n in names if n not in allowed)


def root_problem(root: Path, own: Iterable[str]) -> str | None:
    """Why `root` may not be emptied: `/`, HOME or above HOME, or names in it that rocforge never
    makes there while no CACHEDIR.TAG says rocforge made it; None when it may."""
    why = forbidden_root(root)
    if why is None and not has_cache_tag(root):
        foreign = foreign_names(root, own)
        if foreign:
            shown = ", ".join(repr(n) for n in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            why = (f"it holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} rocforge "
                   f"did not make ({shown}) and no {CACHEDIR_TAG} of rocforge's")
    return why


def check_destructive_root(root: Path, own: Iterable[str], what: str) -> None:
    """Refuse (one line, exit 2) to empty `root` when `root_problem` names a reason."""
    why = root_problem(root, own)
    if why is not None:
        raise UsageError(f"{what} refuses {root}: {why}",
                         "point it at a directory of rocforge's own (ROCFORGE_CACHE_DIR, "
                         "`rocforge config`); nothing was removed")


def tag_cache_root(root: Path, own: Iterable[str]) -> None:
    """Write the CACHEDIR.TAG of a cache root rocforge makes now, or one that holds only what
    rocforge makes there (a cache of an earlier rocforge); never into HOME, `/` or a directory
    with files of someone else's.  Best effort: a root that cannot be written fails later, there."""
    root = Path(root)
    if forbidden_root(root) is not None or has_cache_tag(root):
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not foreign_names(root, own):
            _write_new(root / CACHEDIR_TAG, TAG_TEXT)
    except OSError:
        pass


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace (a bind mount of the same file system
    has the same st_dev, so st_dev alone does not see it)."""
    out = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split(" ")
                if len(fields) > 4:
                    out.add(_unescape(fields[4]))
    except OSError:
        pass
    return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def remove_tree_one_device(path: Path, *, first: Iterable[str] = (COMPLETE,)) -> list[str]:
    """Remove `path` without following a link or entering another file system or mount; the
    names in `first` go first (a completeness mark: an interrupted removal leaves a tree that is
    visibly incomplete) and `MARK` last (what is left stays recognisably rocforge's).  Returns
    the mount points left in place (with the directories above them); raises OSError otherwise."""
    path = Path(os.path.abspath(path))
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return []
    mounts = mount_points()
    if str(path) in mounts:
        return [str(path)]
    parent = os.open(path.parent, _OPEN_DIR)
    try:
        fd = _open_child(parent, path.name, st)
        if fd is None:
            return [str(path)]
        try:
            left = _clear(fd, str(path), st.st_dev, mounts, tuple(first), (MARK,), 0)
        finally:
            os.close(fd)
        if not left:
            _retry_writable(parent, lambda: os.rmdir(path.name, dir_fd=parent))
        return left
    finally:
        os.close(parent)


def _open_child(parent: int, name: str, seen: os.stat_result) -> int | None:
    """Open directory `name` under `parent`, or None when it is no longer the one `seen`."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)  # a 0000 dir of an archive; checked as a dir below
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        return None
    return fd


def _retry_writable(fd: int, action) -> None:
    """Run `action` (an unlink or rmdir in directory `fd`), making the directory writable once
    when it is read-only (archives carry 0555 directories)."""
    try:
        action()
    except PermissionError:
        os.fchmod(fd, 0o700)
        action()


def _clear(fd: int, where: str, dev: int, mounts: set[str], first: tuple, last: tuple,
           depth: int) -> list[str]:
    """Empty the directory open as `fd` (at `where`); returns the mount points left in it."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, "nested deeper than rocforge makes", where)
    names = os.listdir(fd)
    order = ([n for n in first if n in names] + [n for n in names if n not in first + last]
             + [n for n in last if n in names])
    left: list[str] = []
    for name in order:
        full = os.path.join(where, name)
        if name in last and left:
            break  # something stays: so does the mark that says it is rocforge's
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            _retry_writable(fd, lambda n=name: os.unlink(n, dir_fd=fd))
            continue
        if st.st_dev != dev or full in mounts:
            left.append(full)
            continue
        child = _open_child(fd, name, st)
        if child is None:
            left.append(full)
            continue
        try:
            below = _clear(child, full, dev, mounts, (), (), depth + 1)
        finally:
            os.close(child)
        left += below
        if not below:
            _retry_writable(fd, lambda n=name: os.rmdir(n, dir_fd=fd))
    return left
