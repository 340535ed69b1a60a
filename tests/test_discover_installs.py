import json
import os

import fixtures_roots as fr
import pytest

from rocforge_build import paths
from rocforge_build.discover import installs, rocm_version
from rocforge_build.errors import NoRocmError
from rocforge_build.rootfs import Root


def only(root, **kw):
    (inst,) = installs.find_installs(Root(root), environ={}, include_pip=False, **kw)
    return inst


def test_2025_therock_tree(tmp_path):
    fr.make_therock_tree(tmp_path, "7.9.0rc20250812", ("gfx1151",))
    inst = only(tmp_path)
    assert inst.layout == "therock" and inst.version == "7.9.0rc20250812"
    assert inst.path == "/opt/rocm" and inst.sources == ("/opt/rocm",)
    assert inst.compiler_dir == "/opt/rocm/lib/llvm/bin"
    assert inst.hipcxx == "/opt/rocm/lib/llvm/bin/clang++"
    assert inst.bitcode_dir == "/opt/rocm/lib/llvm/amdgcn/bitcode"
    assert any("amdclang++ is a broken link" in p for p in inst.problems)
    assert any("no amdgcn link" in p for p in inst.problems)
    cov = inst.coverage
    assert cov.rocblas == ("gfx1151",) and cov.hipblaslt == ("gfx1151",)
    assert cov.dist == ("gfx1151",) and "gfx1151" in cov.bitcode
    assert cov.kernels_for("gfx1151") == (True, "rocBLAS has TensileLibrary files for gfx1151")
    assert not cov.kernels_for("gfx1100")[0]
    assert inst.bin_dirs == ("/opt/rocm/bin", "/opt/rocm/lib/llvm/bin")
    assert inst.lib_dirs == ("/opt/rocm/lib", "/opt/rocm/lib/llvm/lib")


def test_2026_therock_tree_has_amdgcn_link_and_working_amdclang(tmp_path):
    fr.make_therock_tree(tmp_path, "7.11.0a20260310", ("gfx1151",), amdgcn_link=True,
                         broken_amdclang=False)
    inst = only(tmp_path)
    assert inst.problems == ()
    assert inst.bitcode_dir == "/opt/rocm/lib/llvm/amdgcn/bitcode"


def test_family_tree_dist_info_and_per_arch_subdirs(tmp_path):
    d = fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1100", "gfx1101", "gfx1102",
                             "gfx1103"), rocblas=("gfx1100",), hipblaslt=())
    # hipBLASLt with per-arch subdirectories
    sub = d / "lib/hipblaslt/library/gfx1101"
    sub.mkdir(parents=True)
    (sub / "TensileLibrary_lazy_gfx1101.dat").write_text("")
    cov = only(tmp_path).coverage
    assert cov.dist == ("gfx1100", "gfx1101", "gfx1102", "gfx1103")
    assert cov.rocblas == ("gfx1100",) and cov.hipblaslt == ("gfx1101",)
    assert cov.kernels_for("gfx1101") == (False, "rocBLAS has no TensileLibrary files for gfx1101")


def test_dist_info_list_format_and_no_rocblas(tmp_path):
    d = fr.make_therock_tree(tmp_path, targets=("gfx942",), rocblas=(), hipblaslt=())
    (d / "share/therock/dist_info.json").write_text(json.dumps({"dist_amdgpu_targets": ["gfx942"]}))
    cov = only(tmp_path).coverage
    assert cov.kernels_for("gfx942") == (True, "dist_info.json lists gfx942")


def test_classic_with_link_is_one_install_found_twice(tmp_path):
    fr.make_classic_rocm(tmp_path, "6.4.1")
    inst = only(tmp_path)
    assert inst.layout == "classic" and inst.version == "6.4.1"
    assert inst.path == "/opt/rocm" and inst.real_path == "/opt/rocm-6.4.1"
    assert inst.sources == ("/opt/rocm", "/opt/rocm-*")
    assert inst.compiler_dir == "/opt/rocm/llvm/bin"
    assert inst.bitcode_dir == "/opt/rocm/amdgcn/bitcode"
    assert "gfx1151" not in inst.coverage.bitcode and "gfx1100" in inst.coverage.rocblas


def test_several_classic_versions(tmp_path):
    fr.make_classic_rocm(tmp_path, "6.2.4", link=False)
    fr.make_classic_rocm(tmp_path, "6.4.1", link=False)
    found = installs.find_installs(Root(tmp_path), environ={}, include_pip=False)
    assert [(str(i.path), i.version) for i in found] == [
        ("/opt/rocm-6.2.4", "6.2.4"), ("/opt/rocm-6.4.1", "6.4.1")]


def test_debian_usr(tmp_path):
    fr.make_debian_usr(tmp_path, rocm_version="5.2.3", llvm=15)
    inst = only(tmp_path)
    assert inst.layout == "debian" and inst.version == "5.2.3"  # from dpkg status
    assert inst.compiler_dir == "/usr/lib/llvm-15/bin"
    assert inst.hip_clang_path == "/usr/bin"
    assert inst.bitcode_dir == "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"
    assert inst.bin_dirs == () and inst.lib_dirs == () and not inst.cmake_prefix
    assert inst.coverage.kernels_for("gfx1030")[0]  # compiler-only: device bitcode
    assert not inst.coverage.has_rocblas


def test_debian_rocblas_versioned_dir(tmp_path):
    fr.make_debian_usr(tmp_path, rocm_version="5.7.1", llvm=17, rocblas=("gfx1030", "gfx1100"))
    inst = only(tmp_path)
    assert inst.version == "5.7.1" and inst.compiler_dir == "/usr/lib/llvm-17/bin"
    assert inst.coverage.rocblas == ("gfx1030", "gfx1100")


def test_fedora_usr(tmp_path):
    u = tmp_path / "usr"
    (u / "lib64").mkdir(parents=True)
    (u / "lib64/libamdhip64.so.6").write_text("")
    for tool in ("clang", "clang++"):
        fr._exe(u / "lib64/rocm/llvm/bin" / tool)
    fr._bitcode(u / "lib64/rocm/llvm/lib/clang/18/amdgcn/bitcode")
    fr._tensile(u / "lib64/rocblas/library", "gfx1100", "rocblas")
    fr._tensile(u / "lib64/rocm/gfx11/lib/rocblas/library", "gfx1151", "rocblas")
    (u / "include/rocm-core").mkdir(parents=True)
    (u / "include/rocm-core/rocm_version.h").write_text(
        "#define ROCM_VERSION_MAJOR 6\n#define ROCM_VERSION_MINOR 3\n#define ROCM_VERSION_PATCH 1\n")
    inst = only(tmp_path)
    assert inst.layout == "fedora" and inst.version == "6.3.1"
    assert inst.compiler_dir == "/usr/lib64/rocm/llvm/bin"
    assert inst.bitcode_dir == "/usr/lib64/rocm/llvm/lib/clang/18/amdgcn/bitcode"
    assert inst.coverage.rocblas == ("gfx1100", "gfx1151")


def test_rocforge_nightlies_current_and_siblings(tmp_path):
    prefix = paths.nightly_prefix()
    inner = str(prefix)  # a host path outside the fixture root: read inside it
    fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1151",),
                         inner=inner + "/7.10.0a20251021",
                         install_toml={"version": "7.10.0a20251021", "family": "gfx1151"})
    fr.make_therock_tree(tmp_path, "7.10.0a20251101", ("gfx1151",),
                         inner=inner + "/7.10.0a20251101")
    os.symlink("7.10.0a20251021", tmp_path / inner.lstrip("/") / "current")
    found = installs.find_installs(Root(tmp_path), environ={}, include_pip=False)
    assert [(str(i.path), i.nightly_current, i.family) for i in found] == [
        (inner + "/current", True, "gfx1151"), (inner + "/7.10.0a20251101", False, None)]
    assert found[0].real_path == inner + "/7.10.0a20251021"
    assert found[0].version == "7.10.0a20251021"  # from rocforge-install.toml


def test_nightly_prefix_inside_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "home/u/.local/share/rocforge"))
    fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1151",),
                         inner="/home/u/.local/share/rocforge/rocm/7.10.0a20251021")
    os.symlink("7.10.0a20251021", tmp_path / "home/u/.local/share/rocforge/rocm/current")
    inst = installs.find_installs(Root(tmp_path), environ={}, include_pip=False)[0]
    assert inst.path == "/home/u/.local/share/rocforge/rocm/current" and inst.nightly_current


def test_rocm_path_env_is_named_first(tmp_path):
    fr.make_classic_rocm(tmp_path, "6.4.1")
    (inst,) = installs.find_installs(Root(tmp_path), environ={"ROCM_PATH": "/opt/rocm-6.4.1"},
                                     include_pip=False)
    assert inst.path == "/opt/rocm-6.4.1" and inst.sources[0] == "$ROCM_PATH"


def test_explicit_rocm_that_is_no_rocm(tmp_path):
    (tmp_path / "srv/stuff/bin").mkdir(parents=True)
    with pytest.raises(NoRocmError, match="is not a ROCm install"):
        installs.find_installs(Root(tmp_path), rocm="/srv/stuff", environ={})
    with pytest.raises(NoRocmError):
        installs.find_installs(Root(tmp_path), rocm="/does/not/exist", environ={})


def test_explicit_rocm(tmp_path):
    fr.make_therock_tree(tmp_path, inner="/srv/therock")
    fr.make_classic_rocm(tmp_path)
    (inst,) = installs.find_installs(Root(tmp_path), rocm="/srv/therock", environ={})
    assert inst.layout == "therock" and inst.sources == ("--rocm",)


def test_empty_root_has_no_installs(tmp_path):
    assert installs.find_installs(Root(tmp_path), environ={}, include_pip=False) == []


def test_version_order():
    k = rocm_version.version_key
    assert k("7.10.0a20251021") < k("7.10.0a20251101") < k("7.10.0") < k("7.11.0rc1")
    assert k("6.4.1") < k("7.9.0rc20250812") and k(None) < k("5.2.3")
    assert k("7.10.0.dev0+abc") < k("7.10.0")


def test_pip_rocm_sdk_layout(tmp_path, monkeypatch):
    site = tmp_path / "venv/lib/python3.11/site-packages"
    fr.make_therock_tree(tmp_path, "7.10.0a20251021", ("gfx1151",), rocblas=(), hipblaslt=(),
                         inner=str(site.relative_to(tmp_path)) + "/_rocm_sdk_core")
    (site / "rocm_sdk_core-7.10.0a20251021.dist-info").mkdir()
    fr._tensile(site / "_rocm_sdk_libraries_gfx1151/lib/rocblas/library", "gfx1151", "rocblas")
    monkeypatch.setattr(installs, "_site_dirs", lambda: [str(site)])
    (inst,) = installs._pip_installs(Root(tmp_path))
    assert inst.layout == "pip" and inst.version == "7.10.0a20251021"
    assert inst.coverage.rocblas == ("gfx1151",)
    rel = "/" + str(site.relative_to(tmp_path))
    assert rel + "/_rocm_sdk_libraries_gfx1151/lib" in inst.lib_dirs


@pytest.mark.skipif(not os.path.exists("/usr/bin/hipcc") or not os.path.isdir(
    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"), reason="this host has no Debian ROCm packages")
def test_this_hosts_debian_rocm():
    found = [i for i in installs.find_installs(Root("/"), environ={}, include_pip=False)
             if i.path == "/usr"]
    assert found and found[0].layout == "debian" and found[0].version
    assert found[0].bitcode_dir == "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"
