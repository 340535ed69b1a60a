"""Where rocforge keeps things: config, cache, data (nightly installs, build prefixes).

platformdirs decides the per-user locations; ROCFORGE_CONFIG_DIR, ROCFORGE_CACHE_DIR and
ROCFORGE_DATA_DIR override them (tests, CI, shared machines).  On Linux the plain case - an
absolute $XDG_*_HOME, or none and an absolute HOME - is worked out here as platformdirs does
(`_xdg_dir`), without importing it: its import (tempfile, shutil, random, bz2, lzma) would be
paid by every uncached `rocforge env` at shell start-up (docs/measurements/env.md).  That path also asks for its directories as strings (the
`_str` functions): pathlib is imported only where a `Path` is handed out.
"""

from __future__ import annotations

import errno
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

APP = "rocforge"
# errors that say "this place cannot be written": permission (EPERM too: immutable files,
# unprivileged users) and a read-only file system
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


# platformdirs' Unix user directories: the variable that moves each, and its default under HOME
_XDG = {"config": ("XDG_CONFIG_HOME", "~/.config"), "cache": ("XDG_CACHE_HOME", "~/.cache"),
        "data": ("XDG_DATA_HOME", "~/.local/share")}


def _dir_str(env: str, kind: str) -> str:
    override = os.environ.get(env)
    if override:
        return path_str(override)
    found = _xdg_dir(kind)
    if found is None:
        import platformdirs  # imported late: only where its answer is not the plain XDG one

        found = getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False)
    return path_str(found)


def path_str(text: str) -> str:
    """`str(Path(text))` without pathlib: `.` and repeated slashes dropped, `..` kept."""
    pieces = [p for p in text.split("/") if p not in ("", ".")]
    lead = "//" if text.startswith("//") and not text.startswith("///") else "/" * text.startswith("/")
    return lead + "/".join(pieces) or "."


def _xdg_dir(kind: str) -> str | None:
    """`platformdirs.user_<kind>_dir("rocforge", appauthor=False)` on Linux where every
    platformdirs release (3.x and 4.x) answers alike: an absolute $XDG_<KIND>_HOME, or none set
    and an absolute (or unset) HOME.  None for anything else (not Linux, Android, a relative or
    blank variable, a relative HOME): platformdirs decides those."""
    environ = os.environ
    if (sys.platform != "linux" or hasattr(sys, "getandroidapilevel")
            or "ANDROID_DATA" in environ or "ANDROID_ROOT" in environ):
        return None
    var, default = _XDG[kind]
    value = environ.get(var, "")
    if value:
        return os.path.join(value, APP) if value.startswith("/") else None
    home = environ.get("HOME")
    if home is not None and not home.startswith("/"):
        return None
    base = os.path.expanduser(default)  # HOME, or the password database when HOME is unset
    return os.path.join(base, APP) if base.startswith("/") else None


def _path(text: str) -> Path:
    from pathlib import Path

    return Path(text)


def config_dir() -> Path:
    return _path(_dir_str("ROCFORGE_CONFIG_DIR", "config"))


def cache_dir() -> Path:
    return _path(_dir_str("ROCFORGE_CACHE_DIR", "cache"))


def data_dir() -> Path:
    return _path(data_dir_str())


def data_dir_str() -> str:
    return _dir_str("ROCFORGE_DATA_DIR", "data")


def config_file() -> Path:
    return _path(config_file_str())


def config_file_str() -> str:
    return path_str(os.path.join(_dir_str("ROCFORGE_CONFIG_DIR", "config"), "config.toml"))


def nightly_prefix() -> Path:
    """Default prefix for TheRock nightlies: `<prefix>/<version-dir>`, `<prefix>/current`."""
    return _path(nightly_prefix_str())


def nightly_prefix_str() -> str:
    return path_str(os.path.join(data_dir_str(), "rocm"))


def builds_prefix() -> Path:
    """Default parent of build install prefixes: `<builds>/<recipe>-<target>-<backend>`."""
    return _path(builds_prefix_str())


def builds_prefix_str() -> str:
    return path_str(os.path.join(data_dir_str(), "builds"))


def results_db() -> Path:
    """The results database of bench and tune (`ROCFORGE_RESULTS_DB` moves it): a location like
    the others, so cache care can protect it without importing the measure layer."""
    override = os.environ.get("ROCFORGE_RESULTS_DB")
    return _path(override) if override else data_dir() / "results.sqlite3"


def _where() -> tuple[tuple[str, str, Path], ...]:
    """(kind, variable that moves it, directory) for each of rocforge's own directories."""
    return (("cache", "ROCFORGE_CACHE_DIR", cache_dir()), ("data", "ROCFORGE_DATA_DIR", data_dir()),
            ("config", "ROCFORGE_CONFIG_DIR", config_dir()))


def unwritable(exc: OSError):
    """The one-line error for a write refused in (or on the way to) rocforge's cache, data or
    config directory — a read-only or foreign HOME — naming the directory and the variable
    that moves it; None for any other error (a bug stays a bug).  Every command writes through
    these directories, so the CLI maps the failure here, once, whichever step met it first."""
    if exc.errno not in _UNWRITABLE:
        return None
    from pathlib import Path

    names = [Path(os.fsdecode(n)).absolute() for n in (exc.filename, exc.filename2)
             if isinstance(n, (str, bytes, os.PathLike))]
    dirs = _where()
    # inside a directory first (most specific), then an ancestor being created (~/.cache)
    hits = ([(kind, var, d) for kind, var, d in dirs for n in names if n == d or d in n.parents]
            or [(kind, var, d) for kind, var, d in dirs for n in names
                if n in d.parents and n != Path(n.anchor)])
    if not hits:
        return None
    from rocforge_build.errors import ConfigError

    kind, var, d = hits[0]
    return ConfigError(
        f"the {kind} directory {d} cannot be written ({exc.strerror}: {names[0]}); "
        f"set {var} to a writable directory",
        f"e.g. export {var}=/var/tmp/rocforge-{kind} (HOME, XDG_{kind.upper()}_HOME and "
        f"{var} decide where it is)")


def write_refusal(directory: Path) -> OSError | None:
    """The error creating or writing a file in `directory` would meet (its nearest existing
    ancestor is asked, nothing is created), or None.  `access()` answers EROFS for root too."""
    from pathlib import Path

    probe = Path(directory).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if os.access(probe, os.W_OK | os.X_OK):
        return None
    code = errno.EROFS if os.statvfs(probe).f_flag & os.ST_RDONLY else errno.EACCES
    return OSError(code, os.strerror(code), str(probe))


def check_writable(directory: Path, flag: str) -> None:
    """Refuse, before any work starts, a directory this process could not create or write in:
    a build must not compile for an hour and then fail to install."""
    exc = write_refusal(directory)
    if exc is None:
        return
    from rocforge_build.errors import UsageError

    raise unwritable(exc) or UsageError(
        f"{flag} {directory}: {exc.filename} cannot be written ({exc.strerror})",
        "choose a directory you can write")


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole: into a per-process temporary sibling, then renamed over
    `path`, so a reader (or a concurrent writer) sees the old file or the new one, never half.
    The temporary file is removed when the write fails."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
