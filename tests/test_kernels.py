"""rocforge's own kernels: target refusal, the Q4_0 format, the bench runner's checks, and (slow)
real compiles with Debian's ROCm 5.2 clang for gfx1030 (wave32) and gfx90a (wave64)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rocforge_build import cli
from rocforge_build.errors import UsageError
from rocforge_build.kernels import reference, runner
from rocforge_build.rootfs import Root

DATA = Path(__file__).parent / "data"
DEBIAN_CLANG = shutil.which("clang++-15")
needs_debian_hip = pytest.mark.skipif(
    DEBIAN_CLANG is None or not Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode").is_dir(),
    reason="needs Debian's hipcc packages (clang-15, rocm-device-libs): see .ci/apt-packages.txt",
)


def rocforge(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- targets and toolchains ------------------------------------------------------------------


def test_the_sources_named_in_the_table_ship_with_the_package():
    names = runner.table()["sources"]
    assert runner.table()["main_source"] in names
    for name in names:
        assert (runner.SOURCE_DIR / name).is_file(), name
    text = (runner.SOURCE_DIR / "harness.hip").read_text()
    for name in names[1:]:
        if name != "rf_portability.h":
            assert f'#include "{name}"' in text


def test_platform_comes_from_the_target_name():
    assert runner.platform_of("gfx1151") == "amd"
    assert runner.platform_of("gfx90a") == "amd"
    assert runner.platform_of("sm_90") == "cuda"
    with pytest.raises(UsageError):
        runner.platform_of("rtx4090")


@needs_debian_hip
def test_processors_are_asked_from_the_compiler():
    tc = runner.find_toolchain(Root("/"), "gfx1030", rocm="/usr")
    assert {"gfx1030", "gfx90a", "gfx1100"} <= set(tc.processors)
    assert "gfx1151" not in tc.processors  # clang 15 predates Strix Halo
    assert tc.device_libs and (tc.device_libs / "ocml.bc").is_file()


@needs_debian_hip
def test_gfx1151_is_refused_up_front_with_the_reason(capsys, tmp_path):
    out = tmp_path / "k"
    code, _, err = rocforge(capsys, "kernels", "build", "--target", "gfx1151", "--rocm", "/usr",
                            "--out", str(out))
    assert code == 5
    assert "cannot compile for gfx1151" in err and "does not know that processor" in err
    assert "clang version 15" in err and "hint:" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@needs_debian_hip
def test_a_target_without_device_libraries_is_refused(capsys, tmp_path):
    # clang 15 knows gfx1100, but ROCm 5.2's device libraries have no gfx1100 ISA bitcode
    code, _, err = rocforge(capsys, "kernels", "build", "--target", "gfx1100", "--rocm", "/usr",
                            "--out", str(tmp_path / "k"))
    assert code == 5
    assert "oclc_isa_version_1100.bc" in err
    assert list(tmp_path.iterdir()) == []


def test_the_detected_gpu_and_the_resolved_rocm_are_used(capsys, tmp_path):
    """No --target: the GPU in the root (a Strix Halo) decides; the compiler is the resolved
    TheRock tree's, asked for its processors (a fixture stub that knows none: refused)."""
    from fixtures_roots import make_strix_halo

    root = tmp_path / "root"
    make_strix_halo(root)
    code, _, err = rocforge(capsys, "--root", str(root), "kernels", "build",
                            "--out", str(tmp_path / "out"))
    assert code == 5
    assert "cannot compile for gfx1151" in err
    assert str(root / "opt/rocm/lib/llvm/bin/clang++") in err and "(therock)" in err
    assert not (tmp_path / "out").exists()


def test_unknown_gfx_name_is_a_usage_error(capsys, tmp_path):
    code, _, err = rocforge(capsys, "kernels", "build", "--target", "gfx1152x", "--out",
                            str(tmp_path / "k"))
    assert code == 2


def test_bench_without_a_build_says_how_to_build(capsys, tmp_path):
    code, _, err = rocforge(capsys, "kernels", "bench", "--out", str(tmp_path / "none"))
    assert code == 2
    assert "rocforge kernels build" in err


# -- the Q4_0 format -------------------------------------------------------------------------


def test_q4_0_block_layout_is_ggml():
    raw = bytearray(18)
    raw[0:2] = np.float16(0.5).tobytes()
    raw[2] = 0x8F  # weight 0: low nibble 15 -> (15-8)*0.5; weight 16: high nibble 8 -> 0
    raw[3] = 0x10  # weight 1: 0 -> -4.0; weight 17: 1 -> -3.5
    for j in range(2, 16):
        raw[2 + j] = 0x88
    block = np.frombuffer(bytes(raw), dtype=reference.BLOCK_Q4_0)
    w = reference.dequantize_q4_0(block[None, :])[0]
    assert w.shape == (32,)
    assert (w[0], w[16], w[1], w[17]) == (3.5, 0.0, -4.0, -3.5)
    assert not np.any(w[[*range(2, 16), *range(18, 32)]])


def test_q4_0_quantize_round_trip_is_within_a_step():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 128)).astype(np.float32)
    blocks = reference.quantize_q4_0(w)
    assert blocks.shape == (3, 4) and blocks.dtype.itemsize == 18
    back = reference.dequantize_q4_0(blocks)
    step = np.abs(blocks["d"].astype(np.float32)).repeat(32, axis=1)
    err = np.abs(back - w)
    # round to nearest (half a step), except values past +7 steps: q4_0 spans -8..+7
    assert np.all(err <= step * 1.001 + 1e-6)
    assert np.mean(err <= 0.5 * step * 1.001 + 1e-6) > 0.95


def test_x_is_quantized_to_8_bits_per_block_as_on_the_gpu():
    x = np.zeros(64, dtype=np.float32)
    x[0], x[1], x[2], x[3] = 2.54, -2.54, 0.01, 0.03  # d = 0.02: 127, -127, 0.5 -> 0, 1.5 -> 2
    x[32] = -1.0
    xq, dx = reference.quantize_q8(x)
    assert dx.dtype == np.float32 and dx[0] == np.float32(2.54) / np.float32(127)
    assert list(xq[0, :4]) == [127, -127, 0, 2]  # rint: ties to even, like rintf
    assert xq[1, 0] == -127 and not xq[1, 1:].any()


def test_the_gemv_check_catches_swapped_nibbles():
    rng = np.random.default_rng(2)
    case = reference.make_case({"kernel": "q4_0_gemv", "m": 64, "k": 256}, rng)
    blocks = case.inputs["w"]
    xq, dx = reference.quantize_q8(case.inputs["x"])
    x = (xq.astype(np.float64) * dx[:, None]).reshape(-1)
    right = reference.dequantize_q4_0(blocks).astype(np.float64) @ x
    assert case.check(right.astype(np.float32)) <= 1.0
    swapped = blocks.copy()
    swapped["qs"] = (blocks["qs"] >> 4) | (blocks["qs"] << 4)
    wrong = reference.dequantize_q4_0(swapped).astype(np.float64) @ x
    assert case.check(wrong.astype(np.float32)) > 100.0


# -- the bench runner, with a NumPy stand-in for the compiled harness ------------------------


def _fake_build(tmp_path: Path, target: str = "gfx1151") -> Path:
    out = tmp_path / "build"
    out.mkdir()
    exe = out / "rocforge-kernels"
    exe.write_text(f"#!{sys.executable}\n" + (DATA / "fake_kernel_harness.py").read_text())
    exe.chmod(0o755)
    (out / runner.MANIFEST).write_text(json.dumps(
        {"target": target, "platform": "amd", "binary": str(exe)}))
    return out


def test_bench_checks_every_kernel_and_reports_against_peak_and_memcpy(capsys, tmp_path):
    out = _fake_build(tmp_path)
    code, stdout, err = rocforge(capsys, "kernels", "bench", "--out", str(out), "--quick",
                                 "--iters", "2", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["passed"] and report["peak_bandwidth_gbs"] == 256
    by = {r["kernel"]: r for r in report["results"]}
    assert list(by) == ["memcpy", "copy", "triad", "q4_0_gemv", "gemm_f16"]
    assert all(r["passed"] for r in by.values())
    n = by["copy"]["shape"]["n"]
    gbs = 2 * 4 * n / (by["copy"]["ms_median"] * 1e-3) / 1e9
    assert by["copy"]["gbs"] == pytest.approx(gbs)
    assert by["copy"]["pct_peak"] == pytest.approx(100 * gbs / 256)
    assert by["copy"]["pct_copy"] == pytest.approx(100 * gbs / by["memcpy"]["gbs"])
    g = by["gemm_f16"]
    assert g["tflops"] == pytest.approx(2 * 256**3 / (g["ms_median"] * 1e-3) / 1e12)
    assert g["pct_peak"] == pytest.approx(100 * g["tflops"] / 59.4)


@pytest.mark.parametrize("broken", ["copy", "triad", "q4_0_gemv", "gemm_f16"])
def test_bench_fails_a_wrong_result(capsys, tmp_path, monkeypatch, broken):
    out = _fake_build(tmp_path)
    monkeypatch.setenv("FAKE_HARNESS_BREAK", broken)
    code, stdout, _ = rocforge(capsys, "kernels", "bench", "--out", str(out), "--quick",
                               "--iters", "1", "--json", "--only", broken)
    assert code == 1
    results = {r["kernel"]: r for r in json.loads(stdout)["results"]}
    assert results["memcpy"]["passed"] and not results[broken]["passed"]


def test_a_build_for_another_gpu_is_not_run(capsys, tmp_path, monkeypatch):
    out = _fake_build(tmp_path, target="gfx1151")
    monkeypatch.setenv("FAKE_HARNESS_ARCH", "gfx1100")
    code, _, err = rocforge(capsys, "kernels", "bench", "--out", str(out), "--quick")
    assert code == 2
    assert "built for gfx1151" in err and "gfx1100" in err
    assert "rocforge kernels build --target gfx1100" in err


def test_a_harness_error_becomes_a_clear_message(capsys, tmp_path):
    out = _fake_build(tmp_path)
    exe = out / "rocforge-kernels"
    exe.write_text("#!/bin/sh\necho '{\"ok\": false, \"error\": \"hipGetDeviceCount: no ROCm-capable"
                   " device is detected\"}'\nexit 2\n")
    code, _, err = rocforge(capsys, "kernels", "bench", "--out", str(out), "--quick")
    assert code == 1
    assert "no ROCm-capable device" in err and "Traceback" not in err


# -- real compiles (CI: Debian's hipcc, ROCm 5.2) --------------------------------------------


def _tool(name: str) -> str:
    found = shutil.which(f"{name}-15") or shutil.which(name)
    assert found, f"{name} is part of Debian's llvm-15/clang-15 (hipcc depends on them)"
    return found


@pytest.mark.slow
@needs_debian_hip
@pytest.mark.parametrize(("target", "wave"), [("gfx1030", 32), ("gfx90a", 64)])
def test_real_build_names_its_target(capsys, tmp_path, target, wave):
    out = tmp_path / target
    code, stdout, err = rocforge(capsys, "kernels", "build", "--target", target, "--rocm", "/usr",
                                 "--out", str(out), "--json")
    assert code == 0, err
    result = json.loads(stdout)
    exe, co = Path(result["binary"]), Path(result["code_object"])
    assert exe.is_file() and co.is_file()
    assert {p.name for p in out.iterdir()} == {exe.name, co.name, runner.MANIFEST}
    # independent of rocforge: the bundle in the executable and the code object's own note
    fat = tmp_path / "fatbin"
    subprocess.run([_tool("llvm-objcopy"), f"--dump-section=.hip_fatbin={fat}", str(exe)],
                   check=True)
    listed = subprocess.run([_tool("clang-offload-bundler"), "--list", "--type=o",
                             f"--input={fat}"], check=True, capture_output=True, text=True).stdout
    assert f"hipv4-amdgcn-amd-amdhsa--{target}" in listed.split()
    notes = subprocess.run([_tool("llvm-readelf"), "--notes", str(co)], check=True,
                           capture_output=True, text=True).stdout
    assert re.search(rf"amdhsa\.target:\s+'?amdgcn-amd-amdhsa--{target}'?\s", notes)
    for name in ("rf_copy_kernel", "rf_triad_kernel", "rf_q4_0_gemv_kernel", "rf_gemm_f16_kernel"):
        assert name in notes
    assert set(re.findall(r"\.wavefront_size:\s+(\d+)", notes)) == {str(wave)}
    assert set(result["wave_sizes"].values()) == {wave}


@pytest.mark.slow
@needs_debian_hip
def test_wmma_path_compiles_for_gfx11(tmp_path):
    """clang 15 knows gfx1100's WMMA builtins (ROCm 5.2 lacks only its device libraries): the
    GEMM's gfx11 path must compile to v_wmma instructions, the fallback must not use them."""
    src = runner.SOURCE_DIR / "harness.hip"

    def device_asm(arch: str) -> str:
        asm = tmp_path / f"{arch}.s"
        subprocess.run([DEBIAN_CLANG, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only",
                        "-nogpulib", "-O3", "-std=c++17", "--rocm-path=/usr", "-S", "-o", str(asm),
                        str(src)], check=True)
        return asm.read_text()

    gemm = re.compile(r"^_Z18rf_gemm_f16_kernel.*?s_endpgm", re.S | re.M)
    wmma = gemm.search(device_asm("gfx1100")).group(0)
    assert wmma.count("v_wmma_f32_16x16x16_f16") >= 2
    assert "v_wmma" not in gemm.search(device_asm("gfx1030")).group(0)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="[optional] the CUDA path needs nvcc (CUDA is not in .ci/apt-packages.txt)")
def test_cuda_path_builds_with_nvcc(capsys, tmp_path):
    code, stdout, err = rocforge(capsys, "kernels", "build", "--target", "sm_90", "--out",
                                 str(tmp_path / "sm90"), "--json")
    assert code == 0, err
    assert Path(json.loads(stdout)["binary"]).is_file()
