"""Stand-ins for the stack's upstream repositories, as real local git repositories (file:// URLs
work offline): a rocm-libraries-shaped monorepo and an AOTriton-shaped repo with a submodule; and
the packaged stack recipes copied to point at them."""

from __future__ import annotations

import shutil
from pathlib import Path

from buildfixtures import git

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[1]
MONOREPO_URL = "https://github.com/ROCm/rocm-libraries.git"
AOTRITON_URL = "https://github.com/ROCm/aotriton.git"
STACK = ("rocwmma", "hipblaslt", "rocblas", "aotriton")


def _serve(repo: Path) -> None:
    """Let clients fetch as from GitHub: partial clones (--filter) and commits by sha."""
    git("config", "uploadpack.allowFilter", "true", cwd=repo)
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=repo)


def _commit_tree(src: Path, dest: Path, tag: str) -> Path:
    shutil.copytree(src, dest)
    git("init", "-q", "-b", "develop", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "fixture", cwd=dest)
    git("tag", tag, cwd=dest)
    _serve(dest)
    return dest


def monorepo(dest: Path) -> Path:
    return _commit_tree(DATA / "monorepo", dest, "rocm-7.1.0")


def aotriton_repo(dest: Path) -> Path:
    """AOTriton stand-in with third_party/triton as a submodule (another local repository)."""
    triton = _commit_tree(DATA / "aotriton-triton", dest.parent / f"{dest.name}-triton", "v3.4")
    shutil.copytree(DATA / "aotriton", dest)
    git("init", "-q", "-b", "main", cwd=dest)
    git("-c", "protocol.file.allow=always", "submodule", "add", "-q", triton.as_uri(),
        "third_party/triton", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "fixture", cwd=dest)
    git("tag", "0.13b", cwd=dest)
    _serve(dest)
    return dest


def allow_file_submodules(monkeypatch) -> None:
    """git refuses file:// submodules by default (CVE-2022-39253); tests use local ones."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.file.allow")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")


def stack_recipes(dest: Path, monorepo_path: Path | None = None, aotriton_path: Path | None = None,
                  **replace: str) -> Path:
    """The packaged stack recipes copied to dest/recipes, their git URLs pointing at the
    stand-ins; returns the recipes directory (dependencies resolve beside each other)."""
    out = dest / "recipes"
    out.mkdir(parents=True, exist_ok=True)
    for name in STACK:
        text = (REPO / "recipes" / f"{name}.toml").read_text()
        if monorepo_path is not None:
            text = text.replace(MONOREPO_URL, monorepo_path.as_uri())
        if aotriton_path is not None:
            text = text.replace(AOTRITON_URL, aotriton_path.as_uri())
        for old, new in replace.items():
            text = text.replace(old, new)
        (out / f"{name}.toml").write_text(text)
    return out
