"""One build of a prefix at a time.

Two builds of one prefix share its work dir (source copy, build dir, log) and its staging
sibling, so a second one *waits* for the first (it says so, once, on stderr) instead of failing:
when the first one built the same inputs, the second then finds the prefix up to date; when it
failed or built other inputs, the second builds.  The lock is an flock(2) on a file beside the
work dir (the kernel drops it when its holder dies, even by SIGKILL).
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from rocforge_build.errors import UsageError


class Held:
    """A held build lock; `release()` (idempotent) gives it back, as does the end of the process."""

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    __del__ = release


def lock_path(work: Path) -> Path:
    return work.with_name(work.name + ".lock")


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: the file is truncated and written below, never through a link put at its name
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot open the build lock {path}: {exc.strerror}",
                         "rocforge makes that file itself; move whatever is there away") from exc


def _still_there(fd: int, path: Path) -> bool:
    """Whether the locked file is still the one at `path`: `rocforge cache clean` removes a work
    dir's lock file while it holds it, and a build that opened the old file meanwhile must then
    lock the new one, or two builds would hold "the" lock at once."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def acquire(prefix: Path, work: Path) -> Held:
    """Take the lock of `prefix`'s build, waiting (and saying so) while another build holds it."""
    path = lock_path(work)
    said = False
    while True:
        held = Held(_open(path))
        fd = held.fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not said:
                holder = os.pread(fd, 100, 0).decode("utf-8", "replace").strip() or "another process"
                sys.stderr.write(f"rocforge: waiting: {holder} is building {prefix}; builds of one "
                                 "prefix share its work dir and staging, so this one starts when "
                                 "that one ends\n")
                sys.stderr.flush()
                said = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        if _still_there(fd, path):
            break
        held.release()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"rocforge build (pid {os.getpid()})\n".encode(), 0)
    return held


def try_acquire(work: Path, who: str) -> Held | None:
    """The lock of the build that uses `work`, taken without waiting; None while a build holds
    it (the work dir is in use).  `rocforge cache clean` holds it while it removes the dir."""
    path = lock_path(work)
    held = Held(_open(path))
    try:
        fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.release()
        return None
    if not _still_there(held.fd, path):
        held.release()
        return None
    os.ftruncate(held.fd, 0)
    os.pwrite(held.fd, f"{who} (pid {os.getpid()})\n".encode(), 0)
    return held


def holder(work: Path) -> str | None:
    """Who holds the lock of the build that uses `work` (its own words), or None when nobody
    does; creates nothing and never follows a link at the lock's name."""
    path = lock_path(work)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 100, 0).decode("utf-8", "replace").strip() or "another process"
        return None
    finally:
        os.close(fd)
