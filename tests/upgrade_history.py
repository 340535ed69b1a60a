"""The fixture project as a local git history for `rocforge upgrade` and `rocforge bisect`: a
commit that slows its program down and, later, one that breaks its output, between harmless
ones; and checker scripts for `--run` (git bisect run's exit codes)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from buildfixtures import git, git_repo, recipe_copy
from trust_helpers import entries, rocforge

SLEEP_S = 0.12  # what the slow commit adds to every run of fixture-hello
SLOW_LIMIT_S = 0.06  # the timing checker's limit: far above the fast program (~2 ms), below SLEEP_S


@dataclass
class History:
    repo: Path
    recipe: Path
    base: str  # v1.2.0: good
    commits: dict[str, str]  # docs1, slow, docs2, break, docs3 -> sha (oldest first)


def _commit(repo: Path, message: str) -> str:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def history(tmp: Path) -> History:
    repo = git_repo(tmp / "repo")
    base = git("rev-parse", "HEAD", cwd=repo)
    greet = repo / "greet.c"
    commits = {}
    (repo / "NOTES").write_text("notes\n")
    commits["docs1"] = _commit(repo, "docs")
    text = greet.read_text().replace(
        "void greet(void) {\n",
        "#include <time.h>\n\nvoid greet(void) {\n"
        f"    struct timespec pause = {{0, {int(SLEEP_S * 1e9)}L}};\n"
        "    nanosleep(&pause, 0);\n")
    greet.write_text(text)
    commits["slow"] = _commit(repo, "slow: sleeps before greeting")
    (repo / "NOTES").write_text("notes\nmore notes\n")
    commits["docs2"] = _commit(repo, "docs 2")
    greet.write_text(greet.read_text().replace("toupper", "tolower"))  # same size: same stat
    commits["break"] = _commit(repo, "break: the loud greeting is lower case")
    (repo / "NOTES").write_text("notes\nmore notes\neven more\n")
    commits["docs3"] = _commit(repo, "docs 3")
    recipe = recipe_copy(tmp / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    return History(repo, recipe, base, commits)


def built(top: Path) -> tuple[History, Path]:
    """The fixture project's history in `top`, its newest commit built into top/prefix by
    `rocforge build` run as a user runs it."""
    h = history(top)
    prefix = top / "prefix"
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--prefix", str(prefix),
                   "--no-recheck")
    assert res.returncode == 0, res.stderr
    return h, prefix


def checker(path: Path, body: str) -> Path:
    """A --run script for /bin/sh, executable (a shell starts in a millisecond: bisect runs one
    per step)."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def output_checker(tmp: Path) -> Path:
    """Good when fixture-hello prints the loud greeting."""
    return checker(tmp / "check-output.sh", '"$ROCFORGE_PREFIX/bin/fixture-hello" | grep -qx HELLO\n')


def timing_checker(tmp: Path) -> Path:
    """Good when fixture-hello runs in under SLOW_LIMIT_S (GNU date's nanoseconds)."""
    limit_ns = int(SLOW_LIMIT_S * 1e9)
    return checker(tmp / "check-time.sh",
                   't0=$(date +%s%N)\n"$ROCFORGE_PREFIX/bin/fixture-hello" >/dev/null\n'
                   f't1=$(date +%s%N)\n[ $((t1 - t0)) -lt {limit_ns} ]\n')


def tree_hashes(top: Path) -> dict[str, str]:
    """Every entry under `top`: file contents, link targets, directories and modes."""
    out = {}
    for rel, p in entries(top):
        mode = f"{p.lstat().st_mode:o}"
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = f"dir:{mode}"
        else:
            out[rel] = f"{mode}:" + hashlib.sha256(p.read_bytes()).hexdigest()
    return out
