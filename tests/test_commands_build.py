"""`rocforge build`'s command line: `--cmake-target` and its other spelling `--build-target` are
one option (the same plan, the same refusal)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy
from test_commands_env import cli


def _dry_run(root, src, *flags):
    return cli(root, "build", str(RECIPE), "--source", str(src), "--target", "gfx1100",
               "--backend", "cpu", "--dry-run", "--json", *flags)


def test_build_target_is_the_same_option_as_cmake_target(tmp_path):
    src = project_copy(tmp_path / "src")
    new = _dry_run(tmp_path, src, "--cmake-target", "fixture-hello", "--cmake-target", "greet")
    old = _dry_run(tmp_path, src, "--build-target", "fixture-hello", "--build-target", "greet")
    mixed = _dry_run(tmp_path, src, "--cmake-target", "fixture-hello", "--build-target", "greet")
    assert new.returncode == old.returncode == mixed.returncode == 0, new.stderr + old.stderr
    assert new.stdout == old.stdout == mixed.stdout
    plan = json.loads(new.stdout)
    assert plan["build"][-2:] == ["fixture-hello", "greet"]  # ninja builds those two only
    assert plan["install"][:3] == ["(copy artifacts of)", "fixture-hello", "greet"]


@pytest.mark.parametrize("flag", ["--cmake-target", "--build-target"])
def test_a_flag_without_its_target_is_one_error_line(tmp_path, flag):
    out = cli(tmp_path, "build", str(RECIPE), flag)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[0] == (
        "rocforge: error: build: argument --cmake-target/--build-target: expected one argument")


def test_a_build_that_shares_nothing_needs_no_substitute_library(tmp_path):
    """Without substitute.stores a build never imports PyCA cryptography or oras-py: a Debian
    chroot building with its own Python (tests/e2e/test_sid_chroot.py) has neither.  Here both
    are made unimportable for a real build of the fixture recipe."""
    import subprocess
    import sys

    from buildfixtures import git_repo, recipe_copy

    shim = tmp_path / "shim"
    for name in ("cryptography", "oras", "boto3"):
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    repo_root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(repo_root)])}
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "build", str(recipe), "--target", "gfx1030",
                          "--backend", "cpu", "--prefix", str(tmp_path / "p"), "--no-recheck"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p" / "bin" / "fixture-hello").is_file()


def test_an_unknown_backend_is_named_before_any_gpu_target_is_looked_for(tmp_path):
    # no --target and no GPU under this root: the backend the recipe lacks is the error, not the
    # missing target
    out = cli(tmp_path, "build", "llama-cpp", "--backend", "cuda")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["rocforge: error: recipe llama-cpp has no backend 'cuda'",
                                       "rocforge: hint: backends: hip, rocwmma, vulkan, cpu"]
