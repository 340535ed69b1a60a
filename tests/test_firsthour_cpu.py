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
from stackfixtures import make_build
from test_env import cli, sourced_once

from rocforge_build import paths


def builds(root):
    """llama-cpp built three ways in the root's builds directory, each llama-cli naming its build."""
    out = {}
    for backend in ("cpu", "vulkan", "hip"):
        prefix = make_build(root, "llama-cpp", "gfx1151", backend)
        prog = prefix / "bin" / "llama-cli"
        prog.parent.mkdir(parents=True, exist_ok=True)
        prog.write_text(f"#!/bin/sh\necho {backend}\n")
        prog.chmod(0o755)
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
