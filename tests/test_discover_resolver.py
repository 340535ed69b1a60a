import os

import fixtures_roots as fr
import pytest

from rocforge_build import paths
from rocforge_build.discover import resolver
from rocforge_build.errors import NoRocmError, UsageError
from rocforge_build.rootfs import Root

BASE = {"PATH": "/usr/bin:/bin"}


def resolve(root, environ=None, **kw):
    return resolver.resolve(Root(root), environ={**BASE, **(environ or {})}, **kw)


def test_strix_halo_native(tmp_path):
    fr.make_strix_halo(tmp_path)
    res = resolve(tmp_path)
    assert res.target == "gfx1151" and res.usable
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert res.env["ROCBLAS_USE_HIPBLASLT"] == "1"
    assert "ROCR_VISIBLE_DEVICES" not in res.env
    assert res.env["HIP_DEVICE_LIB_PATH"] == "/opt/rocm/lib/llvm/amdgcn/bitcode"
    assert res.env["HIP_CLANG_PATH"] == "/opt/rocm/lib/llvm/bin"
    assert res.env["PATH"] == "/opt/rocm/bin:/opt/rocm/lib/llvm/bin:/usr/bin:/bin"
    assert res.warnings == [
        "/opt/rocm: /opt/rocm/bin/amdclang++ is a broken link (TheRock trees before Mar 2026); "
        "using /opt/rocm/lib/llvm/bin"]
    assert "rocBLAS has TensileLibrary files for gfx1151" in res.decision("target").reason


def test_stale_override_is_unset_with_warning(tmp_path):
    fr.make_strix_halo(tmp_path)
    res = resolve(tmp_path, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0",
                             "HSA_OVERRIDE_GFX_VERSION_1": "11.0.0"})
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert res.env["HSA_OVERRIDE_GFX_VERSION_1"] is None
    stale = [w for w in res.warnings if w.startswith("stale")]
    assert len(stale) == 2 and "#115" in stale[0]


def test_override_when_only_the_fallback_target_has_kernels(tmp_path):
    # An early-2025 gfx110X tree on Strix Halo: gfx1100 kernels, none for gfx1151 (seed 004).
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_therock_tree(tmp_path, "6.4.0rc20250301", ("gfx1100", "gfx1101", "gfx1102"),
                         hipblaslt=("gfx1100",))
    res = resolve(tmp_path)
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert res.target == "gfx1100"  # the kernels that run
    assert res.env["ROCBLAS_USE_HIPBLASLT"] == "1"
    reason = res.decision("target").reason
    assert "no TensileLibrary files for gfx1151" in reason and "gfx1100" in reason


def test_matching_override_in_environment_is_kept_quietly(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_therock_tree(tmp_path, targets=("gfx1100",))
    res = resolve(tmp_path, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0" and not any("stale" in w for w in res.warnings)


def test_no_kernels_at_all(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_classic_rocm(tmp_path, rocblas=("gfx90a",), hipblaslt=())
    res = resolve(tmp_path)
    assert res.target == "gfx1151" and not res.usable
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert res.env["ROCBLAS_USE_HIPBLASLT"] is None
    assert any("nightly install --target gfx1151" in w for w in res.warnings)


def test_igpu_masked_beside_supported_dgpu(tmp_path):
    fr.make_igpu_dgpu(tmp_path)
    res = resolve(tmp_path, {"ROCBLAS_USE_HIPBLASLT": "1"})
    assert res.target == "gfx1100"
    assert res.env["ROCR_VISIBLE_DEVICES"] == "1"
    reason = res.decision("ROCR_VISIBLE_DEVICES").reason
    assert reason.startswith("masked gfx1036 igpu (node 1, 2 CUs)") and "#96" in reason
    assert [res.gpus[i].gfx for i in res.selected] == ["gfx1100"]
    assert res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert res.env["ROCBLAS_USE_HIPBLASLT"] == "1"
    assert any("iGPU and dGPU" in w for w in res.warnings)


def test_hipblaslt_missing_unsets_a_user_setting(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_therock_tree(tmp_path, targets=("gfx1151",), hipblaslt=())
    res = resolve(tmp_path, {"ROCBLAS_USE_HIPBLASLT": "1"})
    assert res.env["ROCBLAS_USE_HIPBLASLT"] is None
    assert any("ROCBLAS_USE_HIPBLASLT=1 in the environment is unset" in w for w in res.warnings)


def test_future_gpu_does_not_crash(tmp_path):
    fr.make_future_gpu(tmp_path, 130000)
    fr.make_therock_tree(tmp_path, targets=("gfx1201",))
    res = resolve(tmp_path)
    assert res.target == "gfx1300" and not res.usable
    assert any("gfx1300 is not in rocforge's target table" in w for w in res.warnings)
    assert "no override fallback known" in res.decision("target").reason
    res.to_json()


def test_future_gpu_served_by_a_newer_tree(tmp_path):
    fr.make_future_gpu(tmp_path, 130000)
    fr.make_therock_tree(tmp_path, targets=("gfx1300",))
    res = resolve(tmp_path)
    assert res.target == "gfx1300" and res.usable and res.env["ROCBLAS_USE_HIPBLASLT"] == "1"


def test_target_override_names_the_fallback(tmp_path):
    # seed 004: gfx1100 kernels on gfx1151 were a performance choice; --target asks for it.
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_therock_tree(tmp_path, targets=("gfx1100", "gfx1151"))
    res = resolve(tmp_path, target="gfx1100")
    assert res.target == "gfx1100" and res.env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert "override target" in res.decision("target").reason


def test_target_for_another_machine(tmp_path):
    fr.make_strix_halo(tmp_path)
    res = resolve(tmp_path, target="gfx942")
    assert res.target == "gfx942" and res.gpus[-1].source == "--target"
    assert "HSA_OVERRIDE_GFX_VERSION" in res.env and res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert any("matches no GPU here" in w for w in res.warnings)
    assert any("no TensileLibrary files for gfx942" in w for w in res.warnings)


def test_target_without_any_gpu(tmp_path):
    fr.make_therock_tree(tmp_path, targets=("gfx1151",))
    res = resolve(tmp_path, target="GFX1151")
    assert res.target == "gfx1151" and res.usable and res.gpus[0].source == "--target"
    assert not res.warnings[1:]  # only the broken-link note


def test_unknown_target():
    with pytest.raises(UsageError, match="unknown GPU target 'gfx1115'") as exc:
        resolver.resolve(Root("/nonexistent-root-is-not-read"), target="gfx1115", environ={})
    assert "gfx1151" in exc.value.hint


def test_ranking_prefers_the_install_with_the_gpus_kernels(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_classic_rocm(tmp_path, "6.4.1")  # no gfx1151
    prefix = str(paths.nightly_prefix())
    fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1151",), inner=prefix + "/v1")
    os.symlink("v1", tmp_path / prefix.lstrip("/") / "current")
    res = resolve(tmp_path)
    assert str(res.rocm.path) == prefix + "/current"
    reason = res.decision("rocm").reason
    assert "rocBLAS has TensileLibrary files for gfx1151" in reason
    assert "rocforge's current nightly" in reason and "/opt/rocm (classic 6.4.1" in reason


def test_ranking_newest_version_among_equals(tmp_path):
    fr.make_therock_tree(tmp_path, "7.9.0rc20250812", ("gfx1151",), inner="/opt/rocm-7.9.0")
    fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1151",), inner="/opt/rocm-7.10.0")
    res = resolve(tmp_path)
    assert str(res.rocm.path) == "/opt/rocm-7.10.0"


def test_rocm_path_env_is_honoured_but_warned(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_classic_rocm(tmp_path, "6.4.1")
    fr.make_therock_tree(tmp_path, targets=("gfx1151",), inner="/opt/rocm-7.10.0")
    res = resolve(tmp_path, {"ROCM_PATH": "/opt/rocm-6.4.1"})
    assert str(res.rocm.path) == "/opt/rocm-6.4.1"
    assert any(w.startswith("ROCM_PATH=/opt/rocm-6.4.1 is used") for w in res.warnings)


def test_rocm_path_env_that_is_no_rocm_is_ignored(tmp_path):
    fr.make_strix_halo(tmp_path)
    res = resolve(tmp_path, {"ROCM_PATH": "/nowhere"})
    assert str(res.rocm.path) == "/opt/rocm"
    assert "ROCM_PATH=/nowhere is not a ROCm install; ignored" in res.warnings


def test_debian_environment(tmp_path):
    fr.make_debian_usr(tmp_path)
    res = resolve(tmp_path)
    assert res.env["ROCM_PATH"] == "/usr" and res.env["HIP_CLANG_PATH"] == "/usr/bin"
    assert res.env["HIP_DEVICE_LIB_PATH"] == "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"
    assert "PATH" not in res.env and "LD_LIBRARY_PATH" not in res.env
    # clang++ -> clang -> clang-15: the name must survive, the driver mode depends on it
    assert res.toolchain_env()["HIPCXX"] == str(tmp_path / "usr/lib/llvm-15/bin/clang++")


def test_toolchain_env_host_paths(tmp_path):
    fr.make_strix_halo(tmp_path)
    tc = resolve(tmp_path).toolchain_env()
    assert tc == {
        "HIP_PLATFORM": "amd",
        "HIPCXX": str(tmp_path / "opt/rocm/lib/llvm/bin/clang++"),
        "HIP_PATH": str(tmp_path / "opt/rocm"),
        "ROCM_PATH": str(tmp_path / "opt/rocm"),
        "HIP_DEVICE_LIB_PATH": str(tmp_path / "opt/rocm/lib/llvm/amdgcn/bitcode"),
    }


def test_no_rocm(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    res = resolve(tmp_path)
    assert res.rocm is None and not res.usable and res.target == "gfx1151"
    with pytest.raises(NoRocmError) as exc:
        res.toolchain_env()
    assert "rocforge nightly install --target gfx1151" in exc.value.hint


def test_prepend_list_is_idempotent_and_keeps_user_entries():
    once = resolver.prepend_list("/usr/bin::/bin", ("/r/bin", "/usr/bin", "/r/llvm"))
    assert once == "/r/bin:/r/llvm:/usr/bin::/bin"
    assert resolver.prepend_list(once, ("/r/bin", "/usr/bin", "/r/llvm")) == once
    assert resolver.prepend_list(None, ("/a", "/b")) == "/a:/b"
    assert resolver.prepend_list("", ("/a",)) == "/a"


def test_to_json_roundtrips(tmp_path):
    import json

    fr.make_igpu_dgpu(tmp_path)
    data = json.loads(json.dumps(resolve(tmp_path).to_json()))
    assert data["target"] == "gfx1100" and data["env"]["ROCR_VISIBLE_DEVICES"] == "1"
    assert {d["key"] for d in data["decisions"]} >= {"rocm", "target", "ROCR_VISIBLE_DEVICES",
                                                      "HSA_OVERRIDE_GFX_VERSION"}
