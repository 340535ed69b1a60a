"""TheRock native packages (/opt/rocm/core-X.Y, amdrocm-*) and kernel packs (.kpack/)."""

from __future__ import annotations

from pathlib import PurePosixPath

import fixtures_roots as fr

from rocforge_build.discover import binaries, resolver, rocm_version
from rocforge_build.rootfs import Root


def test_kpack_toc_is_read(tmp_path):
    # rocm-kpack's format: "KPAK", version 1, TOC offset; the TOC names the arches carried.
    path = fr.write_kpack(tmp_path / ".kpack/blas_lib_gfx110X.kpack", "blas", "gfx110X",
                          ("gfx1100", "gfx1101", "gfx1102"))
    assert path.read_bytes()[:4] == b"KPAK"
    pack = binaries.read_kpack(Root(tmp_path), PurePosixPath("/.kpack/blas_lib_gfx110X.kpack"))
    assert pack.arches == ("gfx1100", "gfx1101", "gfx1102") and pack.evidence == "toc"
    assert pack.group == "blas"


def test_kpack_name_is_the_fallback(tmp_path):
    (tmp_path / ".kpack").mkdir()
    (tmp_path / ".kpack/fft_lib_gfx1151.kpack").write_bytes(b"")  # e.g. a trimmed copy
    pack = binaries.read_kpack(Root(tmp_path), PurePosixPath("/.kpack/fft_lib_gfx1151.kpack"))
    assert pack.arches == ("gfx1151",) and pack.evidence == "name"


def test_native_core_install_with_gfx1151_pack_serves_gfx1151(tmp_path):
    # amdrocm-core-sdk10.1 + amdrocm-blas10.1-gfx1151: no TensileLibrary files and no
    # dist_info.json anywhere; the gfx1151 kernels are in .kpack/blas_lib_gfx1151.kpack.
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path)
    fr.make_therock_native(tmp_path, "10.1.0a20261020", ("gfx1151",))
    res = resolver.resolve(Root(tmp_path), environ={})
    assert [str(i.path) for i in res.installs] == ["/opt/rocm/core"]
    assert res.rocm.real_path == "/opt/rocm/core-10.1"
    assert res.rocm.layout == "therock" and res.rocm.version.startswith("10.1")
    assert res.target == "gfx1151" and res.env["HSA_OVERRIDE_GFX_VERSION"] is None
    assert "blas_lib_gfx1151.kpack carries gfx1151" in res.decision("target").reason
    assert res.env["HIP_DEVICE_LIB_PATH"] == "/opt/rocm/core/lib/llvm/amdgcn/bitcode"


def test_native_core_install_without_the_gfx1151_pack(tmp_path):
    # Only amdrocm-blas10.1-gfx1100 installed: the compiler's bitcode knows gfx1151, but no
    # kernels for it are installed; gfx1100's pack runs through the override.
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path)
    fr.make_therock_native(tmp_path, "10.1.0", ("gfx1100",))
    res = resolver.resolve(Root(tmp_path), environ={})
    assert res.target == "gfx1100" and res.env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert "amdrocm-blas<X.Y>-gfx1151" in res.decision("target").reason


def test_versions_are_major_agnostic():
    key = rocm_version.version_key
    assert key("10.1.0a20261020") > key("10.0.0") > key("7.14.0") > key("7.14.0a20260612")
    assert key("10.1.0a20261020") < key("10.1.0")
