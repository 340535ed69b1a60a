"""Recipe variants for the measuring tests: the packaged llama-cpp recipe with extra CMake options
(a build with different flags) or an extra patch (a deliberately wrong build)."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WRONG_PATCH = Path(__file__).resolve().parent / "data" / "patches" / "llama-cpp-wrong" / "wrong-rms-norm.patch"


def recipe_variant(dest: Path, *, options: dict[str, bool | str] | None = None, patch: Path | None = None) -> Path:
    """dest/recipes/llama-cpp.toml (+ dest/patches/llama-cpp/): the packaged recipe plus `options`
    and `patch`; returns the recipe file."""
    (dest / "recipes").mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "patches" / "llama-cpp", dest / "patches" / "llama-cpp", dirs_exist_ok=True)
    text = (REPO / "recipes" / "llama-cpp.toml").read_text()
    for name, value in (options or {}).items():
        v = ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'
        text += f'\n[[option]]\nname = "{name}"\nvalue = {v}\nreason = "measure test: a build with different flags"\n'
    if patch is not None:
        shutil.copy(patch, dest / "patches" / "llama-cpp" / patch.name)
        text += (f'\n[[patch]]\nfile = "{patch.name}"\nwhen = {{ file = "ggml/src/ggml-cpu/ops.cpp" }}\n'
                 'reason = "measure test: a kernel made wrong on purpose; verify must fail it"\n')
    out = dest / "recipes" / "llama-cpp.toml"
    out.write_text(text)
    return out
