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

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
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


def inner_join(base: str, *parts: str) -> str:
    """Inner path `base` with `parts` appended: PurePosixPath's `/` on strings (`.` and empty
    pieces dropped, `..` kept), for discovery, which keeps inner paths as strings.  Unlike `/`, a
    part that starts with `/` does not replace `base`: it is joined below it like any other."""
    pieces = [p for part in parts for p in part.split("/") if p not in ("", ".")]
    return base.rstrip("/") + "/" + "/".join(pieces) if pieces else base


def inner_path(path: str | os.PathLike[str]) -> str:
    """`str(PurePosixPath("/", path))`: the path made absolute, `.` and empty pieces dropped."""
    return inner_join("/", os.fspath(path))


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
    """Inner paths go in as strings or path objects.  `resolve`, `host`, `inner` and `glob`
    answer with pathlib objects; their `_str` twins answer with strings, for discovery, which
    `rocforge env` runs without importing pathlib (its imports, `urllib.parse` and `ipaddress`
    among them, would be paid at every shell start-up: docs/measurements/env.md)."""

    def __init__(self, base: str | os.PathLike[str] = "/"):
        self.base_str = os.path.abspath(base)
        self._prefix = self.base_str.rstrip("/")

    @property
    def base(self) -> Path:
        from pathlib import Path

        return Path(self.base_str)

    @property
    def is_host(self) -> bool:
        return self.base_str == "/"

    def __repr__(self) -> str:
        return f"Root({self.base_str!r})"

    # -- mapping ------------------------------------------------------------------------------
    def resolve(self, inner: str | os.PathLike[str]) -> PurePosixPath:
        """Canonical inner path: `..` and symlinks resolved without leaving the root."""
        from pathlib import PurePosixPath

        return PurePosixPath(self.resolve_str(inner))

    def resolve_str(self, inner: str | os.PathLike[str]) -> str:
        """resolve() as a string."""
        return "/" + "/".join(self._walk(inner))

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
        from pathlib import Path

        return Path(self.host_str(inner))

    def host_str(self, inner: str | os.PathLike[str]) -> str:
        """host() as a string."""
        rel = "/".join(self._walk(inner))
        return self._prefix + "/" + rel if rel else self.base_str

    def inner(self, host_path: str | os.PathLike[str]) -> PurePosixPath:
        """Inner path of a real path below the root (inverse of `host`)."""
        from pathlib import PurePosixPath

        return PurePosixPath(self.inner_str(host_path))

    def inner_str(self, host_path: str | os.PathLike[str]) -> str:
        """inner() as a string."""
        rel = os.path.relpath(os.path.abspath(host_path), self.base_str)
        if rel == ".":
            return "/"
        if rel.startswith(".."):
            raise ValueError(f"{host_path} is outside root {self.base_str}")
        return "/" + rel

    # -- small helpers over inner paths ------------------------------------------------------
    def exists(self, inner: str | os.PathLike[str]) -> bool:
        """Path.exists() of the real path (its errors too)."""
        return _mode(self.host_str(inner)) is not None

    def is_dir(self, inner: str | os.PathLike[str]) -> bool:
        mode = _mode(self.host_str(inner))
        return mode is not None and stat.S_ISDIR(mode)

    def is_file(self, inner: str | os.PathLike[str]) -> bool:
        mode = _mode(self.host_str(inner))
        return mode is not None and stat.S_ISREG(mode)

    def is_symlink(self, inner: str | os.PathLike[str]) -> bool:
        """True when the last component of `inner` is itself a link (parents resolved)."""
        parent, _, name = inner_path(inner).rpartition("/")
        if not name:  # the root itself
            return _is_link(self.base_str)
        return _is_link(os.path.join(self.host_str(parent or "/"), name))

    def read_text(self, inner: str | os.PathLike[str]) -> str:
        with open_regular(self.host_str(inner), "r", encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def listdir(self, inner: str | os.PathLike[str]) -> list[str]:
        """Sorted names in an inner directory; empty when it is missing or unreadable."""
        try:
            return sorted(os.listdir(self.host_str(inner)))
        except OSError:
            return []

    def glob(self, inner_dir: str | os.PathLike[str], pattern: str) -> list[PurePosixPath]:
        """Inner paths matching `pattern` below `inner_dir`, sorted."""
        from pathlib import PurePosixPath

        return [PurePosixPath(p) for p in self.glob_str(inner_dir, pattern)]

    def glob_str(self, inner_dir: str | os.PathLike[str], pattern: str) -> list[str]:
        """glob() as strings: what `Path.glob(pattern)` of the real directory finds (`*`, `?`,
        `[...]` within one component, hidden names included, case-sensitive; no `**`), as
        inner paths below `inner_dir`, sorted.  A pattern that is absolute or climbs out
        (`..`) matches nothing."""
        base = "/" + os.fspath(inner_dir).strip("/")
        parts = [p for p in pattern.split("/") if p not in ("", ".")]
        if not parts or pattern.startswith("/") or ".." in parts or "**" in parts:
            return []
        found = [(base.rstrip("/"), self.host_str(base))]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            found = [hit for inner, host in found for hit in _step(inner, host, part, last)]
        return sorted((inner for inner, _ in found), key=lambda p: p.split("/"))  # PurePath's order


def _step(inner: str, host: str, part: str, last: bool) -> list[tuple[str, str]]:
    """One component of a glob, as pathlib's selectors take it: the children of `host` that
    `part` matches, as (inner, host) pairs.  A literal name must exist (be a directory where
    more components follow); a wildcard matches every listed name (a broken link too), and only
    directories where more components follow."""
    join = (lambda name: host + "/" + name) if host != "/" else (lambda name: "/" + name)
    if not any(c in part for c in "*?["):
        try:
            mode = _mode(join(part))
        except PermissionError:  # pathlib's glob: a directory it may not search matches nothing
            return []
        ok = mode is not None and (last or stat.S_ISDIR(mode))
        return [(inner + "/" + part, join(part))] if ok else []
    try:
        listed = os.listdir(host)
    except OSError:
        return []
    import fnmatch  # only for a wildcard; case-sensitive on POSIX, as pathlib's glob

    out = []
    for name in fnmatch.filter(listed, part):
        child = join(name)
        if last or _is_dir(child):
            out.append((inner + "/" + name, child))
    return out


def _is_dir(path: str) -> bool:
    """os.DirEntry.is_dir(), which pathlib's glob asks: any error is "no"."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
