"""Why a path the user gave cannot be opened, in words: the one helper every place that opens a
user's path asks (a recipe, `--source`, `verify --text`, a bundle, the results database), so a
symbolic link loop is never "no such file", a FIFO never "unknown format" and never waited on.
stat(2) follows links and never blocks on a FIFO; its errno says which (path_resolution(7))."""

from __future__ import annotations

import errno
import os
import stat

from rocforge_build.errors import UsageError
from rocforge_build.rootfs import file_kind

_KINDS = {"file": "a regular file", "directory": "a directory"}


def why_not(path: str | os.PathLike[str], want: tuple[str, ...] = ("file",), *,
            missing_ok: bool = False, instead: str = "") -> str | None:
    """None when `path` is one of `want` ("file", "directory"), or absent with `missing_ok`; else
    what it is instead, as the end of a sentence that starts with the path (`instead`: what it
    is not, e.g. "a bundle archive", where that says more than "a regular file")."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ENOENT and missing_ok:
            return None
        return _errno_words(exc, path)
    except ValueError:  # a NUL byte: no system call takes the name
        return "holds a NUL byte, which no file name can"
    if (stat.S_ISREG(mode) and "file" in want) or (stat.S_ISDIR(mode) and "directory" in want):
        return None
    return f"is {file_kind(mode)}, not {instead or ' or '.join(_KINDS[w] for w in want)}"


def _errno_words(exc: OSError, path: str | os.PathLike[str]) -> str:
    if exc.errno == errno.ENOENT:
        return ("is a symbolic link to nothing (its target does not exist)"
                if os.path.islink(path) else "does not exist (no such file or directory)")
    return {errno.ELOOP: "is a symbolic link loop (too many levels of symbolic links)",
            errno.ENAMETOOLONG: "is a name too long for the file system (ENAMETOOLONG)",
            errno.ENOTDIR: "does not exist (a part of its path is not a directory)",
            errno.EACCES: "cannot be read (permission denied)",
            }.get(exc.errno, f"cannot be read ({exc.strerror})")


def require(path: str | os.PathLike[str], what: str, want: tuple[str, ...] = ("file",), *,
            hint: str | None = None, missing_ok: bool = False, instead: str = "") -> None:
    """Raise UsageError (exit 2: a path no command can use) "WHAT PATH WHY" unless why_not is
    None."""
    why = why_not(path, want, missing_ok=missing_ok, instead=instead)
    if why is not None:
        shown = os.fsdecode(path)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise UsageError(f"{what} {shown} {why}".lstrip(), hint)


# A configuration file, recipe or preset is a few kB; 4 MiB is far past any that is meant, and
# reading a file of gigabytes given in its place would hold it all in memory first.
TEXT_MAX = 4 << 20


def read_text(path: str | os.PathLike[str], what: str, limit: int = TEXT_MAX) -> str:
    """A small UTF-8 text file given by the user, read only if it is a regular file of at most
    `limit` bytes (UsageError otherwise; UnicodeDecodeError and OSError as open() raises them)."""
    from rocforge_build.rootfs import open_regular

    require(path, what)
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} {os.fsdecode(path)} is larger than {limit >> 20} MiB: not a "
                         f"{what} rocforge reads (it stopped reading there)")
    return data.decode("utf-8")
