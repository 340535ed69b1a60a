"""Helpers for the build tests: the fixture CMake project as a local git repository, a tarball
or a plain tree, and a recipe file pointing at it."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PROJECT = DATA / "fixture-project"
RECIPE = DATA / "recipes" / "fixture.toml"


def git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def project_copy(dest: Path) -> Path:
    shutil.copytree(PROJECT, dest)
    return dest


def git_repo(dest: Path, tag: str = "v1.2.0") -> Path:
    project_copy(dest)
    git("init", "-q", "-b", "main", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "fixture", cwd=dest)
    git("tag", tag, cwd=dest)
    return dest


def tarball(dest: Path, src: Path | None = None) -> Path:
    src = src or PROJECT
    with tarfile.open(dest, "w:gz") as tf:
        tf.add(src, arcname="fixture-1.2.0")
    return dest


def recipe_copy(dest_dir: Path, **replace: str) -> Path:
    """The fixture recipe (and its patches) copied under dest_dir, with text replacements."""
    (dest_dir / "recipes").mkdir(parents=True, exist_ok=True)
    shutil.copytree(DATA / "patches", dest_dir / "patches", dirs_exist_ok=True)
    text = RECIPE.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    out = dest_dir / "recipes" / "fixture.toml"
    out.write_text(text)
    return out
