"""Measuring without builds: model checks, option detection from real llama-bench sources, compare,
the tune search, and the plot rendered by a real browser.  The end-to-end runs on real builds are
in test_measure_slow.py; the results store's failure modes are test_measure_store.py's, verify's
limits test_measure_verify.py's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import needs
import pytest
from llama_trees import sdist
from tiny_gguf import write as write_gguf
from trust_helpers import one_error_line

from rocforge_build import cli
from rocforge_build.measure import compare, plot, tune
from rocforge_build.measure.llama_tools import options_from_help
from rocforge_build.measure.store import Store

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", byte_tokens=True)


# -- bad models ---------------------------------------------------------------------------------
def test_not_gguf_is_one_line(tmp_path, capsys):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b'{"__metadata__": {}}' + b"\0" * 100)
    assert cli.main(["bench", str(tmp_path), "--model", str(f)]) == 2
    assert "is not a GGUF model" in one_error_line(capsys)


def test_truncated_gguf_is_one_line(tmp_path, model, capsys):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # a download that stopped half way
    assert cli.main(["verify", str(tmp_path), "--model", str(cut)]) == 2
    line = one_error_line(capsys)
    assert "is truncated" in line and f"the file has {cut.stat().st_size}" in line
    cut.write_bytes(model.read_bytes()[:40])  # inside the header
    assert cli.main(["verify", str(tmp_path), "--model", str(cut)]) == 2
    assert "truncated" in one_error_line(capsys)


def test_gguf_v1_is_one_line(tmp_path, capsys):
    v1 = tmp_path / "old.gguf"
    v1.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + b"\0" * 32)  # 32-bit counts: llama.cpp refuses it
    assert cli.main(["verify", str(tmp_path), "--model", str(v1)]) == 2
    assert "GGUF version 1 file" in one_error_line(capsys)


def test_whole_gguf_reads_its_header(model):
    from rocforge_build.measure import gguf

    m = gguf.check(model)
    # tiny_gguf.write: a llama of context 2048 in F16, 2 layers x 9 tensors + 3
    assert (m.arch, m.n_ctx_train, m.file_type, m.n_tensors) == ("llama", 2048, "F16", 21)


def test_vocabulary_size_read_from_the_token_list(model):
    from rocforge_build.measure import gguf

    assert gguf.check(model).n_vocab == 1024  # tests/tiny_gguf.py's tiny size: 1024 tokens


def test_build_without_programs_is_one_line(tmp_path, model, capsys):
    (tmp_path / "bin").mkdir()
    assert cli.main(["bench", str(tmp_path), "--model", str(model), "--no-gate"]) == 2
    assert "has no bin/llama-bench" in one_error_line(capsys)
    (tmp_path / "bin" / "llama-bench").write_text("")
    assert cli.main(["bench", str(tmp_path), "--model", str(model)]) == 2  # the gate needs perplexity
    assert "has no bin/llama-perplexity" in one_error_line(capsys)
    assert cli.main(["bench", str(tmp_path / "nope"), "--model", str(model)]) == 2
    assert "does not exist" in one_error_line(capsys)


# -- option detection from the real usage text of two eras --------------------------------------
def _usage_text(version: str) -> str:
    """llama-bench's print_usage lines, as its source of that era prints them."""
    import re

    with tarfile.open(sdist(version)) as tf:
        name = next(n for n in tf.getnames() if n.endswith("llama-bench.cpp"))
        src = tf.extractfile(name).read().decode()
    body = src[src.index("static void print_usage"):]
    body = body[: body.index("\n}\n")]
    return "\n".join(m.group(1) for m in re.finditer(r'printf\("((?:[^"\\]|\\.)*)"', body))


def test_depth_option_by_era():
    # -d/--n-depth came to llama-bench in April 2025: the Sep 2024 tree lacks it, May 2025 has it
    old, new = options_from_help(_usage_text("0.3.0")), options_from_help(_usage_text("0.3.9"))
    assert "-d" not in old and "--n-depth" not in old and "-fa" in old and "-ub" in old
    assert "-d" in new and "--n-depth" in new


# -- compare ------------------------------------------------------------------------------------
def _row(test, depth, t_s, status="ok", gate="passed"):
    return {"test": test, "n_prompt": 512 if test == "pp" else 0, "n_gen": 128 if test == "tg" else 0,
            "depth": depth, "ubatch": 512, "fa": True, "env": {}, "t_s": t_s, "status": status,
            "gate": gate, "model_sha256": "m"}


def test_compare_flags_more_than_five_percent():
    a = [_row("pp", 0, 1000.0), _row("tg", 0, 50.0), _row("pp", 4096, 800.0), _row("tg", 4096, 40.0)]
    b = [_row("pp", 0, 960.0), _row("tg", 0, 47.0), _row("pp", 4096, 900.0), _row("tg", 4096, None, "failed")]
    verdicts = {(x.key[0], x.key[2]): x.verdict for x in compare.compare(a, b)}
    # -4 % is within 5 %, -6 % is a regression, +12.5 % is faster, a failed row is flagged
    assert verdicts == {("pp", 0): "ok", ("tg", 0): "regression", ("pp", 4096): "faster", ("tg", 4096): "failed"}
    assert len(compare.flagged(compare.compare(a, b))) == 2
    assert compare.flagged(compare.compare(a, b, threshold=0.10)) == [x for x in compare.compare(a, b, 0.10)
                                                                        if x.verdict == "failed"]


def test_compare_a_build_that_lost_its_gate_is_wrong():
    a = [_row("pp", 0, 1000.0)]
    b = [{**_row("pp", 0, None, "gate-failed", "failed"), "test": "gate"}]
    assert [x.verdict for x in compare.compare(a, b)] == ["wrong"]


def _host(**changes):
    """A row's host as provenance.host writes it (a Strix Halo with the good firmware)."""
    return {"kernel": "6.18.4-200.fc43.x86_64", "os": "Linux-6.18.4-200.fc43.x86_64-x86_64-with-glibc2.42",
            "cpu": "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S", "cpus": 32, "ram_bytes": 134914318336,
            "gpus": [{"name": "AMD Radeon 8060S", "gfx": "gfx1151", "kind": "igpu", "driver": None}],
            "rocm": "10.1.0a20261101", "cmdline": "BOOT_IMAGE=/vmlinuz ro quiet ttm.pages_limit=31719424",
            "firmware": {"mes": "0x80", "smc": "0xa640200", "smu": "100.2.0"}, "firmware_packages": None,
            "tuned_profile": "accelerator-performance", "iommu": "on", "gtt_bytes": 121 << 30,
            "vram_bytes": 512 << 20, **changes}


def test_results_compare_shows_what_differs_between_the_hosts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "r.sqlite3"))
    b_host = _host(kernel="6.19.0-100.fc43.x86_64", rocm="10.1.0a20261110",
                   cmdline="BOOT_IMAGE=/vmlinuz ro ttm.pages_limit=31719424 amd_iommu=off",
                   firmware={"mes": "0x83", "smc": "0xa640200", "smu": "100.2.0"}, iommu="off")
    with Store() as s:
        for host, t_s in ((_host(), 1000.0), (b_host, 700.0)):
            rid = s.start_run("bench", ["rocforge", "bench"], {"host": host})
            s.add_row(rid, "bench", {**_row("pp", 0, t_s), "host": host, "prefix": "/builds/llama",
                                     "backend": "hip", "stamp": "3f2a"})
            s.finish_run(rid, "done")
    assert cli.main(["results", "compare", "1", "2"]) == 1  # -30 %: a regression
    out = capsys.readouterr().out
    section = out[out.index("host and stack differences:"):].splitlines()
    assert section == ["host and stack differences:",
                       "  cmdline: + amd_iommu=off - quiet",
                       "  firmware.mes 0x80 -> 0x83",
                       "  iommu on -> off",
                       "  kernel 6.18.4-200.fc43.x86_64 -> 6.19.0-100.fc43.x86_64",
                       "  rocm 10.1.0a20261101 -> 10.1.0a20261110"]
    assert cli.main(["results", "compare", "1", "2", "--json"]) == 1
    import json

    diffs = json.loads(capsys.readouterr().out)["host_differences"]
    assert [(d["key"], d["a"], d["b"]) for d in diffs][1:] == [
        ("firmware.mes", "0x80", "0x83"), ("iommu", "on", "off"),
        ("kernel", "6.18.4-200.fc43.x86_64", "6.19.0-100.fc43.x86_64"),
        ("rocm", "10.1.0a20261101", "10.1.0a20261110")]
    # the same host and stack twice: said so
    assert cli.main(["results", "compare", "1", "1"]) == 0
    assert "host and stack differences: none" in capsys.readouterr().out


def test_bench_warns_of_a_known_bad_host_before_measuring(tmp_path, model):
    import host_roots as hr
    from test_commands_env import cli as cli_in

    root = tmp_path / "root"
    hr.strix_bad_firmware(root)  # gfx1151 with MES 0x83 in debugfs, kernel 6.18.4
    prefix = tmp_path / "build"
    (prefix / "bin").mkdir(parents=True)
    ran = tmp_path / "llama-bench-ran"
    bench = prefix / "bin" / "llama-bench"
    bench.write_text(f"#!/bin/sh\necho \"$@\" >> '{ran}'\nexit 1\n")
    bench.chmod(0o755)
    out = cli_in(root, "bench", str(prefix), "--model", str(model), "--no-gate",
                 env={"ROCFORGE_RESULTS_DB": str(tmp_path / "r.sqlite3")})
    warnings = [line for line in out.stderr.splitlines() if line.startswith("rocforge: warning: known bad")]
    assert warnings == ["rocforge: warning: known bad: firmware mes 0x83 on gfx1151: MES firmware 0x83 "
                        "(linux-firmware 20251125) hangs or page-faults ROCm on Strix Halo; MES 0x80 "
                        "(linux-firmware 20251111) works (ROCm/legacy-rocm-build #5724, #5991; "
                        "kyuz0/amd-strix-halo-toolboxes docs/troubleshooting-firmware.md)"]
    assert out.stderr.splitlines()[0] == warnings[0]  # before anything was measured
    assert ran.exists()  # a warning, not a refusal: llama-bench ran (and failed, as this one does)
    with Store(tmp_path / "r.sqlite3") as s:
        host = next(s.rows()).data["host"]
    assert host["firmware"]["mes"] == "0x83" and host["gpus"][0]["gfx"] == "gfx1151"
    assert host["kernel"] == "6.18.4-200.fc43.x86_64"  # the root's kernel, like its GPUs


KNOWN_BAD_MES = ("rocforge: warning: known bad: firmware mes 0x83 on gfx1151: MES firmware 0x83 "
                 "(linux-firmware 20251125) hangs or page-faults ROCm on Strix Halo")


def test_tune_and_serve_warn_of_a_known_bad_host_first(tmp_path, model, monkeypatch):
    """tune (through the measuring session, like bench and verify) and serve (before it starts
    llama-server) say the known-bad host state as their first line, and still go on: tune to its
    verify gate (a stub here, which fails the build: its reference would be a real llama.cpp
    build), serve to starting llama-server (a fake that fails at once)."""
    import host_roots as hr
    from stackfixtures import make_build
    from test_commands_env import cli as cli_in
    from test_measure_proof import preset

    from rocforge_build.measure import verify

    gated = []
    monkeypatch.setattr(verify, "gate", lambda build, *a, **k: gated.append(build.prefix) or "failed")

    root = tmp_path / "root"
    hr.strix_bad_firmware(root)
    env = {"ROCFORGE_RESULTS_DB": str(tmp_path / "r.sqlite3")}
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    ran = tmp_path / "ran"
    for program in ("llama-bench", "llama-perplexity", "llama-server"):  # each fails at once
        exe = prefix / "bin" / program
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text(f"#!/bin/sh\necho {program} >> '{ran}'\nexit 1\n")
        exe.chmod(0o755)
    out = cli_in(root, "tune", "llama-cpp", "--target", "gfx1151", "--model", str(model),
                 "--backends", ",", "--build", str(prefix), env=env)
    assert out.stderr.splitlines()[0].startswith(KNOWN_BAD_MES), out.stderr
    assert gated == [prefix, prefix]  # a warning, not a refusal: the gate ran (fa on and off)

    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.measure.store import Store

    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", str(model), "-c", "4096"])
    p["ranges"]["short"]["prefix"] = str(prefix)
    p["ranges"]["short"]["stamp"] = read_manifest(prefix).get("stamp")
    with Store(tmp_path / "r.sqlite3") as s:
        s.add_preset("m", "ab" * 32, 1, p)
    from test_measure_proof import free_port

    out = cli_in(root, "serve", "m", "--port", str(free_port()), "--wait", "5", "--no-canary", env=env)
    assert out.stderr.splitlines()[0].startswith(KNOWN_BAD_MES), out.stderr
    assert "llama-server" in ran.read_text()  # and the server was started (and failed)


# -- the tune search ----------------------------------------------------------------------------
def test_coordinate_search_finds_the_cross_products_winner_with_fewer_runs():
    # a score where fa and ubatch each matter and interact a little (like pp t/s): fa on is worth
    # 20 %, ubatch peaks at 1024, and fa on moves the peak nowhere
    dims = [[True, False], [256, 512, 1024, 2048], ["0", "1"]]
    calls = []

    def score(p):
        calls.append(p)
        fa, ub, lt = p
        peak = {256: 0.7, 512: 0.9, 1024: 1.0, 2048: 0.85}[ub]
        return 1000 * peak * (1.2 if fa else 1.0) * (1.1 if lt == "1" else 1.0) + (5 if fa and ub == 2048 else 0)

    best, s = tune.coordinate_search(dims, score)
    n_search = len(set(calls))
    calls.clear()
    full_best, full_s = tune.exhaustive(dims, score)
    assert (best, s) == (full_best, full_s) == ((True, 1024, "1"), 1000 * 1.2 * 1.1)
    assert n_search < len(set(calls)) == 16


# -- the picture ----------------------------------------------------------------------------------
def test_plot_renders_in_a_real_browser(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip(needs.reason(["chromium"]))
    rows = []
    for name, base in (("hip", 1000.0), ("vulkan", 1400.0)):
        for i, depth in enumerate((0, 4096, 16384)):
            for test, scale in (("pp", 1.0), ("tg", 0.05)):
                rows.append({**_row(test, depth, base * scale / (1 + i)), "prefix": f"/b/llama-{name}",
                             "backend": name})
    html = tmp_path / "plot.html"
    html.write_text(plot.page(rows, "depth curves"))
    png = tmp_path / "plot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1200,900", f"file://{html}"], check=True, capture_output=True, timeout=120,
                   env={**os.environ, "HOME": str(tmp_path)})
    counts = _colour_counts(png.read_bytes())
    # both builds' lines were drawn (their colours, plot.COLORS[0] and [1]) on a white page
    assert counts.get((0x1F, 0x77, 0xB4), 0) > 200 and counts.get((0xD6, 0x27, 0x28), 0) > 200
    assert max(counts, key=counts.get) == (255, 255, 255)


def _colour_counts(data: bytes) -> dict[tuple[int, int, int], int]:
    """Pixel colours of an 8-bit RGB/RGBA PNG (what Chromium writes), decoded with the stdlib."""
    import struct
    import zlib
    from collections import Counter

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, _h, depth, ctype = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and ctype in (2, 6)
            bpp = 4 if ctype == 6 else 3
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw, stride, prev, counts = zlib.decompress(idat), width * bpp, bytearray(width * bpp), Counter()
    for row in range(len(raw) // (stride + 1)):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        counts.update(tuple(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return counts
