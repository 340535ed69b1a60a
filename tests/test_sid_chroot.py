"""Real HIP compiles with today's Debian ROCm (sid: hipcc 7.0.2, HIP 6.4.3, LLVM 21, rocBLAS
6.4.4), rocforge running inside a sid chroot (tests/sid_chroot.py) with no patch and no
environment variable from the user (slow; CI runs them as root).

- `rocforge build llama-cpp --target gfx1151 --backend hip` on the Oct 2026 tree (llama-cpp-python
  0.3.36), llama-bench only: its libggml-hip.so must hold gfx1151 code objects only (without
  -DGPU_TARGETS this tree's configure succeeds and builds gfx906) with RDNA3 WMMA instructions;
- `rocforge kernels build --target gfx1151` / `gfx1100`: the FP16 GEMM uses v_wmma_f32_16x16x16_f16;
- the fixture recipe's `hip` backend: a real .hip source through CMake's HIP language.

Measured wall times (2 cores) are in README.md ("Compiled for real").  The compiler cache for the
chroot lives next to it (sid_chroot.ccache_dir()), so a warm CI machine reuses it.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import llama_trees
import offload_bundles as ob
import pytest
import sid_chroot

pytestmark = pytest.mark.slow
LLAMA = "0.3.36"
JOBS = os.environ.get("ROCFORGE_TEST_JOBS", "2")


@pytest.fixture(scope="session")
def sid():
    try:
        return sid_chroot.ensure()
    except sid_chroot.NoChroot as exc:
        pytest.skip(f"SKIPPED LOUDLY: no sid chroot here: {exc}")


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("sid-work")


def inside(sid, work, *argv, **kw):
    res = sid_chroot.run(sid, list(argv), work=work, **kw)
    assert res.returncode == 0, f"{argv}:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res.stdout


def rocforge(sid, work, *args, **kw):
    return inside(sid, work, "python3", "-m", "rocforge_build", *args, **kw)


def host(work: Path, inside_path: str) -> Path:
    assert inside_path.startswith(sid_chroot.WORK + "/"), inside_path
    return work / inside_path[len(sid_chroot.WORK) + 1:]


def function_asm(asm: str, mangled_prefix: str) -> str:
    """The disassembly of one function (llvm-objdump -d: `<name>:` up to the next label)."""
    m = re.search(rf"^[0-9a-f]+ <({mangled_prefix}[^>]*)>:\n(.*?)(?=^[0-9a-f]+ <|\Z)", asm,
                  re.S | re.M)
    assert m, f"{mangled_prefix} not in the disassembly"
    return m.group(2)


@pytest.mark.parametrize("target", ["gfx1151", "gfx1100"])
def test_kernels_fp16_gemm_uses_wmma(sid, work, target):
    out = json.loads(rocforge(sid, work, "kernels", "build", "--target", target, "--out",
                              f"{sid_chroot.WORK}/kernels-{target}", "--json"))
    co = host(work, out["code_object"])
    assert co.is_file() and host(work, out["binary"]).is_file()
    # the code object's own metadata says which GPU it is for
    notes = inside(sid, work, "llvm-readelf-21", "--notes", out["code_object"])
    assert re.search(rf"amdhsa\.target:\s+'?amdgcn-amd-amdhsa--{target}'?\s", notes)
    asm = inside(sid, work, "llvm-objdump-21", "-d", out["code_object"])
    assert ob.device_targets(host(work, out["binary"])) == {f"hipv4-amdgcn-amd-amdhsa--{target}": 1}
    gemm = function_asm(asm, "_Z18rf_gemm_f16_kernel")
    assert gemm.count("v_wmma_f32_16x16x16_f16") >= 2


def test_fixture_recipe_hip_backend_compiles_a_hip_source(sid, work):
    recipe = "/rocforge/tests/data/recipes/fixture.toml"
    src = "/rocforge/tests/data/fixture-project"
    rocforge(sid, work, "build", recipe, "--target", "gfx1151", "--backend", "hip", "--source", src,
             "--prefix", f"{sid_chroot.WORK}/fixture-hip", "--jobs", JOBS)
    prefix = work / "fixture-hip"
    manifest = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    assert "-DFIXTURE_HIP=ON" in manifest["flags"]["configure"]
    assert "-DCMAKE_HIP_ARCHITECTURES=gfx1151" in manifest["flags"]["configure"]
    lib = next((prefix / "lib").glob("libgreet-hip.so*"))
    assert ob.device_targets(lib) == {"hipv4-amdgcn-amd-amdhsa--gfx1151": 1}
    # the kernel is in the gfx1151 code object, compiled (not just declared)
    (work / "fixture-co").write_bytes(ob.code_objects(lib)[0][1])
    asm = inside(sid, work, "llvm-objdump-21", "-d", f"{sid_chroot.WORK}/fixture-co")
    assert "v_mul_f32" in function_asm(asm, "_Z20fixture_scale_kernel")


@pytest.fixture(scope="session")
def oct_tree(work):
    llama_trees.tree(LLAMA, work / "trees", full=True)
    return f"{sid_chroot.WORK}/trees/llama_cpp_python-{LLAMA}/vendor/llama.cpp"


def test_the_two_traps_are_real(sid, work, oct_tree):
    """What a recipe must avoid, shown on this very toolchain (configure only): the Oct 2026
    tree configures without a target list and then compiles for gfx906, and CMake 4.3 refuses
    HIPCXX=hipcc."""
    env = {"HIP_PLATFORM": "amd", "ROCM_PATH": "/usr", "HIP_PATH": "/usr",
           "HIP_DEVICE_LIB_PATH": "/usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode",
           "HIPCXX": "/usr/lib/llvm-21/bin/clang++"}
    configure = ["cmake", "-S", oct_tree, "-G", "Ninja", "-DGGML_HIP=ON", "-DLLAMA_OPENSSL=OFF"]
    inside(sid, work, *configure, "-B", f"{sid_chroot.WORK}/trap-no-targets", env=env)
    ninja = (work / "trap-no-targets" / "build.ninja").read_text()
    assert set(re.findall(r"--offload-arch=(gfx\w+)", ninja)) == {"gfx906"}
    res = sid_chroot.run(sid, [*configure, "-B", f"{sid_chroot.WORK}/trap-hipcc",
                               "-DGPU_TARGETS=gfx1151"], work=work,
                         env={**env, "HIPCXX": "/usr/bin/hipcc"})
    assert res.returncode != 0
    assert "HIPCXX environment variable is set to the hipcc wrapper" in res.stdout + res.stderr


def test_llama_cpp_oct_2026_hip_gfx1151(sid, work):
    sdist = llama_trees.sdist(LLAMA)
    prefix = f"{sid_chroot.WORK}/llama-hip"
    rocforge(sid, work, "build", "llama-cpp", "--target", "gfx1151", "--backend", "hip",
             "--source", f"/sdists/{sdist.name}", "--build-target", "llama-bench",
             "--prefix", prefix, "--jobs", JOBS, binds={"/sdists": sdist.parent}, timeout=3600)
    out = host(work, prefix)
    manifest = tomllib.loads((out / "rocforge-manifest.toml").read_text())
    configure = manifest["flags"]["configure"]
    # the trap: 0.3.36 reads GPU_TARGETS (AMDGPU_TARGETS is ignored -> gfx906 by default)
    assert "-DGPU_TARGETS=gfx1151" in configure
    assert not any(a.startswith("-DAMDGPU_TARGETS") for a in configure)
    # the other trap: CMake 4 rejects HIPCXX=hipcc; the LLVM's clang++ compiles HIP
    assert re.fullmatch(r"/usr/lib/llvm-21/bin/clang\+\+", manifest["env"].get("HIPCXX", ""))
    # no patch: the only llama.cpp patch (the rocWMMA stub) is for the rocwmma backend
    assert [p["status"] for p in manifest["patches"]] == ["not needed"]
    lib = out / "lib" / "libggml-hip.so"
    targets = ob.device_targets(lib)
    assert set(targets) == {"hipv4-amdgcn-amd-amdhsa--gfx1151"}, targets
    assert targets["hipv4-amdgcn-amd-amdhsa--gfx1151"] > 50  # one per HIP translation unit
    # RDNA3 WMMA in the device code (the mmq/mmf paths), read from the code objects themselves
    wmma = 0
    for i, (_, blob) in enumerate(ob.code_objects(lib)):
        (work / f"ggml-co-{i}").write_bytes(blob)
    asm = inside(sid, work, "sh", "-c", f"llvm-objdump-21 -d {sid_chroot.WORK}/ggml-co-*")
    wmma = len(re.findall(r"\bv_wmma_\w+", asm))
    assert wmma > 0
    assert "v_mfma" not in asm  # CDNA matrix instructions would mean a wrong target
    assert (out / "bin" / "llama-bench").is_file()
