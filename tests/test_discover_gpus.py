import os
from pathlib import Path

import fixtures_roots as fr
import pytest

from rocforge_build.discover import gpus
from rocforge_build.errors import DetectionError
from rocforge_build.rootfs import Root


def test_strix_halo_kfd(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    found = gpus.discover(Root(tmp_path))
    assert found.source == "kfd"
    (g,) = found.gpus
    assert (g.index, g.node, g.gfx, g.gfx_target_version) == (0, 1, "gfx1151", 110501)
    assert g.kind == "igpu" and "target table" in g.kind_reason
    assert g.compute_units == 40  # simd_count 80 / simd_per_cu 2
    assert g.device_id == 0x1586
    assert g.unique_id is None  # unique_id 0: not reported
    assert g.drm_render_minor == 128


def test_several_gpus_in_kfd_order_cpu_skipped(tmp_path):
    fr.make_gpus(tmp_path, fr.RAPHAEL_IGPU, fr.RX7900XTX)
    found = gpus.discover(Root(tmp_path)).gpus
    assert [(g.index, g.node, g.gfx, g.kind) for g in found] == [
        (0, 1, "gfx1036", "igpu"), (1, 2, "gfx1100", "dgpu")]
    assert found[1].compute_units == 96
    assert found[1].unique_id == "1a2b3c4d5e6f7081"


def test_node_order_is_numeric_not_lexical(tmp_path):
    fr.make_kfd_node(tmp_path, 0, fr.cpu_node_props())
    for node in (2, 10):
        fr.make_kfd_node(tmp_path, node, fr.gpu_node_props(110000 + node, cus=8, device_id=node))
    assert [g.node for g in gpus.discover(Root(tmp_path)).gpus] == [2, 10]


def test_apu_node_with_cpu_cores_is_igpu(tmp_path):
    # CRAT-described APUs put CPU cores and SIMDs on one node.
    fr.make_kfd_node(tmp_path, 0, fr.gpu_node_props(90012, cus=8, device_id=0x1638, cpu_cores=8))
    (g,) = gpus.discover(Root(tmp_path)).gpus
    assert g.gfx == "gfx90c" and g.kind == "igpu" and "APU node" in g.kind_reason


def test_future_gfx_is_decoded_and_reported(tmp_path):
    fr.make_future_gpu(tmp_path, 130000)
    (g,) = gpus.discover(Root(tmp_path)).gpus
    assert g.gfx == "gfx1300" and not g.known and g.target is None
    assert g.kind == "dgpu" and "not in the target table" in g.kind_reason
    fr.make_kfd_node(tmp_path, 2, fr.gpu_node_props(120510, cus=4, device_id=1))
    assert gpus.discover(Root(tmp_path)).gpus[1].gfx == "gfx125a"  # minor/stepping in hex


def test_properties_format_matches_kernel_order(tmp_path):
    path = fr.make_kfd_node(tmp_path, 1, fr.gpu_node_props(**fr.STRIX_HALO))
    lines = path.read_text().splitlines()
    assert lines[0] == "cpu_cores_count 0" and lines[1] == "simd_count 80"
    assert "gfx_target_version 110501" in lines and lines[-1].startswith("max_engine_clk_ccompute")
    assert "local_mem_size 0" in lines  # amdkfd always prints 0 here


def test_garbage_in_properties_is_a_detection_error(tmp_path):
    path = fr.make_kfd_node(tmp_path, 1, fr.gpu_node_props(**fr.STRIX_HALO))
    path.write_text(path.read_text() + "simd_count eighty\n")
    with pytest.raises(DetectionError, match=r"properties:\d+: not a KFD"):
        gpus.discover(Root(tmp_path))


def test_invalid_gfx_encoding_is_a_detection_error(tmp_path):
    fr.make_kfd_node(tmp_path, 1, fr.gpu_node_props(111600, cus=4, device_id=1))  # minor 16
    with pytest.raises(DetectionError, match="not a valid encoding"):
        gpus.discover(Root(tmp_path))


def test_unreadable_properties_is_a_detection_error(tmp_path):
    path = fr.make_kfd_node(tmp_path, 1, fr.gpu_node_props(**fr.STRIX_HALO))
    path.unlink()
    path.mkdir()  # reading a directory fails even as root
    with pytest.raises(DetectionError, match="cannot read"):
        gpus.discover(Root(tmp_path))


def test_nodes_not_a_directory(tmp_path):
    (tmp_path / fr.KFD).mkdir(parents=True)
    (tmp_path / fr.KFD / "nodes").write_text("")
    with pytest.raises(DetectionError, match="cannot read"):
        gpus.discover(Root(tmp_path))


def test_no_kfd_in_a_foreign_root_means_no_gpus(tmp_path):
    found = gpus.discover(Root(tmp_path))
    assert found.gpus == () and found.source == "none"


def test_parse_rocminfo_real_format():
    (g,) = gpus.parse_rocminfo(fr.ROCMINFO_GFX1151)
    assert (g.gfx, g.node, g.compute_units, g.device_id) == ("gfx1151", 1, 40, 0x1586)
    assert g.kind == "igpu" and "APU" in g.kind_reason
    assert g.marketing_name == "AMD Radeon Graphics" and g.unique_id is None
    assert g.source == "rocminfo"


def test_rocminfo_fallback_runs_the_program(tmp_path):
    program = fr.make_fake_rocminfo(tmp_path / "bin")
    found = gpus.discover(Root(tmp_path / "root"), rocminfo=str(program))
    assert found.source == "rocminfo" and [g.gfx for g in found.gpus] == ["gfx1151"]


def test_rocminfo_failure_is_a_warning(tmp_path):
    program = tmp_path / "rocminfo"
    program.write_text("#!/bin/sh\necho 'ROCk module is NOT loaded, possibly no GPU devices'\nexit 1\n")
    program.chmod(0o755)
    found = gpus.discover(Root(tmp_path), rocminfo=str(program))
    assert found.gpus == () and "ROCk module is NOT loaded" in found.warnings[0]


def test_kfd_wins_over_rocminfo(tmp_path):
    fr.make_gpus(tmp_path, fr.RX7900XTX)
    program = fr.make_fake_rocminfo(tmp_path / "bin")
    found = gpus.discover(Root(tmp_path), rocminfo=str(program))
    assert found.source == "kfd" and found.gpus[0].gfx == "gfx1100"


_DISCOVER = ("import json, sys\n"
             "from rocforge_build.discover import gpus\n"
             "from rocforge_build.rootfs import Root\n"
             "found = gpus.discover(Root(sys.argv[1]))\n"
             "print(json.dumps([[g.gfx for g in found.gpus], list(found.warnings)]))\n")


def test_permission_denied_node_is_skipped_with_warning():
    """An unreadable KFD node (a hardened sysfs, a container) is skipped with a warning; the
    other GPU is still found.  Root reads any file, so as root (CI) the discovery runs as the
    unprivileged user nobody (setpriv), over a root it can traverse but not read that node of."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    base = Path(tempfile.mkdtemp(prefix="rocforge-perm-"))
    try:
        base.chmod(0o755)
        fr.make_gpus(base, fr.RAPHAEL_IGPU, fr.RX7900XTX)
        (base / fr.KFD / "nodes/1/properties").chmod(0)
        argv = [sys.executable, "-c", _DISCOVER, str(base)]
        if os.geteuid() == 0:
            python = shutil.which("python3.11", path="/usr/bin") or "/usr/bin/python3"
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python,
                    "-c", _DISCOVER, str(base)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                             env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        found, warnings = json.loads(out.stdout)
        assert found == ["gfx1100"] and "permission denied" in warnings[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)
