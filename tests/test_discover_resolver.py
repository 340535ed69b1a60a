import os

import fixtures_roots as fr
import pytest

from rocforge_build import paths
from rocforge_build.discover import installs, resolver
from rocforge_build.discover.gpus import Gpu
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


# -- the steps, called directly: each returns what it decided ---------------------------------
IGPU = Gpu(0, 1, "gfx1036", 100306, "igpu", "KFD properties", compute_units=2)
DGPU = Gpu(1, 2, "gfx1100", 110000, "dgpu", "KFD properties", compute_units=96)
MASKING = "(an unsupported GPU visible to ROCm can crash apps, lemonade-sdk/llamacpp-rocm #96)"


def classic_install(root, **tree):
    fr.make_classic_rocm(root, **tree)
    return installs.inspect(Root(root), "/opt/rocm-6.4.1")


def test_mask_gpus_hides_the_igpu_beside_the_served_dgpu(tmp_path):
    # ROCm 6.4.1's rocBLAS carries gfx1100 and gfx1030 kernels, none for the gfx1036 iGPU.
    inst = classic_install(tmp_path)
    step = resolver._mask_gpus(inst, None, (IGPU, DGPU), (DGPU,), {"ROCR_VISIBLE_DEVICES": "0,1"})
    assert step.env == (("ROCR_VISIBLE_DEVICES", "1"),)
    assert step.decisions == (resolver.Decision(
        "ROCR_VISIBLE_DEVICES", "1",
        "masked gfx1036 igpu (node 1, 2 CUs): rocBLAS has no TensileLibrary files for gfx1036, "
        "but rocBLAS has TensileLibrary files for gfx1030; kept gfx1100 dgpu (node 2, 96 CUs) "
        + MASKING),)
    assert step.warnings == (
        "iGPU and dGPU both visible to ROCm: gfx1036 igpu (node 1, 2 CUs), gfx1100 dgpu (node 2, 96 CUs)",
        "ROCR_VISIBLE_DEVICES=0,1 in the environment replaced by 1")
    assert step.blockers == () and step.prepend == ()


def test_mask_gpus_blocks_when_only_the_igpu_is_served(tmp_path):
    # A ROCm with kernels for the iGPU alone: programs would run on the small GPU.
    inst = classic_install(tmp_path, rocblas=("gfx1036",), hipblaslt=())
    step = resolver._mask_gpus(inst, None, (IGPU, DGPU), (IGPU,), {})
    blocker = ("the main GPU, gfx1100 dgpu (node 2, 96 CUs), is NOT served by /opt/rocm-6.4.1 "
               "(classic 6.4.1): rocBLAS has no TensileLibrary files for gfx1100; only the iGPU "
               "gfx1036 igpu (node 1, 2 CUs) is, so programs run on the small GPU. For gfx1100: "
               "install a TheRock nightly: `rocforge nightly install --target gfx1100`, or pass "
               "--rocm PATH to an existing ROCm tree")
    assert step.blockers == (blocker,)
    assert step.warnings == ("iGPU and dGPU both visible to ROCm: gfx1036 igpu (node 1, 2 CUs), "
                             "gfx1100 dgpu (node 2, 96 CUs)", blocker)
    assert step.env == (("ROCR_VISIBLE_DEVICES", "0"),)
    # with --target the user chose the GPU: no blocker, the mask stays
    wanted = resolver._mask_gpus(inst, "gfx1036", (IGPU, DGPU), (IGPU,), {})
    assert wanted.blockers == () and wanted.env == step.env


def test_override_decisions_sets_the_override_and_unsets_per_node_ones():
    # Strix Halo's gfx1151 running a gfx110X tree's gfx1100 kernels; a per-node override left over
    strix = Gpu(0, 1, "gfx1151", 110501, "igpu", "KFD properties", compute_units=40)
    chosen = resolver.TargetChoice((strix,), (strix,), "gfx1100", "11.0.0", resolver.Decided())
    step = resolver._override_decisions(None, (strix,), chosen,
                                        {"HSA_OVERRIDE_GFX_VERSION_1": "11.5.1", "HOME": "/home/a"})
    assert step.env == (("HSA_OVERRIDE_GFX_VERSION", "11.0.0"), ("HSA_OVERRIDE_GFX_VERSION_1", None))
    assert step.decisions == (resolver.Decision(
        "HSA_OVERRIDE_GFX_VERSION", "11.0.0",
        "gfx1151 run gfx1100 kernels: ROCm must see them as gfx1100 (11.0.0)"),)
    assert step.warnings == ("HSA_OVERRIDE_GFX_VERSION_1=11.5.1 in the environment unset (per-node "
                             "override would win over the decided one)",)
    # no GPU, no stale override: nothing to decide
    nothing = resolver.TargetChoice((), (), None, None, resolver.Decided())
    assert resolver._override_decisions(None, (), nothing, {}) == resolver.Decided()


def test_a_later_steps_path_list_goes_in_front_and_its_decision_takes_the_earlier_place():
    rocm = resolver.Decided(
        env=(("ROCM_PATH", "/opt/rocm"),), prepend=(("PATH", ("/opt/rocm/bin", "/x")),),
        decisions=(resolver.Decision("PATH", "/opt/rocm/bin:/x", "the ROCm's"),
                   resolver.Decision("ROCM_PATH", "/opt/rocm", "chosen")),
        warnings=("w1",))
    builds = resolver.Decided(
        env=(("ROCM_PATH", None), ("A", "1")), prepend=(("PATH", ("/b/bin", "/x")),),
        decisions=(resolver.Decision("builds", ["/b"], "used"),
                   resolver.Decision("PATH", "/b/bin:/x:/opt/rocm/bin", "builds first"),
                   resolver.Decision("rocm", "/b", "a key that is no path list")),
        warnings=("w2",), blockers=("b",))
    both = rocm.then(builds)
    assert both.prepend == (("PATH", ("/b/bin", "/x", "/opt/rocm/bin")),)
    assert [d.key for d in both.decisions] == ["PATH", "ROCM_PATH", "builds", "rocm"]
    assert both.decisions[0].reason == "builds first"
    assert both.env == (("ROCM_PATH", "/opt/rocm"), ("ROCM_PATH", None), ("A", "1"))
    assert dict(both.env) == {"ROCM_PATH": None, "A": "1"}
    assert both.warnings == ("w1", "w2") and both.blockers == ("b",)
