"""Locate the project's data folders (recipes, patches, container templates).

In a source checkout they sit at the top of the repository; an installed wheel carries them
inside the package as `_data/<name>` (pyproject's force-include).
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_folder(name: str) -> Path:
    packaged = _PKG / "_data" / name
    if packaged.is_dir():
        return packaged
    return _PKG.parent / name


def recipes_dir() -> Path:
    return data_folder("recipes")


def patches_dir() -> Path:
    return data_folder("patches")


def containers_dir() -> Path:
    return data_folder("containers")
