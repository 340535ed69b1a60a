"""The error family: every failure a user can meet, with an exit code and a fix-it hint.

Only the CLI catches these and prints them; library code raises and never exits.
"""

from __future__ import annotations


class RocforgeError(Exception):
    """Base class: `message` says what is wrong, `hint` what to do next."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        # every failure's words are redacted once, where it is raised: a URL's password, a token a
        # server repeated, never reach a terminal, a record or a log through an error
        from rocforge_build.credentials import redact

        message = redact(message) if isinstance(message, str) else message
        hint = redact(hint) if isinstance(hint, str) else hint
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(RocforgeError):
    """Bad command-line input: unknown target, malformed option value."""

    exit_code = 2


class ConfigError(RocforgeError):
    """A configuration or data file (recipe, config.toml, target table) is invalid."""

    exit_code = 2


class DetectionError(RocforgeError):
    """The system (or --root) could not be read: unreadable sysfs, garbage properties."""

    exit_code = 3


class NoRocmError(RocforgeError):
    """No usable ROCm installation was found or the given one is not a ROCm tree."""

    exit_code = 4


class ToolchainError(RocforgeError):
    """A required tool (compiler, cmake, glslc, headers) is missing or too old."""

    exit_code = 5


class NetworkError(RocforgeError):
    """A download or listing failed after retries."""

    exit_code = 6


class IntegrityError(RocforgeError):
    """Checksum mismatch, truncated or hostile archive."""

    exit_code = 7


class PatchError(RocforgeError):
    """A patch did not apply; the source tree was left clean."""

    exit_code = 8


class BuildError(RocforgeError):
    """A configure/build/install step failed; the message names the log file."""

    exit_code = 9


class BuildTargetError(BuildError):
    """A --cmake-target the configured build does not make: the request is at fault (exit 2),
    and to `bisect` it is a commit that does not build, as ninja's own refusal was."""

    exit_code = 2


class DiskFullError(RocforgeError):
    """No space left (checked before, or hit while writing a download or an extraction)."""

    exit_code = 10


class StoreError(RocforgeError):
    """The results database cannot be used (locked, corrupt, unwritable)."""

    exit_code = 11


def disk_failure(exc: OSError, doing: str) -> RocforgeError:
    """An OS error met writing or renaming on this machine's disk as one line naming the path and
    the OS's reason: a full disk (ENOSPC, EDQUOT) a DiskFullError (exit 10), anything else (EIO,
    EXDEV, EACCES, ...) a UsageError (exit 2: the place given cannot be used), never a bug's
    exit 70."""
    import errno
    import os

    paths = [os.fsdecode(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = " -> ".join(paths) or "a path below it"
    text = exc.strerror or reason(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        directory = os.path.dirname(paths[-1]) if paths else "."
        return DiskFullError(f"no space left on the device while {doing} ({where}); nothing "
                             "half-written was kept", f"free space there (`df -h {directory}`) "
                             "and run the command again")
    return UsageError(f"cannot finish {doing}: {text}: {where}",
                      "check that file system (permissions, a mount point, `dmesg` for I/O "
                      "errors) and run the command again")


def reason(exc: BaseException, *, name_file: bool = False) -> str:
    """An exception in a person's words: an OSError's own text (its strerror; with name_file,
    where the message does not name the path already, "No such file or directory: /x"), never
    "[Errno 2] ..."; a KeyError's key without quotes; never a class name."""
    import re

    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if name_file and exc.filename else exc.strerror
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, RocforgeError):
        return exc.message
    text = " ".join(re.sub(r"\[Errno -?\d+\] ", "", str(exc)).split())
    return text or "no details given"
