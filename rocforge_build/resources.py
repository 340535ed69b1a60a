"""Locate the project's data folders (recipes, patches, container templates).

In a source checkout they sit at the top of the repository; an installed wheel carries them
inside the package as `_data/<name>` (pyproject's force-include).
"""

from __future__ import annotations

from pathlib import Path

from rocforge_build.errors import ConfigError, reason

PACKAGE_DIR = Path(__file__).resolve().parent  # rocforge_build/


def data_folder(name: str) -> Path:
    packaged = PACKAGE_DIR / "_data" / name
    if packaged.is_dir():
        return packaged
    return PACKAGE_DIR.parent / name


def package_data(name: str) -> Path:
    """A file of the package's own data folder, `rocforge_build/data/` (targets, layouts...)."""
    return PACKAGE_DIR / "data" / name


def recipes_dir() -> Path:
    return data_folder("recipes")


def patches_dir() -> Path:
    return data_folder("patches")


def containers_dir() -> Path:
    return data_folder("containers")


def load_toml(path: Path, what: str) -> dict:
    """Read one of rocforge's own data files (target table, layouts, templates' data...).
    A broken or missing one is a damaged installation, reported as a ConfigError.

    The plain TOML those files are written in is read by `toml_subset` (no tomllib import on
    `rocforge env`'s path); anything else in them, and every error, is tomllib's."""
    from rocforge_build import toml_subset

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _damaged(path, what, exc) from exc
    try:
        return toml_subset.loads(text)
    except toml_subset.Unsupported:
        pass
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _damaged(path, what, exc) from exc


def _damaged(path: Path, what: str, exc: Exception) -> ConfigError:
    return ConfigError(f"{what} {path} is unreadable: {reason(exc)}",
                       "restore the file from the rocforge sources (reinstall rocforge)")
