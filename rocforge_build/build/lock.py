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


def acquire(prefix: Path, work: Path) -> Held:
    """Take the lock of `prefix`'s build, waiting (and saying so) while another build holds it."""
    path = work.with_name(work.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: the file is truncated and written below, never through a link put at its name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot open the build lock {path}: {exc.strerror}",
                         "rocforge makes that file itself; move whatever is there away") from exc
    held = Held(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 100, 0).decode("utf-8", "replace").strip() or "another process"
        sys.stderr.write(f"rocforge: waiting: {holder} is building {prefix}; builds of one "
                         "prefix share its work dir and staging, so this one starts when "
                         "that one ends\n")
        sys.stderr.flush()
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"rocforge build (pid {os.getpid()})\n".encode(), 0)
    return held
