"""doctor/env on Debian's real ROCm packages (tests/data/realroots, made by its regenerate.py
from the named package versions), with KFD topologies of real GPUs.

Each test states the right answer and where it comes from: the packages' own files (listed in
the comments as `dpkg-deb -c` / `readelf -d` / `strings` show them), not rocforge's tables.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import fixtures_roots as fr
import pytest
from test_commands_env import cli

from rocforge_build.discover import installs, resolver
from rocforge_build.rootfs import Root

REAL = Path(__file__).parent / "data" / "realroots"


@pytest.fixture(scope="session")
def _copies(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(stack: str) -> Path:
        if stack not in made:
            dest = tmp_path_factory.mktemp(stack) / "root"
            shutil.copytree(REAL / stack, dest, symlinks=True)
            fr.make_system(dest)
            made[stack] = dest
        return made[stack]
    return get


@pytest.fixture
def machine(_copies):
    """machine(stack, *gpu_specs) -> root: the real stack with these GPUs in its KFD topology."""
    def make(stack: str, *gpus: dict) -> Path:
        root = _copies(stack)
        shutil.rmtree(root / "sys", ignore_errors=True)
        fr.make_gpus(root, *gpus)
        return root
    return make


def resolve(root: Path, **kw) -> resolver.Resolution:
    return resolver.resolve(Root(root), environ={}, **kw)


def doctor(root: Path, *args):
    out = cli(root, "doctor", "--json", *args)
    assert "Traceback" not in out.stderr
    return out.returncode, json.loads(out.stdout)


# -- the compiler: defects 1-3 -------------------------------------------------------------------
def test_sid_hipcc_gets_its_own_llvm_not_usr_bin(machine):
    # hipcc 7.0.2 is the C++ hipcc (an ELF); its strings hold `lib/llvm-21/bin` and `/clang++`:
    # it runs $HIP_CLANG_PATH/clang++. /usr/bin has clang++-21 and clang++-22 but no clang++;
    # /usr/lib/llvm-21/bin/clang++ -> clang (package clang-21).
    root = machine("sid", fr.STRIX_HALO)
    res = resolve(root)
    assert res.env["HIP_CLANG_PATH"] == "/usr/lib/llvm-21/bin"
    assert "C++ hipcc" in res.decision("HIP_CLANG_PATH").reason
    assert not (root / "usr/bin/clang++").exists()
    assert (root / "usr/lib/llvm-21/bin/clang++").is_symlink()


def test_sid_device_libs_and_the_llvm_that_owns_them(machine):
    # rocm-device-libs-21 ships usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode/oclc_isa_version_*.bc;
    # clang-22 (1:22.1.8-3) is installed too, with no device libraries: the compiler must be
    # LLVM 21 (the one hipcc depends on: `Depends: clang-21, rocm-device-libs-21`).
    root = machine("sid", fr.STRIX_HALO)
    inst = installs.inspect(Root(root), "/usr")
    assert inst.version == "6.4.3"  # libamdhip64-dev 6.4.3-5
    assert inst.bitcode_dir == "/usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode"
    assert inst.compiler_dir == "/usr/lib/llvm-21/bin"
    assert inst.hipcxx == "/usr/lib/llvm-21/bin/clang++"
    assert (root / "usr/lib/llvm-22/bin/clang++").is_symlink()  # the newer LLVM is there
    assert "gfx1151" in inst.coverage.bitcode  # oclc_isa_version_1151.bc
    assert not any("no device bitcode" in p for p in inst.problems)
    tool = resolve(root, target="gfx1151").toolchain_env()
    assert tool["HIPCXX"] == str(root / "usr/lib/llvm-21/bin/clang++")
    assert tool["HIP_DEVICE_LIB_PATH"] == str(root / "usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode")


def test_trixie_perl_hipcc_runs_clang_17_from_usr_bin(machine):
    # trixie's hipcc 5.7.1 is perl: hipcc.pl runs "$HIP_CLANG_PATH/clang++-17" and hipvars.pm
    # defaults HIP_CLANG_PATH to $ROCM_PATH/bin (no /usr/llvm/bin); /usr/bin/clang++-17 exists.
    # Device libs: rocm-device-libs-17 in usr/lib/llvm-17/lib/clang/17/amdgcn/bitcode.
    root = machine("trixie", fr.RX7900XTX)
    res = resolve(root)
    assert res.env["HIP_CLANG_PATH"] == "/usr/bin"
    assert "clang++-17" in res.decision("HIP_CLANG_PATH").reason
    assert res.env["HIP_DEVICE_LIB_PATH"] == "/usr/lib/llvm-17/lib/clang/17/amdgcn/bitcode"
    assert res.rocm.hipcxx == "/usr/lib/llvm-17/bin/clang++"
    assert res.rocm.version == "5.7.1"


def test_bookworm_perl_hipcc_runs_clang_15(machine):
    # bookworm: hipcc.pl runs "$HIP_CLANG_PATH/clang++-15"; rocm-device-libs 5.2.3 puts the
    # bitcode in the multiarch dir usr/lib/x86_64-linux-gnu/amdgcn/bitcode.
    root = machine("bookworm", fr.RX6800XT)
    res = resolve(root)
    assert res.env["HIP_CLANG_PATH"] == "/usr/bin"
    assert res.env["HIP_DEVICE_LIB_PATH"] == "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"
    assert res.rocm.hipcxx == "/usr/lib/llvm-15/bin/clang++"
    assert res.rocm.version == "5.2.3"


# -- runtime support: defect 4 -------------------------------------------------------------------
# `strings libhsa-runtime64.so.1.5.0` (libhsa-runtime64-1 5.2.3-3, bookworm) lists
# amdgcn-amd-amdhsa--gfx600 ... gfx90c and gfx1010-gfx1013, gfx1030-gfx1035: no gfx1036, no
# gfx11, no gfx12. ROCr 6.1.2 (trixie) adds gfx1036, gfx1100-gfx1103, gfx1150, gfx1151, gfx94x;
# ROCr 6.4.3 (sid) adds gfx1152, gfx1153, gfx1200, gfx1201, gfx950.

def test_bookworm_gfx1036_needs_the_gfx1030_override(machine):
    # clang-15's device libs have oclc_isa_version_1036.bc, but ROCr 5.2.3 cannot load gfx1036
    # code; it knows gfx1030, whose code gfx1036 runs as HSA_OVERRIDE_GFX_VERSION=10.3.0.
    root = machine("bookworm", fr.RAPHAEL_IGPU)
    assert (root / "usr/lib/x86_64-linux-gnu/amdgcn/bitcode/oclc_isa_version_1036.bc").exists()
    res = resolve(root)
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    assert res.target == "gfx1030"
    reason = res.decision("HSA_OVERRIDE_GFX_VERSION").reason
    assert "no ISA amdgcn-amd-amdhsa--gfx1036" in reason and "gfx1035" in reason
    assert "libhsa-runtime64.so.1" in reason


@pytest.mark.parametrize("spec,gfx", [(fr.STRIX_HALO, "gfx1151"), (fr.RX7900XTX, "gfx1100"),
                                      (fr.PHOENIX_IGPU, "gfx1103"), (fr.RX9070XT, "gfx1201")])
def test_bookworm_runtime_cannot_run_rdna3_or_rdna4(machine, spec, gfx):
    # Neither the GPU's ISA nor gfx1100 (the override target of gfx1151/gfx1103) is in ROCr
    # 5.2.3's table: nothing to run, no override.
    res = resolve(machine("bookworm", spec))
    assert res.target == gfx and not res.usable
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert f"no ISA amdgcn-amd-amdhsa--{gfx}" in res.decision("target").reason


@pytest.mark.parametrize("spec,gfx", [(fr.RX6800XT, "gfx1030"), (fr.RADEON_VII, "gfx906")])
def test_bookworm_runs_gfx1030_and_gfx906_natively(machine, spec, gfx):
    res = resolve(machine("bookworm", spec))
    assert res.target == gfx and res.usable
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None


# -- rocBLAS coverage (trixie 5.5.1, sid 6.4.4) ----------------------------------------------------
# trixie librocblas0 5.5.1: TensileLibrary_gfx{803,900,906,908,90a,1030,1100,1101,1102}.co;
# sid librocblas4 6.4.4: the same plus gfx1010, as TensileLibrary_*_<gfx>.{co,dat} — neither has
# gfx1103, gfx1151 or gfx12 kernels (the offload bundles in librocblas.so name the same list).

@pytest.mark.parametrize("stack", ["trixie", "sid", "sid-runtime"])
@pytest.mark.parametrize("spec,gfx", [(fr.STRIX_HALO, "gfx1151"), (fr.PHOENIX_IGPU, "gfx1103")])
def test_rdna3_igpus_run_gfx1100_rocblas_kernels(machine, stack, spec, gfx):
    res = resolve(machine(stack, spec))
    assert res.usable and res.target == "gfx1100"
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert f"rocBLAS has no TensileLibrary files for {gfx}" in res.decision("target").reason


@pytest.mark.parametrize("stack", ["trixie", "sid", "sid-runtime"])
@pytest.mark.parametrize("spec,gfx", [(fr.RX7900XTX, "gfx1100"), (fr.RX6800XT, "gfx1030"),
                                      (fr.RADEON_VII, "gfx906")])
def test_native_rocblas_targets(machine, stack, spec, gfx):
    res = resolve(machine(stack, spec))
    assert res.usable and res.target == gfx
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None


@pytest.mark.parametrize("stack", ["trixie", "sid"])
def test_gfx1201_is_not_served(machine, stack):
    # trixie: ROCr 6.1.2 has no gfx1201; sid: ROCr 6.4.3 has it, rocBLAS 6.4.4 has no gfx1201
    # kernels and RDNA4 has no older target to override to.
    res = resolve(machine(stack, fr.RX9070XT))
    assert not res.usable and res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    expect = ("no ISA amdgcn-amd-amdhsa--gfx1201" if stack == "trixie"
              else "rocBLAS has no TensileLibrary files for gfx1201")
    assert expect in res.decision("target").reason


# -- ROCBLAS_USE_HIPBLASLT: defect 6 -------------------------------------------------------------
def test_sid_rocblas_built_without_hipblaslt(machine):
    # sid ships hipBLASLt 7.1.1 with gfx1100 kernels, but `readelf -d librocblas.so.4.4` NEEDs
    # libroctx64.so.4, libamdhip64.so.6, libstdc++, libm, libgcc_s, libc, ld-linux: no
    # libhipblaslt (Debian changelog: "Disable hipBLASlt support until it is packaged").
    res = resolve(machine("sid", fr.RX7900XTX))
    assert res.rocm.coverage.hipblaslt_for("gfx1100")
    assert res.env["ROCBLAS_USE_HIPBLASLT"] is None
    reason = res.decision("ROCBLAS_USE_HIPBLASLT").reason
    assert "built without hipBLASLt" in reason and "libroctx64.so.4" in reason


def test_llama_plan_on_sid_does_not_claim_rocblas_use_hipblaslt(machine, tmp_path):
    """The build plan follows the same ELF NEEDED evidence: on sid's rocBLAS (no libhipblaslt)
    `rocforge build llama-cpp --target gfx1151` records no ROCBLAS_USE_HIPBLASLT and says why."""
    from llama_trees import tree

    from rocforge_build.forge.plan import Request, plan_for

    root = machine("sid", fr.RX7900XTX)
    hip_h = root / "usr/include/hip/hip_runtime.h"  # trimmed to its name: the recipe greps it
    hip_h.write_text("// hip runtime (trimmed in the fixture)\n")
    try:
        plan = plan_for(Request(recipe="llama-cpp", target="gfx1151", backend="hip",
                                 source=str(tree("0.3.9", tmp_path / "llama")),
                                 environ={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}), Root(root))
    finally:
        hip_h.write_text("")
    assert plan.toolchain.missing is None
    assert "ROCBLAS_USE_HIPBLASLT" not in plan.runtime_env
    (note,) = [n for n in plan.notes if "ROCBLAS_USE_HIPBLASLT" in n]
    assert "rocBLAS was built without hipBLASLt" in note


# -- runtime-only installs: defect 5 ---------------------------------------------------------------
def test_runtime_only_install_has_a_version_and_no_compiler(machine):
    # libamdhip64-6 6.4.3-5 + libhsa-runtime64-1 + librocblas4 + libhipblaslt1, no -dev, no
    # hipcc, no rocm-device-libs; an unrelated clang-22 is installed.
    root = machine("sid-runtime", fr.RX7900XTX)
    res = resolve(root)
    assert res.rocm.version == "6.4.3"
    for var in ("HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH"):
        assert var not in res.env
    assert res.rocm.hipcxx is None and res.rocm.compiler_dir is None
    assert "HIPCXX" not in res.toolchain_env()
    assert res.usable


# -- iGPU + dGPU: defect 7 -----------------------------------------------------------------------
def test_bookworm_serves_only_the_igpu_and_says_so(machine):
    # Raphael gfx1036 (2 CUs) + RX 7900 XTX gfx1100 (96 CUs): ROCr 5.2.3 runs the iGPU through
    # the gfx1030 override, and cannot run the dGPU at all.
    root = machine("bookworm", fr.RX7900XTX, fr.RAPHAEL_IGPU)
    code, data = doctor(root)
    assert code == 1 and not data["usable"]
    assert data["env"]["ROCR_VISIBLE_DEVICES"] == "1"
    assert data["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    blocker = next(b for b in data["blockers"] if "NOT served" in b)
    assert "gfx1100" in blocker and "rocforge nightly install --target gfx1100" in blocker
    assert blocker in data["warnings"]


@pytest.mark.parametrize("stack", ["trixie", "sid"])
def test_dgpu_served_masks_the_igpu_without_blocker(machine, stack):
    root = machine(stack, fr.RX7900XTX, fr.RAPHAEL_IGPU)
    code, data = doctor(root)
    assert code == 0 and data["target"] == "gfx1100"
    assert data["env"]["ROCR_VISIBLE_DEVICES"] == "0"
    assert data["blockers"] == []


def test_strix_halo_on_sid_env_script(machine):
    # The whole environment a gfx1151 user on sid gets, as a script.
    out = cli(machine("sid", fr.STRIX_HALO), "env", "--shell", "bash")
    assert out.returncode == 0, out.stderr
    assert "export HIP_CLANG_PATH='/usr/lib/llvm-21/bin'" in out.stdout
    assert "export HIP_DEVICE_LIB_PATH='/usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode'" in out.stdout
    assert "export HSA_OVERRIDE_GFX_VERSION='11.0.0'" in out.stdout
    assert "unset ROCBLAS_USE_HIPBLASLT" in out.stdout


def test_sid_without_llvm_21_says_hipcc_cannot_compile(tmp_path):
    # Remove clang-21's files: hipcc 7.0.2 still runs $HIP_CLANG_PATH/clang++ from
    # /usr/lib/llvm-21/bin, and clang-22 does not stand in for it.
    root = tmp_path / "root"
    shutil.copytree(REAL / "sid" / "usr", root / "usr", symlinks=True,
                    ignore=shutil.ignore_patterns("rocblas", "hipblaslt"))
    shutil.rmtree(root / "usr/lib/llvm-21/bin")
    inst = installs.inspect(Root(root), "/usr")
    assert inst.hip_clang_path is None and inst.compiler_dir is None and inst.hipcxx is None
    assert any("clang++" in p and "cannot compile" in p for p in inst.problems)
    assert any("install clang-21" in p for p in inst.problems)


def test_trimmed_elf_files_are_real_elf(tmp_path):
    # regenerate.py writes small ELF files; binutils must read them like the originals.
    import subprocess
    import sys

    sys.path.insert(0, str(REAL))
    try:
        import regenerate
    finally:
        sys.path.remove(str(REAL))
    data = regenerate.small_elf("libx.so.1", ["libamdhip64.so.6", "libc.so.6"],
                                [b"amdgcn-amd-amdhsa--gfx1151", b"lib/llvm-21/bin"])
    path = tmp_path / "libx.so.1"
    path.write_bytes(data)
    readelf = shutil.which("readelf")
    if readelf:
        out = subprocess.run([readelf, "-dW", str(path)], capture_output=True, text=True).stdout
        assert "Shared library: [libamdhip64.so.6]" in out and "soname: [libx.so.1]" in out
    from rocforge_build.discover import binaries

    info = binaries.read_elf(path)
    assert info.needed == ("libamdhip64.so.6", "libc.so.6") and info.soname == "libx.so.1"
    assert binaries.isa_names(info.data) == ("gfx1151",)
