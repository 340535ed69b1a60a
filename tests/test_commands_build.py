"""`rocforge build`'s command line: `--cmake-target` and its other spelling `--build-target` are
one option (the same plan, the same refusal)."""

from __future__ import annotations

import json

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
