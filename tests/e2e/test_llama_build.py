"""Real llama.cpp builds through rocforge whose llama-bench then runs (slow; CI runs them).

CI budget (2 cores, cold ccache): the CPU backend, then the Vulkan backend, of the May 2025 tree
(llama-cpp-python 0.3.9), `--cmake-target llama-bench` only; the Vulkan build reuses the CPU
objects through ccache (CCACHE_BASEDIR).  The full set — every program, the Oct 2026 tree — runs in
`nox -s integration` (ROCFORGE_INTEGRATION_FULL=1).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from llama_builds import JOBS, build_llama

from rocforge_build.errors import ToolchainError
from rocforge_build.forge import pipeline


def bench(prefix: Path, model: Path, *extra: str) -> list[dict]:
    out = subprocess.run([str(prefix / "bin" / "llama-bench"), "-m", str(model), "-p", "32", "-n", "8",
                          "-r", "1", "-t", str(JOBS), "-o", "json", *extra],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def build(llama_tree, backend, tmp_path) -> pipeline.BuildResult:
    return build_llama(llama_tree, backend, tmp_path)


@pytest.mark.slow
def test_cpu_build_runs_llama_bench(llama_tree, llama_cpu_build, tiny_model):
    out = llama_cpu_build  # the session's CPU build (tests/llama_builds.py), bundled by test_bundle too
    assert out.status == "built"
    m = tomllib.loads(out.manifest.read_text())
    assert m["backend"] == "cpu" and "-DGGML_RPC=ON" in m["flags"]["configure"]
    assert not any("GGML_HIP" in a or "GGML_VULKAN" in a for a in m["flags"]["configure"])
    results = bench(out.prefix, tiny_model)
    tests = {(r["n_prompt"], r["n_gen"]): r for r in results}
    assert tests[(32, 0)]["avg_ts"] > 0 and tests[(0, 8)]["avg_ts"] > 0
    assert "Vulkan" not in tests[(32, 0)]["backends"]
    log_mtime = out.plan.log.stat().st_mtime_ns
    again = build(llama_tree, "cpu", out.prefix.parent)
    # nothing ran (no cmake, no ninja: the log is untouched); its speed: benchmarks/bench_build.py
    assert again.status == "up to date" and out.plan.log.stat().st_mtime_ns == log_mtime


@pytest.mark.slow
def test_vulkan_build_runs_llama_bench(llama_tree, tiny_model, tmp_path):
    if not shutil.which("glslc"):
        pytest.fail("glslc missing: install the packages in .ci/apt-packages.txt (glslc libvulkan-dev spirv-headers)")
    src = llama_tree / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    core = Path("/usr/include/vulkan/vulkan_core.h")
    if "vk::LayerSettingEXT" in src.read_text() and "VkLayerSettingEXT" not in core.read_text():
        # the Oct 2026 tree against Debian 12's headers: stopped before any compiling
        with pytest.raises(ToolchainError) as exc:
            build(llama_tree, "vulkan", tmp_path)
        assert "VK_EXT_layer_settings" in exc.value.message
        assert not (tmp_path / "llama-vulkan").exists()
        return
    out = build(llama_tree, "vulkan", tmp_path)
    m = tomllib.loads(out.manifest.read_text())
    assert "-DGGML_VULKAN=ON" in m["flags"]["configure"]
    assert "glslc" in m["toolchain"] and "VK_HEADER_VERSION" in m["toolchain"]["vulkan_headers"]
    # lavapipe (mesa-vulkan-drivers) is a real Vulkan device on a machine without a GPU
    results = bench(out.prefix, tiny_model, "-ngl", "99")
    assert all(r["avg_ts"] > 0 for r in results)
    assert "Vulkan" in results[0]["backends"]


@pytest.mark.slow
def test_no_cache_build_runs_no_compiler_cache(llama_tree, tmp_path):
    """`--no-cache` on a real configure of the May 2025 tree with ccache on PATH: the plan's flags
    (GGML_CCACHE=OFF, no launcher) give compile commands without ccache; the tree's default
    (GGML_CCACHE ON, ggml/CMakeLists.txt) would have put ccache in front of every one."""
    from rocforge_build.forge.plan import Request, plan_for
    from rocforge_build.rootfs import Root

    if not shutil.which("ccache"):
        pytest.fail("ccache missing: install the packages in .ci/apt-packages.txt")
    src = llama_tree / "vendor" / "llama.cpp"
    plan = plan_for(Request(recipe="llama-cpp", target="gfx1030", backend="cpu", source=str(src), no_cache=True,
                             build_targets=("ggml-base",)), Root("/"))
    flags = [a for a in plan.configure if a.startswith("-D")]
    assert "-DGGML_CCACHE=OFF" in flags

    def compiles(build: Path, flags: list[str]) -> list[str]:
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *flags],
                       check=True, capture_output=True)
        out = subprocess.run(["ninja", "-C", str(build), "-t", "commands", "ggml-base"], check=True,
                             capture_output=True, text=True).stdout.splitlines()
        return [c for c in out if " -c " in c]

    ours = compiles(tmp_path / "ours", flags)
    assert ours and not any("ccache" in c for c in ours)
    default = compiles(tmp_path / "default", [f for f in flags if "GGML_CCACHE" not in f])
    assert default and all(c.startswith("ccache ") for c in default)
