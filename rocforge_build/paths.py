"""Where rocforge keeps things: config, cache, data (nightly installs, build prefixes).

platformdirs decides the per-user locations; ROCFORGE_CONFIG_DIR, ROCFORGE_CACHE_DIR and
ROCFORGE_DATA_DIR override them (tests, CI, shared machines).
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "rocforge"


def _dir(env: str, kind: str) -> Path:
    override = os.environ.get(env)
    if override:
        return Path(override)
    import platformdirs  # imported late: cheap, but only needed when no override is set

    return Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))


def config_dir() -> Path:
    return _dir("ROCFORGE_CONFIG_DIR", "config")


def cache_dir() -> Path:
    return _dir("ROCFORGE_CACHE_DIR", "cache")


def data_dir() -> Path:
    return _dir("ROCFORGE_DATA_DIR", "data")


def config_file() -> Path:
    return config_dir() / "config.toml"


def nightly_prefix() -> Path:
    """Default prefix for TheRock nightlies: `<prefix>/<version-dir>`, `<prefix>/current`."""
    return data_dir() / "rocm"


def builds_prefix() -> Path:
    """Default parent of build install prefixes: `<builds>/<recipe>-<target>-<backend>`."""
    return data_dir() / "builds"


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
