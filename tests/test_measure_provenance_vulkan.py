"""The Vulkan part of a host's fingerprint (measure/provenance.py `vulkan`): the devices and
drivers a Vulkan build's own program names, read from real ggml-vulkan output (lavapipe, captured
from a Vulkan build's llama-bench: tests/data/vulkan/README.md), and the ICD manifests the loader
reads, from Debian's real mesa-vulkan-drivers files where they are installed."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from needs import LAVAPIPE_ICD, needs_lavapipe_icd

from rocforge_build.measure import provenance

DATA = Path(__file__).resolve().parent / "data" / "vulkan"


def test_the_devices_are_read_from_real_ggml_vulkan_output():
    text = (DATA / "llama-bench-help-lavapipe.stderr").read_text()
    assert provenance.vulkan_devices(text) == [
        {"index": 0, "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "driver": "llvmpipe"}]


def test_a_radv_device_name_with_parentheses_keeps_them():
    # the shape of RADV's line (the device name holds the chip in parentheses), as on gfx1151
    line = ("ggml_vulkan: 0 = AMD Radeon Graphics (RADV GFX1151) (radv) | uma: 1 | fp16: 1 | warp size: 64 "
            "| shared memory: 65536 | int dot: 1 | matrix cores: KHR_coopmat\n")
    assert provenance.vulkan_devices(line) == [
        {"index": 0, "name": "AMD Radeon Graphics (RADV GFX1151)", "driver": "radv"}]


def test_output_without_device_lines_names_none():
    assert provenance.vulkan_devices("usage: llama-bench [options]\nggml_vulkan: Found 0 Vulkan devices:\n") == []


def _program(prefix: Path, stderr: str) -> None:
    """A build's llama-bench that writes `stderr` as the real one did."""
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "llama-bench"
    exe.write_text(f"#!/bin/sh\ncat {json.dumps(str(DATA / stderr))} >&2\necho 'usage: llama-bench'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@needs_lavapipe_icd()
def test_the_fingerprint_names_device_driver_and_the_real_icd(tmp_path, monkeypatch):
    _program(tmp_path, "llama-bench-help-lavapipe.stderr")
    monkeypatch.setenv("VK_DRIVER_FILES", LAVAPIPE_ICD)
    got = provenance.vulkan(tmp_path)
    assert got["devices"] == [{"index": 0, "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "driver": "llvmpipe"}]
    [icd] = got["icds"]
    manifest = json.loads(Path(LAVAPIPE_ICD).read_text())["ICD"]
    assert icd == {"file": LAVAPIPE_ICD, "library": manifest["library_path"],
                   "api_version": manifest["api_version"]}
    assert "error" not in got


def test_a_build_without_a_program_says_so(tmp_path):
    got = provenance.vulkan(tmp_path)
    assert got["devices"] == [] and "no llama.cpp program" in got["error"]


def test_an_unreadable_or_hostile_icd_manifest_is_a_none_not_a_failure(tmp_path, monkeypatch):
    bad = [tmp_path / "deep.json", tmp_path / "list.json", tmp_path / "missing.json", tmp_path / "types.json"]
    bad[0].write_text("[" * 100000)
    bad[1].write_text("[1, 2]")
    bad[3].write_text(json.dumps({"ICD": {"library_path": ["x"], "api_version": 3}}))
    monkeypatch.setenv("VK_DRIVER_FILES", ":".join(map(str, bad)))
    assert [(i["library"], i["api_version"]) for i in provenance._icds()] == [(None, None)] * 4


def test_store_show_names_the_device_driver_and_icd_with_its_api_version():
    from rocforge_build.substitute import catalog

    text = (DATA / "llama-bench-help-lavapipe.stderr").read_text()
    vk = catalog._vulkan({"devices": provenance.vulkan_devices(text),
                          "icds": [{"file": "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
                                    "library": "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so", "api_version": "1.1.230"}]})
    attestation = {"kind": "verify", "signer": "C90E0473585D70AB", "made_at": "2026-11-29T07:01:25Z", "passed": True,
                   "host": {"kernel": "6.1.0", "rocm": None, "gpus": [], "firmware": None, "vulkan": vk},
                   "shapes": [], "own_figures": [], "note": ""}
    shown = {"key": "sha256:" + "0" * 64, "manifest": "sha256:" + "1" * 64, "signed_by": "C90E0473585D70AB",
             "layer_bytes": 3_000_000, "key_fields": {}, "advisories": [], "attestations": [attestation], "left_out": []}
    lines = catalog.describe_show(shown)
    assert ("  vulkan: llvmpipe (LLVM 15.0.6, 256 bits) (driver llvmpipe); ICDs lvp_icd.x86_64.json "
            "(Vulkan 1.1.230)") in lines, lines
