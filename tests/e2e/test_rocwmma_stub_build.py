"""llama.cpp's rocWMMA flash attention for gfx1151 with a rocWMMA that lacks gfx1151, built for
real in the sid chroot (tests/sid_chroot.py, plus Debian's rocm-cmake and libomp-21-dev, which
rocWMMA's CMakeLists.txt needs: find_package(ROCM 0.7 CONFIG REQUIRED), find_package(OpenMP)):

1. `rocforge build rocwmma --target gfx1151 --source ROCm/rocWMMA` from the real standalone
   repository as of Oct 2024 (ROCFORGE_TEST_GIT_ROCWMMA: a git directory of it, exported at test
   time; tests/upstream_trees.py): its config.hpp has no ROCWMMA_ARCH_GFX1151, so the build
   installs the headers with a loud note instead of stopping;
2. `rocforge build llama-cpp --target gfx1151 --backend rocwmma` on the May 2025 tree
   (llama-cpp-python 0.3.9 sdist), llama-bench only: the plan uses that existing rocWMMA build
   (nothing fetched: no rocm-libraries clone), the gfx1151 stub patch is applied because those
   headers lack ROCWMMA_ARCH_GFX1151, and libggml-hip.so holds gfx1151 code objects only.

Slow (~9 + 2 min on 2 cores with a cold compiler cache); `nox -s integration` runs it, the default
CI run skips it (no ROCFORGE_TEST_GIT_ROCWMMA there).
"""

from __future__ import annotations

import json
import os
import tomllib

import llama_trees
import offload_bundles as ob
import pytest
import sid_chroot
import upstream_trees as up

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get(up.ENV["rocwmma"]),
    reason=f"[optional] {up.ENV['rocwmma']} is not set (a git directory of the real ROCm/rocWMMA; "
           "`nox -s integration` runs this)")]
LLAMA = "0.3.9"
JOBS = os.environ.get("ROCFORGE_TEST_JOBS", "2")
# rocWMMA's CMakeLists.txt: find_package(ROCM 0.7 CONFIG REQUIRED) and find_package(OpenMP REQUIRED)
# with clang++-21 as the C++ compiler
EXTRA = ("rocm-cmake", "libomp-21-dev")
W = sid_chroot.WORK
STUB = b"rocforge: the WMMA flash-attention kernel is stubbed for gfx1151 in this build"


@pytest.fixture(scope="module")
def sid():
    try:
        return sid_chroot.ensure(extra=EXTRA)
    except sid_chroot.NoChroot as exc:
        pytest.skip(f"SKIPPED LOUDLY: no sid chroot here: {exc}")


def rocforge(sid, work, *args, **kw) -> str:
    res = sid_chroot.rocforge(sid, *args, work=work, **kw)
    assert res.returncode == 0, f"{args}:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res.stdout + res.stderr


def test_may_2025_rocwmma_fattn_with_the_oct_2024_rocwmma(sid, tmp_path_factory):
    work = tmp_path_factory.mktemp("rocwmma-stub")
    tree, _ = up.export("rocwmma", work / "rocwmma-src")  # skips without ROCFORGE_TEST_GIT_ROCWMMA
    config = (tree / "library/include/rocwmma/internal/config.hpp").read_text()
    assert "ROCWMMA_ARCH_GFX1100" in config and "ROCWMMA_ARCH_GFX1151" not in config

    # 1. rocWMMA from the tree without gfx1151: installed, loudly
    out = rocforge(sid, work, "build", "rocwmma", "--target", "gfx1151", "--source",
                   f"{W}/rocwmma-src", "--jobs", JOBS, timeout=1800)
    assert "THIS rocWMMA DOES NOT KNOW THE TARGET" in out
    rocwmma = work / "data/builds/rocwmma-gfx1151-hip"
    manifest = tomllib.loads((rocwmma / "rocforge-manifest.toml").read_text())
    assert any(n.startswith("THIS rocWMMA DOES NOT KNOW THE TARGET") for n in manifest["notes"])
    assert "-DAMDGPU_TARGETS=gfx1151" in manifest["flags"]["configure"]
    assert [(p["name"], p["status"]) for p in manifest["patches"]] == [
        ("upstream-clang-cxx-flags.patch", "applied")]
    assert manifest["env"]["CXX"] == "/usr/lib/llvm-21/bin/clang++"
    installed = (rocwmma / "include/rocwmma/internal/config.hpp").read_text()
    assert "ROCWMMA_ARCH_GFX1100" in installed and "ROCWMMA_ARCH_GFX1151" not in installed

    # 2. the plan: that build, used as it is, and the stub because its headers lack gfx1151
    sdist = llama_trees.sdist(LLAMA)
    args = ("build", "llama-cpp", "--target", "gfx1151", "--backend", "rocwmma", "--source",
            f"/sdists/{sdist.name}", "--cmake-target", "llama-bench", "--jobs", JOBS)
    binds = {"/sdists": sdist.parent}
    res = sid_chroot.rocforge(sid, *args, "--dry-run", "--json", work=work, binds=binds,
                              timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    plan = json.loads(res.stdout)
    (dep,) = plan["dependencies"]
    assert dep["plan"] is None and dep["built"]["prefix"] == f"{W}/data/builds/rocwmma-gfx1151-hip"
    assert "the existing rocforge rocwmma build for gfx1151" in dep["because"]
    (stub,) = [p for p in plan["patches"] if p["name"] == "gfx1151-fattn-wmma-stub.patch"]
    assert stub["status"] == "would apply"
    assert stub["reason"].startswith("the rocWMMA here lacks gfx1151")

    # 3. the real build
    rocforge(sid, work, *args, binds=binds, timeout=3600)
    prefix = work / "data/builds/llama-cpp-gfx1151-rocwmma"
    manifest = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    assert [(p["name"], p["status"]) for p in manifest["patches"]] == [
        ("gfx1151-fattn-wmma-stub.patch", "applied")]
    configure = manifest["flags"]["configure"]
    assert "-DGGML_HIP_ROCWMMA_FATTN=ON" in configure and "-DAMDGPU_TARGETS=gfx1151" in configure
    assert manifest["env"]["CPATH"].split(":")[0] == f"{W}/data/builds/rocwmma-gfx1151-hip/include"
    assert [(d["recipe"], d["used"]) for d in manifest["dependencies"]] == [("rocwmma", "existing build")]
    # sid's rocBLAS 6.4.4 NEEDs no libhipblaslt: the variable is not claimed
    assert "ROCBLAS_USE_HIPBLASLT" not in manifest.get("runtime_env", {})
    lib = prefix / "lib" / "libggml-hip.so"
    targets = ob.device_targets(lib)
    assert set(targets) == {"hipv4-amdgcn-amd-amdhsa--gfx1151"}, targets
    assert targets["hipv4-amdgcn-amd-amdhsa--gfx1151"] > 50  # one per HIP translation unit
    assert STUB in lib.read_bytes()  # the stub's abort message: the patched file was compiled
    assert (prefix / "bin" / "llama-bench").is_file()

    # the control: the same compile command on the file without the stub stops on that rocWMMA
    build, src = f"{plan['work_dir']}/build", f"{plan['work_dir']}/src/ggml/src/ggml-cuda"
    obj = "ggml/src/ggml-hip/CMakeFiles/ggml-hip.dir/__/ggml-cuda/fattn-wmma-f16.cu.o"
    cmd = sid_chroot.run(sid, ["ninja", "-C", build, "-t", "commands", obj], work=work)
    line = cmd.stdout.strip().splitlines()[-1]
    assert f"{src}/fattn-wmma-f16.cu" in line, line
    unstubbed = f"{src}/fattn-wmma-f16-unstubbed.cu"
    rev = f"{W}/unstub/ggml/src/ggml-cuda"  # git apply -R outside a repository: paths from cwd
    script = (f"mkdir -p {rev} && cp {src}/fattn-wmma-f16.cu {rev}/ && cd {W}/unstub && "
              "git apply -R /rocforge/patches/llama-cpp/gfx1151-fattn-wmma-stub.patch && "
              f"cp {rev}/fattn-wmma-f16.cu {unstubbed} && cd {build} && "
              + line.replace(f"{src}/fattn-wmma-f16.cu", unstubbed)
                    .replace(f"-o {obj}", f"-o {W}/unstubbed.o"))
    env = {k: v for k, v in manifest["env"].items() if k in ("CPATH", "HIP_DEVICE_LIB_PATH")}
    res = sid_chroot.run(sid, ["sh", "-c", script], work=work, env=env, timeout=1200)
    assert res.returncode != 0
    assert "Unsupported architecture" in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
