"""The llama.cpp recipe against real llama.cpp trees of five eras (llama-cpp-python sdists):
option names, GPU target variable, rocWMMA availability, the gfx1151 stub, the Vulkan header
check — all from plans (`--dry-run`), no toolchain needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from llama_trees import ERAS, tree
from toolchain_fixtures import fake_vulkan_sdk, therock_root

from rocforge_build import cli
from rocforge_build.errors import ToolchainError, UsageError
from rocforge_build.forge import conditions, recipes
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.rootfs import Root

# CMake's own variables and those read by CMake modules (not declared by the tree itself)
CMAKE_BUILTIN = {"CMAKE_BUILD_TYPE", "CMAKE_INSTALL_LIBDIR", "CMAKE_INSTALL_RPATH", "CMAKE_HIP_FLAGS",
                 "CMAKE_INSTALL_PREFIX", "GPU_TARGETS", "AMDGPU_TARGETS", "Vulkan_INCLUDE_DIR",
                 "Vulkan_LIBRARY", "Vulkan_GLSLC_EXECUTABLE", "CMAKE_BUILD_WITH_INSTALL_RPATH",
                 "CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = Path(os.environ.get("ROCFORGE_TEST_SDISTS_TREES", tmp_path_factory.mktemp("llama")))
    return {v: tree(v, base) for v in ERAS}


@pytest.fixture
def empty_root(tmp_path):
    d = tmp_path / "root"
    (d / "usr" / "include").mkdir(parents=True)
    return Root(d)


def plan(trees, version, root, backend, target="gfx1151", environ=None):
    req = Request(recipe="llama-cpp", target=target, backend=backend,
                           source=str(trees[version]), environ=environ)
    return plan_for(req, root)


def defines(p) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in p.configure if a.startswith("-D"))


@pytest.mark.parametrize("version", list(ERAS))
def test_hip_uses_the_eras_option_names_only(trees, empty_root, version):
    p = plan(trees, version, empty_root, "hip")
    d = defines(p)
    era = ERAS[version]
    assert d[era] == "ON"
    others = {"LLAMA_HIPBLAS", "GGML_HIPBLAS", "GGML_HIP"} - {era}
    assert not others & set(d)
    declared = conditions.scan_cmake_options(p.source.tree)
    for name in d:  # every name the tree declares, or a CMake variable by design
        assert name in declared or name in CMAKE_BUILTIN or name.endswith("_COMPILER_LAUNCHER"), name
    gpu_var = "GPU_TARGETS" if version == "0.3.36" else "AMDGPU_TARGETS"
    assert d[gpu_var] == "gfx1151"
    assert not ({"GPU_TARGETS", "AMDGPU_TARGETS"} - {gpu_var}) & set(d)
    assert d["CMAKE_BUILD_TYPE"] == "Release"
    if "GGML_RPC" in declared:
        assert d["GGML_RPC"] == "ON"
    for dependency in ("LLAMA_CURL", "LLAMA_OPENSSL"):  # no optional host libraries
        if dependency in declared:
            assert d[dependency] == "OFF"
    assert p.toolchain.missing  # no ROCm here: the plan still exists


@pytest.mark.parametrize("version", list(ERAS))
def test_rocwmma_only_where_the_tree_has_it(trees, empty_root, version):
    if version == "0.3.9":
        p = plan(trees, version, empty_root, "rocwmma")
        assert defines(p)["GGML_HIP_ROCWMMA_FATTN"] == "ON"
        return
    with pytest.raises(UsageError) as exc:
        plan(trees, version, empty_root, "rocwmma")
    assert "GGML_HIP_ROCWMMA_FATTN" in exc.value.message and "#26046" in exc.value.message
    assert "--backend hip" in exc.value.hint


def _stub_status(p):
    return {r.name: r.status for r in p.patch_status}["gfx1151-fattn-wmma-stub.patch"]


def test_gfx1151_stub_patch_only_where_the_build_would_fail(trees, empty_root, tmp_path):
    # May 2025 tree, rocwmma, gfx1151, rocWMMA without gfx1151 (none here): the stub applies
    p = plan(trees, "0.3.9", empty_root, "rocwmma")
    assert _stub_status(p) == "would apply"
    assert any("stubbed for gfx1151" in n for n in p.notes)
    # another target, another backend, a tree without the file: not needed
    assert _stub_status(plan(trees, "0.3.9", empty_root, "rocwmma", target="gfx1100")) == "not needed"
    assert _stub_status(plan(trees, "0.3.9", empty_root, "hip")) == "not needed"
    for v in ("0.3.0", "0.3.36"):
        p = plan(trees, v, empty_root, "hip")
        assert _stub_status(p) == "not needed"
        assert "no ggml/src/ggml-cuda/fattn-wmma-f16.cu" in p.patch_status[0].reason or \
            "not rocwmma" in p.patch_status[0].reason
    # once patched, the same patch reads as already upstream (idempotent)
    from rocforge_build.forge import patches as patches_mod

    work = tmp_path / "patched"
    from rocforge_build.forge.sources import sync_tree

    sync_tree(trees["0.3.9"] / "vendor" / "llama.cpp", work)
    pp = [patches_mod.PatchPlan("stub", recipes.load("llama-cpp").patches_dir /
                                "gfx1151-fattn-wmma-stub.patch", True, "test")]
    assert patches_mod.apply(pp, work)[0].status == "applied"
    assert patches_mod.apply(pp, work)[0].status == "already upstream"


def test_patch_applies_to_a_tree_with_a_submodule_gitlink(trees, tmp_path):
    # the llama-cpp-python sdists carry vendor/llama.cpp/.git, a gitlink file to
    # ../../.git/modules/vendor/llama.cpp that does not exist in the sdist; git apply stopped at it
    from rocforge_build.forge import patches as patches_mod
    from rocforge_build.forge.sources import sync_tree

    work = tmp_path / "patched"
    sync_tree(trees["0.3.9"] / "vendor" / "llama.cpp", work)
    (work / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    pp = [patches_mod.PatchPlan("stub", recipes.load("llama-cpp").patches_dir /
                                "gfx1151-fattn-wmma-stub.patch", True, "test")]
    assert patches_mod.apply(pp, work)[0].status == "applied"
    assert patches_mod.apply(pp, work)[0].status == "already upstream"


def _guard_status(p):
    return {r.name: r.status for r in p.patch_status}.get("vulkan-coopmat-glslc-guard.patch")


_KHR_DETECT = '} else if (strcmp("VK_KHR_cooperative_matrix", properties.extensionName) == 0 &&'


def _guarded(cpp: Path) -> bool:
    """The device's KHR coopmat detection sits under the glslc-support define (llama.cpp #13696)."""
    lines = cpp.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == _KHR_DETECT)
    return lines[at - 1].strip() == "#if defined(GGML_VULKAN_COOPMAT_GLSLC_SUPPORT)"


def test_vulkan_coopmat_guard_only_before_upstreams_fix(trees, empty_root, tmp_path):
    # llama.cpp #13044: the May 2025 tree marks a device coopmat-capable from the driver's extension
    # list alone, so with a glslc that built no coopmat shaders (Debian 12) the scalar matmul runs
    # with coopmat tile sizes and computes garbage; #13696 (22 May 2025) added the guard, which the
    # Oct 2026 tree carries.
    env = {**os.environ, "VULKAN_SDK": str(fake_vulkan_sdk(tmp_path / "sdk", layer_settings=True))}
    assert _guard_status(plan(trees, "0.3.9", empty_root, "vulkan", environ=env)) == "would apply"
    assert _guard_status(plan(trees, "0.3.36", empty_root, "vulkan", environ=env)) == "not needed"
    assert _guard_status(plan(trees, "0.3.9", empty_root, "hip")) == "not needed"
    vk = Path("ggml/src/ggml-vulkan/ggml-vulkan.cpp")
    assert _guarded(trees["0.3.36"] / "vendor" / "llama.cpp" / vk)
    from rocforge_build.forge import patches as patches_mod
    from rocforge_build.forge.sources import sync_tree

    work = tmp_path / "patched"
    sync_tree(trees["0.3.9"] / "vendor" / "llama.cpp", work)
    assert not _guarded(work / vk)
    pp = [patches_mod.PatchPlan("guard", recipes.load("llama-cpp").patches_dir /
                                "vulkan-coopmat-glslc-guard.patch", True, "test")]
    assert patches_mod.apply(pp, work)[0].status == "applied"
    assert _guarded(work / vk)
    assert patches_mod.apply(pp, work)[0].status == "already upstream"


def test_default_backend_per_target_and_tree(trees, empty_root):
    req = Request(recipe="llama-cpp", target="gfx1151", source=str(trees["0.3.36"]))
    p = plan_for(req, empty_root)
    assert p.backend == "hip" and "fattn-mma" in p.backend_reason
    # gfx1151 defaults to hip on every era, the May 2025 tree (which has rocWMMA FA) too: rocWMMA
    # FA cut long-context prefill 41 % up to ~4x (llama.cpp #24437, lemonade-sdk/lemonade #2624)
    p = plan_for(Request(recipe="llama-cpp", target="gfx1151", source=str(trees["0.3.9"])), empty_root)
    assert p.backend == "hip" and "long-context prefill" in p.backend_reason
    assert any("#24437" in e for e in p.backend_evidence)
    assert any("#2624" in e for e in p.backend_evidence)
    assert [r.get("backend") for r in recipes.load("llama-cpp").of("default")] == ["hip"]


def test_vulkan_header_check_before_building(trees, empty_root, tmp_path):
    old = fake_vulkan_sdk(tmp_path / "sdk-old", layer_settings=False)
    env = {**os.environ, "VULKAN_SDK": str(old)}
    with pytest.raises(ToolchainError) as exc:
        plan(trees, "0.3.36", empty_root, "vulkan", environ=env)
    assert "vk::LayerSettingEXT" in exc.value.message and "VkLayerSettingEXT" in exc.value.hint
    # the May 2025 tree builds against the same headers; the plan reports what glslc lacks
    p = plan(trees, "0.3.9", empty_root, "vulkan", environ=env)
    d = defines(p)
    assert d["GGML_VULKAN"] == "ON" and d["Vulkan_GLSLC_EXECUTABLE"] == str(old / "bin" / "glslc")
    note = next(n for n in p.notes if "cannot compile" in n)
    assert "coopmat" in note and "integer dot" in note
    # newer headers: the Oct 2026 tree plans fine
    new = fake_vulkan_sdk(tmp_path / "sdk-new", layer_settings=True)
    p = plan(trees, "0.3.36", empty_root, "vulkan", environ={**os.environ, "VULKAN_SDK": str(new)})
    assert defines(p)["Vulkan_INCLUDE_DIR"] == str(new / "include")


def test_vulkan_missing_names_the_packages(trees, empty_root, tmp_path):
    env = {"PATH": str(tmp_path / "nothing"), "HOME": str(tmp_path)}
    p = plan(trees, "0.3.9", empty_root, "vulkan", environ=env)
    assert "glslc" in p.toolchain.missing
    assert "libvulkan-dev glslc spirv-headers" in p.toolchain.hint


# Each era's own compiler-cache switch, read from the sdists' CMake files: on by default, it puts
# ccache (or sccache) in front of every compile through RULE_LAUNCH_COMPILE whenever one is on PATH.
#   0.2.70  CMakeLists.txt:53        option(LLAMA_CCACHE "llama: use ccache if available" ON)
#   0.3.0   ggml/CMakeLists.txt:72   option(GGML_CCACHE "ggml: use ccache if available" ON)
#   0.3.9   ggml/CMakeLists.txt:81   the same; 0.3.36 ggml/CMakeLists.txt:125 the same
#   0.1.85  no such switch
OWN_CCACHE = {"0.1.85": None, "0.2.70": "LLAMA_CCACHE", "0.3.0": "GGML_CCACHE",
              "0.3.9": "GGML_CCACHE", "0.3.36": "GGML_CCACHE"}


@pytest.mark.parametrize("no_cache", [True, False], ids=["no-cache", "cache"])
@pytest.mark.parametrize("version", list(ERAS))
def test_the_trees_own_ccache_switch_is_off(trees, empty_root, tmp_path, version, no_cache):
    """--no-cache means no launcher at all, and with the cache on the launcher is rocforge's
    (cache.launcher): the tree's own switch would add ccache in either case."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ccache = bin_dir / "ccache"
    ccache.write_text("#!/bin/sh\nexec \"$@\"\n")
    ccache.chmod(0o755)
    req = Request(recipe="llama-cpp", target="gfx1030", backend="cpu", source=str(trees[version]),
                  no_cache=no_cache, environ={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    d = defines(plan_for(req, empty_root))
    switch = OWN_CCACHE[version]
    assert not {"LLAMA_CCACHE", "GGML_CCACHE"} - {switch} & set(d)
    if switch:
        assert d[switch] == "OFF"
    launchers = {k: v for k, v in d.items() if k.endswith("_COMPILER_LAUNCHER")}
    assert launchers == ({} if no_cache else {"CMAKE_C_COMPILER_LAUNCHER": str(ccache),
                                              "CMAKE_CXX_COMPILER_LAUNCHER": str(ccache)})


def test_cli_dry_run_json_for_an_old_tree(trees, tmp_path, capsys):
    root = tmp_path / "r"
    root.mkdir()
    rc = cli.main(["--root", str(root), "build", "llama-cpp", "--target", "gfx1030", "--backend", "hip",
                   "--source", str(trees["0.2.70"]), "--dry-run", "--json"])
    assert rc == 4  # the plan is printed; no ROCm under --root: exits as the build would
    p = json.loads(capsys.readouterr().out)
    assert "-DLLAMA_HIPBLAS=ON" in p["configure"] and "-DAMDGPU_TARGETS=gfx1030" in p["configure"]
    assert p["source"]["subdir"] == "vendor/llama.cpp"
    assert p["patches"][0] == {"name": "gfx1151-fattn-wmma-stub.patch", "status": "not needed",
                               "reason": "target gfx1030 is not gfx1151",
                               "sha256": p["patches"][0]["sha256"]}
    assert p["patches"][1]["name"] == "vulkan-coopmat-glslc-guard.patch"
    assert p["patches"][1]["status"] == "not needed" and len(p["patches"]) == 2
    assert p["env"]["CC"] == "<no HIP toolchain>/clang"  # LLAMA_HIPBLAS era: CC = ROCm clang


def test_recipe_show_and_list(capsys):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "llama-cpp" in out and "hip, rocwmma, vulkan, cpu" in out
    assert cli.main(["recipe", "show", "llama-cpp"]) == 0
    out = capsys.readouterr().out
    assert "GGML_HIP_ROCWMMA_FATTN = ON" in out and "why: " in out


def test_with_a_therock_toolchain(trees, tmp_path):
    root = therock_root(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    req = Request(recipe="llama-cpp", target="gfx1151", source=str(trees["0.3.9"]), environ=env)
    p = plan_for(req, root)
    assert p.toolchain.missing is None and p.toolchain.rocm_version.startswith("7.9")
    # rocWMMA knows gfx1151 and the tree has rocWMMA FA: still hip by default (long-context
    # prefill, llama.cpp #24437); rocwmma on request builds without the stub, with a note
    assert p.backend == "hip" and any("#24437" in e for e in p.backend_evidence)
    p = plan_for(Request(recipe="llama-cpp", target="gfx1151", backend="rocwmma", source=str(trees["0.3.9"]), environ=env), root)
    assert _stub_status(p) == "not needed"
    assert any("long-context prefill" in n and "#24437" in n for n in p.notes)
    assert p.env["HIPCXX"].startswith(str(root.base)) and p.env["HIPCXX"].endswith("clang++")
    d = defines(p)
    assert d["CMAKE_HIP_FLAGS"] == "-mllvm --amdgpu-unroll-threshold-local=600"  # ROCm >= 7
    assert d["AMDGPU_TARGETS"] == "gfx1151" and d["GGML_HIP_ROCWMMA_FATTN"] == "ON"
    assert p.runtime_env == {"ROCBLAS_USE_HIPBLASLT": "1"}


def test_old_rocwmma_makes_hip_the_default(trees, tmp_path):
    # an explicit --backend rocwmma then builds a gfx1151-aware rocWMMA first (see
    # test_stack_recipes.test_llama_rocwmma_builds_a_target_aware_rocwmma_first)
    root = therock_root(tmp_path, rocwmma_gfx1151=False)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = plan_for(Request(recipe="llama-cpp", target="gfx1151", source=str(trees["0.3.9"]), environ=env), root)
    assert p.backend == "hip"


def test_too_old_rocm_for_the_tree_stops(trees, tmp_path):
    root = therock_root(tmp_path, version="6.0.2")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    with pytest.raises(ToolchainError) as exc:
        plan_for(Request(recipe="llama-cpp", target="gfx1151", backend="hip",
                                            source=str(trees["0.3.36"]), environ=env), root)
    assert "needs HIP >= 6.1" in exc.value.message
    assert "rocforge nightly install --target gfx1151" in exc.value.hint
    p = plan_for(Request(recipe="llama-cpp", target="gfx1151", backend="hip",
                                            source=str(trees["0.3.9"]), environ=env), root)
    assert "CMAKE_HIP_FLAGS" not in defines(p)  # ROCm 6: no ROCm 7 workaround


def test_the_pinned_version_and_its_hip_floor_are_the_sdists(trees):
    """The recipe's source-free HIP stop rests on two facts of the pinned sdist: its version
    (`pinned_version`) and its ggml-hip's floor.  Both read here from the real file, whose
    sha256 is the recipe's pin."""
    import hashlib

    from llama_trees import sdist

    recipe = recipes.load("llama-cpp")
    assert hashlib.sha256(sdist("0.3.36").read_bytes()).hexdigest() == recipe.source.sha256
    assert recipe.source.pinned_version == "0.3.36"
    assert "Version: 0.3.36" in (trees["0.3.36"] / "PKG-INFO").read_text()
    hip = trees["0.3.36"] / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-hip" / "CMakeLists.txt"
    assert "if (${hip_VERSION} VERSION_LESS 6.1)" in hip.read_text()
    stop = [r for r in recipe.of("stop") if r.when.get("source_version") == "==0.3.36"]
    assert len(stop) == 1 and stop[0].when["rocm"] == "<6.1"


def _root_with_cpu(tmp_path, name: str, amx: bool) -> Root:
    """A root whose /proc/cpuinfo is this machine's own, its flags with AMX-INT8 (or without)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("flags"):
            key, _, flags = line.partition(":")
            kept = [f for f in flags.split() if not f.startswith("amx")]
            line = f"{key}: {' '.join(kept + (['amx_bf16', 'amx_tile', 'amx_int8'] if amx else []))}"
        out.append(line)
    d = tmp_path / name
    (d / "proc").mkdir(parents=True)
    (d / "usr" / "include").mkdir(parents=True)
    (d / "proc" / "cpuinfo").write_text("\n".join(out) + "\n")
    return Root(d)


@pytest.mark.parametrize("version, has_amx_kernels", [("0.3.9", True), ("0.3.36", True), ("0.3.0", False)])
def test_an_amx_host_builds_the_cpu_backend_without_amx_int8(trees, tmp_path, version, has_amx_kernels):
    """ggml's AMX kernels computed Q4_0/Q4_1 wrongly (llama.cpp #16315; on this project's 2-core
    Xeon the May 2025 tree's CPU build gave SmolLM2-135M Q4_1 a perplexity of 278-369 on Pride and
    Prejudice, 17-22 without AMX): on a host whose CPU has amx_int8, a tree with the AMX kernels is
    built with -mno-amx-int8 (every backend: the CPU backend runs beside each); a host without AMX,
    or a tree without those kernels, gets no such flag."""
    amx = _root_with_cpu(tmp_path, "amx", True)
    plain = _root_with_cpu(tmp_path, "plain", False)
    for root, wanted in ((amx, has_amx_kernels), (plain, False)):
        d = defines(plan(trees, version, root, "cpu"))
        assert (d.get("CMAKE_C_FLAGS") == d.get("CMAKE_CXX_FLAGS") == "-mno-amx-int8") is wanted, d
        if not wanted:
            assert "CMAKE_C_FLAGS" not in d and "CMAKE_CXX_FLAGS" not in d
    assert conditions.cpu_flags(amx) >= {"amx_int8"}
    assert "amx_int8" not in conditions.cpu_flags(plain)
    assert conditions.cpu_flags(Root(tmp_path / "nothing")) is None  # unreadable: unknown, not false
