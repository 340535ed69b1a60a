"""Locate the project's data folders (recipes, patches, container templates).

In a source checkout they sit at the top of the repository; an installed wheel carries them
inside the package as `_data/<name>` (pyproject's force-include).
"""

from __future__ import annotations

import os

from rocforge_build.errors import ConfigError, reason

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))  # rocforge_build/, as a string


def package_dir() -> Path:
    """The installed package's own directory (`rocforge_build/`), links resolved."""
    from pathlib import Path

    return Path(_PACKAGE_DIR)


def data_folder(name: str) -> Path:
    packaged = package_dir() / "_data" / name
    if packaged.is_dir():
        return packaged
    return package_dir().parent / name


def package_data(name: str) -> str:
    """A file of the package's own data folder, `rocforge_build/data/` (targets, layouts...),
    as a string: `rocforge env` reads three of them without importing pathlib."""
    return os.path.join(_PACKAGE_DIR, "data", name)


def recipes_dir() -> Path:
    return data_folder("recipes")


def patches_dir() -> Path:
    return data_folder("patches")


def containers_dir() -> Path:
    return data_folder("containers")


def load_toml(path: str | os.PathLike[str], what: str) -> dict:
    """Read one of rocforge's own data files (target table, layouts, templates' data...).
    A broken or missing one is a damaged installation, reported as a ConfigError.

    The plain TOML those files are written in is read by `toml_subset` (no tomllib import on
    `rocforge env`'s path); anything else in them, and every error, is tomllib's."""
    from rocforge_build import toml_subset

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise _damaged(path, what, exc) from exc
    try:
        return toml_subset.loads(text)
    except toml_subset.Unsupported:
        pass
    import tomllib

    try:
        return toml_subset.tomllib_parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise _damaged(path, what, exc) from exc


def _damaged(path: str | os.PathLike[str], what: str, exc: Exception) -> ConfigError:
    return ConfigError(f"{what} {path} is unreadable: {reason(exc)}",
                       "restore the file from the rocforge sources (reinstall rocforge)")
