"""A filesystem root to inspect: `/` normally, any directory with `--root DIR`.

Every path rocforge reasons about is an *inner* path (as seen from inside the root, e.g.
`/opt/rocm`); `Root.host()` maps it to the real file.  Symbolic links are followed inside the
root, so an absolute link such as `/opt/rocm -> /opt/rocm-6.4.1` in a container filesystem or a
test fixture resolves to the fixture's own `/opt/rocm-6.4.1`, never the host's.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

_MAX_LINKS = 40
# what Path.is_symlink() reads as "not a link" rather than raising (pathlib's _IGNORED_ERRNOS)
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def _mode(path: str, stat_fn=os.stat) -> int | None:
    """stat_fn(path).st_mode, None where pathlib reads "not there" (Path.exists(),
    Path.is_symlink() with os.lstat); the other errors (EACCES...) raised as pathlib raises them."""
    try:
        return stat_fn(path).st_mode
    except OSError as exc:
        if exc.errno not in _NOT_THERE:
            raise
        return None
    except ValueError:  # unencodable
        return None


def _is_link(path: str) -> bool:
    """Path(path).is_symlink()."""
    mode = _mode(path, os.lstat)
    return mode is not None and stat.S_ISLNK(mode)


class NotRegularFile(OSError):
    """`open_regular` met something that is not a regular file (its kind in `kind`)."""

    def __init__(self, path, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", os.fspath(path))
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.filename} is {self.strerror}"


def file_kind(mode: int) -> str:
    """What a non-regular st_mode is, in words."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "a special file"


def open_regular(path: str | os.PathLike[str], mode: str = "rb", *, follow: bool = True, **kw):
    """open() for reading, only if `path` is a regular file: O_NONBLOCK keeps a FIFO (or a device)
    from blocking the open — a FIFO put where sysfs, /proc, a ROCm install or a bundle has a file
    would hang a plain open() forever, and `rocforge env` runs at every shell start-up; with
    follow=False a symbolic link is refused (O_NOFOLLOW).  NotRegularFile (an OSError) otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFile(path, "a symbolic link") from exc
        if exc.errno == errno.ENXIO:  # a socket
            raise NotRegularFile(path, "a socket") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, file_kind(st.st_mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kw)
    except BaseException:
        os.close(fd)
        raise


class Root:
    def __init__(self, base: str | os.PathLike[str] = "/"):
        self.base = Path(os.path.abspath(base))
        self._prefix = str(self.base).rstrip("/")

    @property
    def is_host(self) -> bool:
        return str(self.base) == "/"

    def __repr__(self) -> str:
        return f"Root({str(self.base)!r})"

    # -- mapping ------------------------------------------------------------------------------
    def _join(self, inner: PurePosixPath) -> Path:
        rel = str(inner).lstrip("/")
        return self.base / rel if rel else self.base

    def resolve(self, inner: str | os.PathLike[str]) -> PurePosixPath:
        """Canonical inner path: `..` and symlinks resolved without leaving the root."""
        return PurePosixPath("/" + "/".join(self._walk(inner)))

    def _walk(self, inner: str | os.PathLike[str]) -> list[str]:
        """The components of `inner` resolved: `..` and symlinks, inside the root.  Works on
        strings (one lstat per component), not Path objects: discovery resolves a few hundred
        paths at every uncached `rocforge env`."""
        todo = ("/" + os.fspath(inner)).split("/")
        todo.reverse()  # a stack: the next component last
        prefix = self._prefix
        done: list[str] = []
        hops = 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            host = prefix + "/" + "/".join(done) + ("/" if done else "") + part
            if _is_link(host):
                hops += 1
                if hops > _MAX_LINKS:
                    return [*done, part]  # a loop: leave it unresolved, reads will fail cleanly
                target = os.readlink(host)
                if target.startswith("/"):
                    done = []
                todo.extend(reversed(target.split("/")))
                continue
            done.append(part)
        return done

    def host(self, inner: str | os.PathLike[str]) -> Path:
        """The real path of an inner path (links resolved inside the root)."""
        return Path(self._host_str(inner))

    def _host_str(self, inner: str | os.PathLike[str]) -> str:
        """host() as a string: the checks below need no Path object."""
        rel = "/".join(self._walk(inner))
        return self._prefix + "/" + rel if rel else str(self.base)

    def inner(self, host_path: str | os.PathLike[str]) -> PurePosixPath:
        """Inner path of a real path below the root (inverse of `host`)."""
        rel = os.path.relpath(os.path.abspath(host_path), self.base)
        if rel == ".":
            return PurePosixPath("/")
        if rel.startswith(".."):
            raise ValueError(f"{host_path} is outside root {self.base}")
        return PurePosixPath("/", rel)

    # -- small helpers over inner paths ------------------------------------------------------
    def exists(self, inner: str | os.PathLike[str]) -> bool:
        """Path.exists() of the real path (its errors too)."""
        return _mode(self._host_str(inner)) is not None

    def is_dir(self, inner: str | os.PathLike[str]) -> bool:
        mode = _mode(self._host_str(inner))
        return mode is not None and stat.S_ISDIR(mode)

    def is_file(self, inner: str | os.PathLike[str]) -> bool:
        mode = _mode(self._host_str(inner))
        return mode is not None and stat.S_ISREG(mode)

    def is_symlink(self, inner: str | os.PathLike[str]) -> bool:
        """True when the last component of `inner` is itself a link (parents resolved)."""
        p = PurePosixPath("/", os.fspath(inner))
        return self._join(self.resolve(p.parent) / p.name).is_symlink()

    def read_text(self, inner: str | os.PathLike[str]) -> str:
        with open_regular(self.host(inner), "r", encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def listdir(self, inner: str | os.PathLike[str]) -> list[str]:
        """Sorted names in an inner directory; empty when it is missing or unreadable."""
        try:
            return sorted(os.listdir(self._host_str(inner)))
        except OSError:
            return []

    def glob(self, inner_dir: str | os.PathLike[str], pattern: str) -> list[PurePosixPath]:
        """Inner paths matching `pattern` below `inner_dir`, sorted."""
        base = PurePosixPath("/", os.fspath(inner_dir))
        host = self.host(base)
        return sorted(base / p.relative_to(host).as_posix() for p in host.glob(pattern))
