"""Real upstream source trees for `nox -s integration`, never committed: each comes from a git
directory given by an environment variable (a clone or a mirror snapshot), exported with
`git archive HEAD` into a test directory at test time.

    ROCFORGE_TEST_GIT_ROCWMMA    ROCm/rocWMMA      (standalone repo; Oct 2024 has no gfx1151)
    ROCFORGE_TEST_GIT_AOTRITON   ROCm/aotriton
    ROCFORGE_TEST_GIT_ROCBLAS    ROCm/rocBLAS      (standalone, before the rocm-libraries monorepo)
    ROCFORGE_TEST_GIT_HIPBLASLT  ROCm/hipBLASLt    (likewise)

and the checks that do not need rocforge: which CMake cache options a tree declares.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ENV = {"rocwmma": "ROCFORGE_TEST_GIT_ROCWMMA", "aotriton": "ROCFORGE_TEST_GIT_AOTRITON",
       "rocblas": "ROCFORGE_TEST_GIT_ROCBLAS", "hipblaslt": "ROCFORGE_TEST_GIT_HIPBLASLT"}


def git_dir(name: str) -> Path:
    value = os.environ.get(ENV[name])
    if not value:
        pytest.skip(f"[optional] {ENV[name]} is not set (a git directory of the real upstream "
                    f"{name}; `nox -s integration` runs these)")
    return Path(value)


def export(name: str, dest: Path) -> tuple[Path, list[str]]:
    """The HEAD tree of the upstream git directory, written under dest (what `git archive HEAD`
    would give); returns (tree, paths whose blobs the git directory lacks: mirror snapshots
    leave out their largest files, e.g. rocBLAS's Tensile logic YAMLs)."""
    gd = git_dir(name)
    listing = subprocess.run(["git", f"--git-dir={gd}", "ls-tree", "-r", "-z", "HEAD"], check=True,
                             capture_output=True).stdout.split(b"\0")
    entries = []
    for line in filter(None, listing):
        meta, path = line.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob":
            entries.append((mode, sha, path.decode()))
    batch = subprocess.Popen(["git", f"--git-dir={gd}", "cat-file", "--batch"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    missing = []
    for mode, sha, path in entries:
        batch.stdin.write(sha + b"\n")
        batch.stdin.flush()
        header = batch.stdout.readline().split()
        if header[-1] == b"missing":
            missing.append(path)
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)  # the newline after each object
        out = dest / path
        out.parent.mkdir(parents=True, exist_ok=True)
        if mode == b"120000":
            out.symlink_to(data.decode())
        else:
            out.write_bytes(data)
            if mode == b"100755":
                out.chmod(0o755)
    batch.stdin.close()
    batch.wait()
    return dest, missing


def commit_date(name: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir(name)}", "log", "-1", "--format=%cs"],
                          check=True, capture_output=True, text=True).stdout.strip()


_DECL = (
    r"\boption\s*\(\s*{n}\b",
    r"\bcmake_dependent_option\s*\(\s*{n}\b",
    r"\bset\s*\(\s*{n}\s[^)]*?\bCACHE\b",
)


def declarations(tree: Path, name: str) -> list[str]:
    """Where the tree's CMake files declare `name` as a cache option: 'file:line' list."""
    out = []
    pats = [re.compile(p.format(n=re.escape(name)), re.S) for p in _DECL]
    for f in sorted([*tree.rglob("CMakeLists.txt"), *tree.rglob("*.cmake")]):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for pat in pats:
            for m in pat.finditer(text):
                out.append(f"{f.relative_to(tree)}:{text.count(chr(10), 0, m.start()) + 1}")
    return out
