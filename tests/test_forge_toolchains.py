"""The glslc probe: one glslc run answers for every extension, as one run per extension would."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rocforge_build.forge.toolchains import GLSLC_FEATURES, Toolchain

# compiles with every glslc llama.cpp supports (16-bit storage is core SPIR-V since Vulkan 1.1)
CONTROL = "GL_EXT_shader_16bit_storage"


def _glslc() -> str:
    exe = shutil.which("glslc")
    if exe is None:
        pytest.skip("glslc missing: install the packages in .ci/apt-packages.txt (glslc)")
    return exe


def _one_at_a_time(glslc: str, ext: str, tmp: Path) -> bool:
    src = tmp / f"{ext}.comp"
    src.write_text(f"#version 450\n#extension {ext} : require\nvoid main() {{}}\n")
    return subprocess.run([glslc, "-fshader-stage=compute", "--target-env=vulkan1.3", str(src), "-o",
                           str(tmp / f"{ext}.spv")], capture_output=True).returncode == 0


def _counting(glslc: str, tmp: Path) -> tuple[Path, Path]:
    """A wrapper that logs each start and runs the real glslc."""
    log = tmp / "starts.log"
    wrapper = tmp / "bin" / "glslc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho start >> "{log}"\nexec "{glslc}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def test_one_glslc_run_answers_like_one_run_per_extension(tmp_path):
    glslc = _glslc()
    wrapper, log = _counting(glslc, tmp_path)
    tc = Toolchain("vulkan", glslc=str(wrapper))
    batch = {ext: tc.probe_glslc(ext) for ext in [CONTROL, *GLSLC_FEATURES]}  # the first asks for all
    alone = {ext: _one_at_a_time(glslc, ext, tmp_path) for ext in batch}
    assert batch == alone
    assert batch[CONTROL] is True
    # Debian 12's glslc (shaderc 2023.2) compiles none of the four: llama.cpp's own configure
    # reports them off with it, and its Vulkan backend on the H100 says "matrix cores: none"
    if "2023.2" in subprocess.run([glslc, "--version"], capture_output=True, text=True).stdout:
        assert not any(batch[ext] for ext in GLSLC_FEATURES)
    # every answer came from the first glslc start; the later questions asked nothing
    assert log.read_text().count("start") == 1


def test_an_extension_outside_the_list_is_probed_with_them(tmp_path):
    glslc = _glslc()
    wrapper, log = _counting(glslc, tmp_path)
    tc = Toolchain("vulkan", glslc=str(wrapper))
    assert tc.probe_glslc(CONTROL) is True
    assert tc.probe_glslc("GL_NOT_an_extension") is False  # one more start, for it alone
    assert tc.probe_glslc("GL_KHR_cooperative_matrix") == _one_at_a_time(
        glslc, "GL_KHR_cooperative_matrix", tmp_path)
    assert log.read_text().count("start") == 2


def test_a_glslc_that_cannot_start_answers_no(tmp_path):
    missing = tmp_path / "no-such-glslc"
    tc = Toolchain("vulkan", glslc=str(missing))
    assert tc.probe_glslc("GL_KHR_cooperative_matrix") is False
    assert Toolchain("vulkan").probe_glslc(CONTROL) is False  # no glslc found at all
