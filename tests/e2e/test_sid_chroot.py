"""Real HIP compiles with today's Debian ROCm (sid: hipcc 7.0.2, HIP 6.4.3, LLVM 21, rocBLAS
6.4.4), rocforge running inside a sid chroot (tests/sid_chroot.py) with no patch and no
environment variable from the user (slow; CI runs them as root).

- `rocforge build llama-cpp --target gfx1151 --backend hip` on the Oct 2026 tree (llama-cpp-python
  0.3.36), llama-bench only: its libggml-hip.so must hold gfx1151 code objects only (without
  -DGPU_TARGETS this tree's configure succeeds and builds gfx906) with RDNA3 WMMA instructions;
- `rocforge kernels build --target gfx1151` / `gfx1100`: the FP16 GEMM uses v_wmma_f32_16x16x16_f16;
- the fixture recipe's `hip` backend: a real .hip source through CMake's HIP language;
- that llama.cpp build (one session fixture for both tests) packed by `rocforge bundle --target
  gfx1151`, checked, unpacked elsewhere by tar: gfx1151 device code only, Debian's ROCm libraries
  inside with $ORIGIN RUNPATHs, rocBLAS's kernel files cut to gfx1100's (sid's rocBLAS has no
  gfx1151 files) with HSA_OVERRIDE_GFX_VERSION=11.0.0 in the launcher, and `llama-bench --help`
  starting through the launcher with the system's copies of those libraries masked.

Measured wall times (2 cores) are in docs/measurements/builds.md ("Debian sid's ROCm in a
chroot").  The compiler cache for the chroot lives next to it (sid_chroot.ccache_dir()), so a warm CI machine reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
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


@pytest.fixture(scope="session")
def llama_hip(sid, work):
    """`rocforge build llama-cpp --target gfx1151 --backend hip` of the Oct 2026 tree (llama-bench
    only), made once per session: the build test reads it, the bundle test packs it. Its prefix
    inside the chroot."""
    sdist = llama_trees.sdist(LLAMA)
    prefix = f"{sid_chroot.WORK}/llama-hip"
    rocforge(sid, work, "build", "llama-cpp", "--target", "gfx1151", "--backend", "hip",
             "--source", f"/sdists/{sdist.name}", "--cmake-target", "llama-bench",
             "--prefix", prefix, "--jobs", JOBS, binds={"/sdists": sdist.parent}, timeout=3600)
    return prefix


def test_llama_cpp_oct_2026_hip_gfx1151(sid, work, llama_hip):
    out = host(work, llama_hip)
    manifest = tomllib.loads((out / "rocforge-manifest.toml").read_text())
    configure = manifest["flags"]["configure"]
    # the trap: 0.3.36 reads GPU_TARGETS (AMDGPU_TARGETS is ignored -> gfx906 by default)
    assert "-DGPU_TARGETS=gfx1151" in configure
    assert not any(a.startswith("-DAMDGPU_TARGETS") for a in configure)
    # the other trap: CMake 4 rejects HIPCXX=hipcc; the LLVM's clang++ compiles HIP
    assert re.fullmatch(r"/usr/lib/llvm-21/bin/clang\+\+", manifest["env"].get("HIPCXX", ""))
    # no patch: the rocWMMA stub is for the rocwmma backend, the coopmat guard for vulkan
    assert {p["name"]: p["status"] for p in manifest["patches"]} == {
        "gfx1151-fattn-wmma-stub.patch": "not needed", "vulkan-coopmat-glslc-guard.patch": "not needed"}
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


# -- the HIP build bundled: gfx1151's files only, ROCm inside, found from anywhere ----------------
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# glibc stays with the system by design: every program names the loader by absolute path
# (PT_INTERP /lib64/ld-linux-x86-64.so.2) and libc must be the one that loader belongs to
GLIBC = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2",
         "librt.so.1", "libmvec.so.1", "linux-vdso.so.1"}
ROCM = ("libamdhip64.so", "libhsa-runtime64.so", "librocblas.so", "libhipblas.so")
CLEAN = ("/usr/bin/env", "-i", "PATH=/usr/bin:/bin")  # no LD_LIBRARY_PATH, no ROCm variable


def ldd_paths(text: str) -> dict[str, str]:
    """ldd's answer: soname -> the path it resolved to (or "not found")."""
    out = {}
    for line in text.splitlines():
        if m := re.match(r"\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", line):
            out[m.group(1)] = m.group(2)
        elif m := re.match(r"\s*(/\S+) \(0x[0-9a-f]+\)$", line):
            out[os.path.basename(m.group(1))] = m.group(1)
    return out


def dynamic(sid, work, path: str) -> tuple[list[str], list[str]]:
    """(NEEDED, RUNPATH entries) of an ELF file, as readelf -d (binutils, in the chroot) reads them."""
    text = inside(sid, work, "readelf", "-d", path)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", text)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.+?)\]", text)
    return needed, runpath[0].split(":") if runpath else []


def test_llama_hip_bundle_gfx1151_carries_rocm_and_gfx1100_rocblas_files(sid, work, llama_hip):
    # the evidence for the rocBLAS decision, read from the installed librocblas4 itself: Debian
    # sid's rocBLAS 6.4.4 ships Tensile files for gfx1100 (and other targets) but none for gfx1151,
    # so a gfx1151 process needs HSA_OVERRIDE_GFX_VERSION=11.0.0 (gfx1100's GFX version, major
    # 11, minor 0, stepping 0) for rocBLAS to load the gfx1100 files
    system_lib = sid / LIBDIR.lstrip("/")
    [rocblas_dir] = (system_lib / "rocblas").glob("*/library")
    names = sorted(p.name for p in rocblas_dir.iterdir())
    assert not [n for n in names if "gfx1151" in n]
    gfx1100 = {n for n in names if re.search(r"gfx1100(?![0-9a-f])", n)}
    shared = {n for n in names if "gfx" not in n}  # the *_fallback.dat files name no GPU
    assert gfx1100 and shared and len(gfx1100 | shared) < len(names)

    out = f"{sid_chroot.WORK}/bundles/llama-gfx1151.tar.gz"
    inside(sid, work, "mkdir", "-p", f"{sid_chroot.WORK}/bundles", f"{sid_chroot.WORK}/elsewhere")
    start = time.monotonic()
    made = json.loads(rocforge(sid, work, "bundle", llama_hip, "--target", "gfx1151", "--out", out,
                               "--json"))
    seconds = time.monotonic() - start
    check = rocforge(sid, work, "bundle", "check", out)
    assert "every sha256 matches" in check
    # unpacked by tar, not by rocforge, into another directory
    inside(sid, work, "tar", "-xzf", out, "-C", f"{sid_chroot.WORK}/elsewhere")
    name = made["name"]
    b_in = f"{sid_chroot.WORK}/elsewhere/{name}"
    b = host(work, b_in)
    meta = tomllib.loads((b / "bundle.toml").read_text())
    assert meta["bundle"]["gpu"] == "gfx1151" and meta["bundle"]["target"] == "gfx1151"
    assert meta["bundle"]["kernel_targets"] == ["gfx1100", "gfx1151"]
    listed = {f["path"]: f for f in meta["file"]}
    ggml = b / "lib" / "libggml-hip.so"  # -> libggml-hip.so.0 -> libggml-hip.so.0.25.3 (say)
    assert listed["lib/libggml-hip.so"] == {"path": "lib/libggml-hip.so", "link": "libggml-hip.so.0"}
    real = ggml.resolve().relative_to(b).as_posix()
    assert listed[real]["sha256"] == hashlib.sha256(ggml.read_bytes()).hexdigest()
    on_disk = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file() or p.is_symlink()}
    assert on_disk - {"bundle.toml"} == set(listed)

    # the device code: gfx1151 only
    assert set(ob.device_targets(ggml)) == {"hipv4-amdgcn-amd-amdhsa--gfx1151"}

    # the ROCm libraries the build NEEDs, inside, each with $ORIGIN-relative RUNPATHs only
    needed, _ = dynamic(sid, work, f"{b_in}/lib/libggml-hip.so")
    rocm_needed = [n for n in needed if n.startswith(ROCM)]
    assert {n.split(".so")[0] for n in rocm_needed} == {"libamdhip64", "librocblas", "libhipblas"}
    hip = next(n for n in rocm_needed if n.startswith("libamdhip64"))
    rocm_needed += [n for n in dynamic(sid, work, f"{b_in}/lib/{hip}")[0] if n.startswith("libhsa-runtime64")]
    assert any(n.startswith("libhsa-runtime64") for n in rocm_needed), "HIP needs the HSA runtime"
    for lib in [*(f"lib/{n}" for n in rocm_needed), "lib/libggml-hip.so", "bin/llama-bench"]:
        assert (b / lib).exists(), lib
        _, runpath = dynamic(sid, work, f"{b_in}/{lib}")
        assert runpath and all(e.startswith("$ORIGIN") for e in runpath), (lib, runpath)

    # rocBLAS's kernel directory: exactly gfx1100's files and the shared ones
    [kept_dir] = (b / "lib" / "rocblas").glob("*/library")
    assert {p.name for p in kept_dir.iterdir()} == gfx1100 | shared
    decided = {d["key"]: d["value"] for d in meta["decisions"]}
    assert decided["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    launched = inside(sid, work, f"{b_in}/run", "/bin/sh", "-c", 'echo "$HSA_OVERRIDE_GFX_VERSION"')
    assert launched.strip() == "11.0.0"

    # every library resolves into the bundle (glibc excepted), in a clean environment
    for elf in ("bin/llama-bench", "lib/libggml-hip.so"):
        resolved = ldd_paths(inside(sid, work, *CLEAN, "/usr/bin/ldd", f"{b_in}/{elf}"))
        assert set(rocm_needed) <= set(resolved), resolved  # ldd lists the whole closure
        outside = {k: v for k, v in resolved.items()
                   if k not in GLIBC and not v.startswith(b_in + "/")}
        assert not outside, outside

    # and the program starts with the system's copies of everything the bundle carries masked
    # (a /dev/null over each library file, an empty tmpfs over rocBLAS's kernel directory)
    carried = {p.name for p in (b / "lib").iterdir()}
    hide = sorted({"/" + os.path.relpath(os.path.realpath(p), sid) for p in system_lib.iterdir()
                   if p.name in carried and p.name not in GLIBC and p.is_file()})
    hide.append(LIBDIR + "/rocblas")
    assert any("libamdhip64" in h for h in hide) and any("librocblas" in h for h in hide)
    masked = sid_chroot.run(sid, [*CLEAN, f"{b_in}/run", "llama-bench", "--help"],
                            work=work, hide=hide)
    assert masked.returncode == 0, masked.stderr[-3000:]
    assert "usage:" in masked.stdout and "--model" in masked.stdout
    # the masking is real: the build's own llama-bench, which uses the system's ROCm, cannot start
    own = sid_chroot.run(sid, [f"{llama_hip}/bin/llama-bench", "--help"], work=work, hide=hide)
    assert own.returncode != 0 and "error while loading shared libraries" in own.stderr, own.stderr

    # sizes for docs/measurements/bundles.md ("A real HIP bundle"): the bundle vs the prefix + the
    # all-targets system files it came from
    mib = 1 << 20
    libs = sum(os.path.getsize(sid / h.lstrip("/")) for h in hide[:-1])
    full = sum(p.stat().st_size for p in rocblas_dir.iterdir())
    kept = sum(p.stat().st_size for p in kept_dir.iterdir())
    prefix = sum(p.stat().st_size for p in host(work, llama_hip).rglob("*") if p.is_file() and not p.is_symlink())
    print(f"\nbundle {name} made in {seconds:.0f} s: {made['files']} files, {made['bytes'] / mib:.1f} MiB "
          f"unpacked, {made['archive_bytes'] / mib:.1f} MiB .tar.gz; from: prefix {prefix / mib:.1f} MiB + "
          f"system libraries {libs / mib:.1f} MiB + rocBLAS kernel dir {full / mib:.1f} MiB "
          f"(kept {kept / mib:.1f} MiB, {len(gfx1100 | shared)} of {len(names)} files)")
