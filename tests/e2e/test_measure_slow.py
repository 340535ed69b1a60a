"""verify -> bench -> tune -> preset for real (slow; CI runs it): the May 2025 tree's CPU backend
built three times through rocforge — the default flags (the reference), without llamafile's
sgemm (GGML_LLAMAFILE=OFF: different flags, same maths), and a deliberately wrong build (a patch
that scales the RMS norm by 4) — on a random tiny model.

CI budget (2 cores): the three builds share one ccache (CCACHE_BASEDIR), so after the first only
ggml-cpu's sources (second) and one file (third) compile; everything else is seconds.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llama_builds import shared_ccache
from llama_trees import tree
from measure_fixtures import WRONG_PATCH, recipe_variant
from tiny_gguf import write as write_gguf

from rocforge_build import cli, paths
from rocforge_build.measure.llama_tools import MEASURE_TARGETS

JOBS = os.environ.get("ROCFORGE_TEST_JOBS", "2")
REPO = Path(__file__).resolve().parents[2]
BENCH = ["-p", "32", "-n", "8", "--reps", "1", "--threads", JOBS]


@pytest.fixture(scope="module")
def llama_tree(tmp_path_factory):
    return tree("0.3.9", tmp_path_factory.mktemp("llama-full"), full=True)


@pytest.fixture(autouse=True)
def _shared_ccache(monkeypatch):
    monkeypatch.setenv("CCACHE_DIR", shared_ccache())


def rf(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def build_args(llama_tree, recipe="llama-cpp", *extra):
    targets = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]
    return ["build", recipe, "--target", "gfx1151", "--backend", "cpu", "--source", llama_tree, *targets,
            "-j", JOBS, *extra]


@pytest.mark.slow
def test_verify_bench_tune_preset_and_a_wrong_build(llama_tree, tmp_path, capsys):
    model = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)
    ctx = ["--ctx", "256,1024"]  # short and long for a model trained at 2048
    # the reference: the default cpu build, in the data dir (where verify looks for it)
    code, out, err = rf(capsys, *build_args(llama_tree))
    assert code == 0, err
    ref = paths.builds_prefix() / "llama-cpp-cpu"  # a CPU build is named for no GPU target
    assert out.strip() == str(ref)
    ref_manifest = (ref / "rocforge-manifest.toml").stat().st_mtime_ns
    # a build with different flags: llamafile's sgemm off
    b = tmp_path / "llama-nosgemm"
    code, _, err = rf(capsys, *build_args(llama_tree, recipe_variant(tmp_path / "rb", options={"GGML_LLAMAFILE": False}),
                                          "--prefix", b))
    assert code == 0, err
    assert "-DGGML_LLAMAFILE=OFF" in (b / "rocforge-manifest.toml").read_text()

    # verify: the default reference is the cpu build of the same recipe and source, found up to date
    code, out, err = rf(capsys, "verify", b, "--model", model, *ctx, "--json")
    assert code == 0, err
    v = json.loads(out)
    # --ctx 256,1024: the covering design's two checks first, the longer with -ub 2048 and flash
    # attention on; then the serving dimensions this tree's llama-perplexity runs (May 2025: -ctk/-ctv
    # and --no-mmap, no --kv-unified) join: KV q8_0 (only with flash attention on) and the weights
    # read, one more check where no row could take q8_0 (the 256 one runs without flash attention)
    assert v["passed"] and v["reference"] == str(ref)
    assert [(c["ctx"], c["ubatch"], c["fa"]) for c in v["checks"]][:2] == [(1024, 2048, True), (256, 256, False)]
    assert len(v["checks"]) == 3 and {c["parallel"] for c in v["checks"]} == {1}
    assert {c["kv"] for c in v["checks"]} == {"f16", "q8_0"} and {c["load"] for c in v["checks"]} == {"mmap", "read"}
    assert all(c["fa"] for c in v["checks"] if c["kv"] == "q8_0")
    assert all(c["kld_mean"] < 0.005 and c["top1"] > 0.95 for c in v["checks"])
    assert (ref / "rocforge-manifest.toml").stat().st_mtime_ns == ref_manifest  # not rebuilt

    # bench: gated (the verify above is reused), rows with provenance
    code, out, err = rf(capsys, "bench", ref, b, "--model", model, "--depth", "0,256", "--fa", "on,off",
                        *ctx, *BENCH, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 2 * 2 * 2 * 2  # builds x fa x depths x (pp, tg)
    for r in rows:
        assert {"prefix", "backend", "test", "n_prompt", "n_gen", "depth", "ubatch", "fa", "env", "t_s",
                "stddev", "gate"} <= set(r)
        assert r["status"] == "ok" and r["gate"] == "passed" and r["t_s"] > 0 and r["backend"] == "cpu"
        assert r["build"]["stamp"] and r["model"]["sha256"] and r["host"]["kernel"] == os.uname().release
    assert {(r["test"], r["depth"], r["fa"]) for r in rows if r["prefix"] == str(b)} == {
        (t, d, f) for t in ("pp", "tg") for d in (0, 256) for f in (True, False)}
    assert "-DGGML_LLAMAFILE=OFF" in {f for r in rows if r["prefix"] == str(b) for f in r["build"]["flags"]}

    # results: list, show, export as CSV and JSON
    assert rf(capsys, "results", "list")[0] == 0
    code, out, _ = rf(capsys, "results", "export", "--csv")
    assert code == 0 and out.splitlines()[0].startswith("id,run,kind,status")
    assert sum(1 for line in out.splitlines() if ",bench,ok," in line) == 16
    plot = tmp_path / "plot.html"
    assert rf(capsys, "results", "plot", "-o", plot)[0] == 0 and "<svg" in plot.read_text()

    # a llama-bench that runs out of memory mid-matrix: a KV cache of 10^8 tokens cannot be
    # allocated; that run's rows are recorded as failed and the next variant still runs
    code, out, err = rf(capsys, "bench", ref, "--model", model, "--depth", "0,100000000", "--fa", "off,on",
                        "--no-gate", *BENCH, "--json")
    rows = json.loads(out)
    assert code == 1
    failed = [r for r in rows if r["status"] == "failed"]
    assert {r["depth"] for r in failed} == {100000000} and len(failed) == 4
    assert all("llama-bench" in r["error"] for r in failed)
    assert {(r["fa"], r["depth"]) for r in rows if r["status"] == "ok"} == {(False, 0), (True, 0)}

    # the warm-up: a CPU build runs none by default, one discarded run when asked (not a row)
    def last_run_info() -> dict:
        row = sqlite3.connect(paths.data_dir() / "results.sqlite3").execute(
            "SELECT info FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        return json.loads(row[0])

    for flag, warmed in (([], False), (["--warmup"], True)):
        code, out, err = rf(capsys, "bench", ref, "--model", model, "--no-gate", *flag, *BENCH, "--json")
        assert code == 0, err
        assert len(json.loads(out)) == 2  # pp and tg at depth 0: the warm-up leaves no row
        assert (str(ref) in last_run_info()["warmup_s"]) is warmed

    # tune: the default cpu build (reused, not rebuilt) and the no-sgemm build
    code, out, err = rf(capsys, "tune", "llama-cpp", "--target", "gfx1151", "--model", model, "--backends", "cpu",
                        "--source", llama_tree, "--build", b, "--ubatch", "32,64,128", *ctx, *BENCH, "--json")
    assert code == 0, err
    t = json.loads(out)
    assert [c["gate"] for c in t["candidates"]] == ["passed", "passed"]
    # 2 flash-attention settings x 3 micro-batches x 2 KV cache types (this tree's llama-bench has
    # -ctk/-ctv): q8_0 without flash attention counts in the product but is never measured
    assert all(c["measured"] <= c["cross_product"] == 12 for c in t["candidates"])
    assert set(t["preset"]["ranges"]) == {"short", "long"}
    assert (ref / "rocforge-manifest.toml").stat().st_mtime_ns == ref_manifest
    for r in t["preset"]["ranges"].values():
        assert r["prefix"] in (str(ref), str(b)) and r["figures"] and r["argv"][0].endswith("llama-server")
        # verified at its own shape before it was stored: the range's context, its -ub and fa
        assert r["verified"]["shape"]["ctx"] == r["ctx"] and r["verified"]["shape"]["ubatch"] == r["variant"]["ubatch"]
    code, out, _ = rf(capsys, "preset", "show", "tiny", "--shell")
    assert code == 0 and out.startswith("#!/bin/sh")
    script = tmp_path / "preset.sh"
    script.write_text(out)
    served_by_the_preset(script, tmp_path)

    # the wrong build replaces b: the rebuild's automatic recheck catches it
    wrong = recipe_variant(tmp_path / "rc", options={"GGML_LLAMAFILE": False}, patch=WRONG_PATCH)
    code, out, err = rf(capsys, *build_args(llama_tree, wrong, "--prefix", b))
    assert code == 0, err
    assert "WRONG: the new build" in out and "wrong" in out.split("verdict", 1)[1]
    code, out, _ = rf(capsys, "verify", b, "--model", model, *ctx, "--json")
    v = json.loads(out)
    assert code == 1 and not v["passed"]
    assert all(c["kld_mean"] > 0.005 and not c["passed"] for c in v["checks"])
    # it never wins: tune gates it out
    code, out, err = rf(capsys, "tune", "llama-cpp", "--target", "gfx1151", "--model", model, "--backends", "cpu",
                        "--source", llama_tree, "--build", b, "--ubatch", "64", "--fa", "off", *ctx, *BENCH,
                        "--contexts", "short", "--json")
    t = json.loads(out)
    assert [c["gate"] for c in t["candidates"]] == ["passed", "failed"]
    assert t["preset"]["ranges"]["short"]["prefix"] == str(ref)
    # --timeout: a run over it is stopped and recorded failed, so that variant cannot win (as flash
    # attention that falls back to the CPU at depth); here no run can finish in 1 ms
    code, out, err = rf(capsys, "tune", "llama-cpp", "--target", "gfx1151", "--model", model, "--backends", "cpu",
                        "--source", llama_tree, "--ubatch", "64", "--fa", "off", *ctx, *BENCH,
                        "--contexts", "short", "--timeout", "0.001")
    assert code != 0 and "no variant finished its runs" in err and "no preset was made" in err

    # Ctrl-C in the middle of a bench: one line, finished rows kept
    ctrl_c_keeps_finished_rows(ref, model)


def served_by_the_preset(script: Path, tmp_path: Path) -> None:
    """The preset's script really runs the model: its llama-server (given a port) loads it and
    answers /health with 200; then the script's process group is stopped."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(["sh", str(script), "--host", "127.0.0.1", "--port", str(port), "-t", JOBS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "ROCFORGE_RANGE": "long"})
    try:
        deadline, status = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None and status != 200:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    status = r.status
            except OSError:
                time.sleep(0.3)
        assert status == 200, proc.poll()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def ctrl_c_keeps_finished_rows(prefix: Path, model: Path) -> None:
    db = paths.data_dir() / "results.sqlite3"
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM rows").fetchone()[0]
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "bench", prefix, "--model", str(model),
                             "--no-gate", "--ubatch", "16,32,64,128,256,512", "--reps", "3", "--threads", JOBS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)

    def rows() -> int:
        try:
            return sqlite3.connect(db).execute("SELECT COUNT(*) FROM rows").fetchone()[0] - before
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 300
    while rows() < 1 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(lines) == 1 and "finished rows are kept" in lines[0] and "Traceback" not in err
    kept = rows()
    assert 1 <= kept < 12
    status = sqlite3.connect(db).execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchall()
    assert status == [("interrupted",)]
