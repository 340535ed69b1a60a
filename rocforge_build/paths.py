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
