"""CPU and Vulkan users on a machine without ROCm (issue 30, item 9): `rocforge env` exited 4 even
when `rocforge use` had chosen a CPU or Vulkan build, which need no ROCm.  Now it prints their
PATH with a comment saying no ROCm was found, exit 0; a HIP build is never put on PATH without a
ROCm, and with no build to serve `env` still exits 4 in one line.

Real roots without any ROCm or GPU, real build prefixes with real programs
(tests/stackfixtures.make_build), real bash sourcing what `rocforge env` printed.
"""

from __future__ import annotations

import subprocess

import pytest
from stackfixtures import make_build, program
from test_commands_env import cli, sourced_once

from rocforge_build import paths


def builds(root):
    """llama-cpp built three ways in the root's builds directory, each llama-cli naming its build."""
    out = {}
    for backend in ("cpu", "vulkan", "hip"):
        prefix = make_build(root, "llama-cpp", "gfx1151", backend)
        program(prefix, "llama-cli", f"#!/bin/sh\necho {backend}\n")
        out[backend] = prefix
    return out


def inner(prefix) -> str:
    return f"{paths.builds_prefix()}/{prefix.name}"


@pytest.mark.parametrize("chosen", ["cpu", "vulkan"])
def test_env_without_rocm_gives_the_chosen_cpu_or_vulkan_build_its_path(tmp_path, chosen):
    root = tmp_path / "root"
    root.mkdir()  # no ROCm, no GPU: nothing under /opt, /usr or /sys
    built = builds(root)
    assert cli(root, "use", str(built[chosen])).returncode == 0
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = cli(root, "env", "--shell", "bash", env=start)
    assert out.returncode == 0, out.stderr
    assert "rocforge: error" not in out.stderr
    assert out.stdout.splitlines()[0].startswith("# rocforge env --shell bash: no ROCm installation found")
    assignments = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert not any("ROCM_PATH" in line or "HIP_PATH" in line for line in assignments), out.stdout
    # the script names inner paths: make that path lead to the builds inside the root, so the
    # sourcing bash finds the real programs
    paths.builds_prefix().parent.mkdir(parents=True, exist_ok=True)
    paths.builds_prefix().symlink_to(built[chosen].parent)
    got = sourced_once("bash", out.stdout, start, tmp_path)
    assert got["PATH"].split(":")[0] == inner(built[chosen]) + "/bin"
    assert inner(built["hip"]) not in got["PATH"]  # a HIP build needs the ROCm that is not here
    script = tmp_path / "env.sh"
    script.write_text(out.stdout)
    probe = subprocess.run(["bash", "-c", f". {script} 2>/dev/null; llama-cli"], env=start,
                           capture_output=True, text=True, timeout=20)
    assert probe.stdout.split() == [chosen]
    assert cli(root, "env", "--shell", "json").returncode == 0


def test_env_without_rocm_and_without_a_build_to_serve_is_exit_4(tmp_path):
    """The HIP build chosen, or no build at all: nothing runs without a ROCm, one line, exit 4."""
    root = tmp_path / "root"
    root.mkdir()
    out = cli(root, "env", "--shell", "bash")
    assert out.returncode == 4 and out.stdout == ""
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1 and "no ROCm installation found" in errors[0]
    built = builds(root)
    assert cli(root, "use", str(built["hip"])).returncode == 0
    out = cli(root, "env", "--shell", "bash")
    assert out.returncode == 4 and out.stdout == ""
    assert "no ROCm installation found" in out.stderr


# -- a CPU or Vulkan build needs no GPU target, and its prefix is named for none ---------------

def _build(root, *args):
    from buildfixtures import RECIPE

    from rocforge_build.cli import main

    return main(["--root", str(root), "build", str(RECIPE), *args])


def test_a_cpu_build_needs_no_gpu_target_on_a_machine_without_one(tmp_path, capsys):
    """No GPU, no ROCm, no --target: `--backend cpu` plans and builds for real (the fixture CMake
    project) into `<builds>/fixture-cpu`, whose manifest records no target; `rocforge env` then
    serves it.  A HIP build without a target is still refused in one line (exit 2)."""
    import json

    from buildfixtures import project_copy

    src = project_copy(tmp_path / "src")
    # a root with rocforge's own directories in it and nothing else (no /sys, /opt, /usr): `use`
    # and `env` see the builds directory inside it
    root = paths.data_dir().parent
    assert _build(root, "--backend", "cpu", "--source", str(src), "--dry-run", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["target"] == "" and plan["prefix"] == str(paths.builds_prefix() / "fixture-cpu")
    assert _build(root, "--backend", "cpu", "--source", str(src)) == 0, capsys.readouterr().err
    prefix = paths.builds_prefix() / "fixture-cpu"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(prefix)
    import tomllib

    manifest = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    assert manifest["target"] == "" and manifest["backend"] == "cpu"
    assert (prefix / "bin" / "fixture-hello").is_file()
    chose = cli(root, "use", str(prefix))
    assert chose.returncode == 0, chose.stderr
    served = cli(root, "env", "--shell", "json")
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["PATH"].split(":")[0].endswith("/builds/fixture-cpu/bin")
    assert _build(root, "--backend", "hip", "--source", str(src), "--dry-run") == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert lines == ["rocforge: error: no GPU target was given and none was detected"], err


def test_a_cpu_build_named_the_old_way_is_rebuilt_in_place(tmp_path, capsys):
    """A CPU build at `<builds>/fixture-gfx1030-cpu` (the name before): the same build asked for
    again is up to date there — not built a second time beside it under the new name."""
    from buildfixtures import project_copy

    src = project_copy(tmp_path / "src")
    root = tmp_path / "root"
    root.mkdir()
    old = paths.builds_prefix() / "fixture-gfx1030-cpu"
    args = ["--target", "gfx1030", "--backend", "cpu", "--source", str(src)]
    assert _build(root, *args, "--prefix", str(old)) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert _build(root, *args) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(old) and "is up to date" in err
    assert not (paths.builds_prefix() / "fixture-cpu").exists()
