"""Bench rows as a share of what the device can do: weight bytes per token (dense, mixture of
experts) counted from real GGUF files, generation as % of the memory bandwidth (measured by
`rocforge kernels bench` before the target's specified peak), prompt processing as % of the FP16
GEMM peak, no figure for CPU builds, and the figures carried by `results show|export|plot` and by
a whole `rocforge bench` run."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import fixtures_roots as fr
import numpy as np
import pytest
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.measure import bench, gguf, plot, roofline
from rocforge_build.measure.session import describe
from rocforge_build.measure.store import Store

DATA = Path(__file__).parent / "data"
# tests/tiny_gguf.py "tiny": n_vocab 1024, n_embd 256, 2 layers, 4 heads of 64, 2 KV heads
# (K/V rows 2 x 64 = 128), n_ff 512; matrices F16 (2 bytes), norms F32 (4 bytes, 256 each).
#   per layer: 2 norms            2 x 256 x 4          =   2,048
#              q, output          2 x 256 x 256 x 2    = 262,144
#              k, v               2 x 128 x 256 x 2    = 131,072
#              gate, up, down     3 x 512 x 256 x 2    = 786,432  -> 1,181,696 a layer
#   2 layers 2,363,392 + output_norm 1,024 + output 1024 x 256 x 2 = 524,288
#   + token_embd: a row lookup, one row of 256 x 2 = 512 bytes          -> 2,889,216 bytes
TINY_BYTES_PER_TOKEN = 2_889_216
# matrices only: per layer 65,536 x 2 (q, o) + 32,768 x 2 (k, v) + 131,072 x 3 (ffn) = 589,824;
# x 2 layers + output 262,144 (token_embd is a lookup, no GEMM)      -> 1,441,792 parameters
TINY_PARAMETERS = 1_441_792
GFX1151_GBS, GFX1151_TFLOPS = 256, 59.4  # AMD's Ryzen AI Max+ 395 page (data/targets.toml)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_dense_model_bytes_and_parameters_per_token(tiny):
    cost = gguf.check(tiny).per_token()
    assert (cost.bytes, cost.parameters) == (TINY_BYTES_PER_TOKEN, TINY_PARAMETERS)
    assert cost.note.startswith("dense")


def _moe(path: Path, *, counts: bool = True, tied: bool = False) -> Path:
    """A llama-shaped mixture of experts in F16: 8 experts, 2 used per token, n_embd 64, expert
    n_ff 32, a router, one attention matrix, an output matrix, vocabulary 100."""
    import gguf as gguf_writer

    w = gguf_writer.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    if counts:
        w.add_expert_count(8)
        w.add_expert_used_count(2)
    f16 = np.float16
    w.add_tensor("token_embd.weight", np.zeros((100, 64), f16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), f16))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((8, 64), np.float32))  # the router: dense
    w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((8, 32, 64), f16))
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((8, 32, 64), f16))
    w.add_tensor("blk.0.ffn_down_exps.weight", np.zeros((8, 64, 32), f16))
    if not tied:
        w.add_tensor("output.weight", np.zeros((100, 64), f16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_moe_reads_only_the_experts_a_token_uses(tmp_path):
    cost = gguf.check(_moe(tmp_path / "moe.gguf")).per_token()
    # experts: 3 tensors x 8 experts x 32 x 64 x 2 bytes = 98,304 bytes, of which 2/8 = 24,576;
    # dense: attn_q 64 x 64 x 2 = 8,192, router 8 x 64 x 4 = 2,048, output 100 x 64 x 2 = 12,800,
    # token_embd one row 64 x 2 = 128                            -> 24,576 + 23,168 = 47,744
    assert cost.bytes == 47_744
    # parameters: experts 3 x 8 x 2,048 x 2/8 = 12,288; attn_q 4,096, router 512, output 6,400
    assert cost.parameters == 23_296
    assert "2 of 8 experts" in cost.note
    # tied embeddings: no output.weight, token_embd (100 x 64 x 2 = 12,800) is the output matrix,
    # read whole instead of one 128-byte row: 47,744 - 12,800 - 128 + 12,800 = 47,616
    tied = gguf.check(_moe(tmp_path / "tied.gguf", tied=True)).per_token()
    assert (tied.bytes, tied.parameters) == (47_616, 23_296) and "tied" in tied.note
    whole = gguf.check(_moe(tmp_path / "counted-whole.gguf", counts=False)).per_token()
    assert whole.bytes is None and "expert_count" in whole.note  # never a dense guess


def _row(t_s: float, test: str = "tg", *, backend: str = "hip", gpus=("gfx1151",), target="gfx1151",
         bytes_per_token: int = 4_000_000_000, params: int = 8_000_000_000) -> dict:
    """A row as bench.row_from builds it from llama-bench's JSON and a run's provenance."""
    result = {"n_prompt": 512 if test == "pp" else 0, "n_gen": 128 if test == "tg" else 0,
              "n_depth": 0, "avg_ts": t_s, "stddev_ts": 0.1}
    base = {"prefix": f"/b/llama-{backend}", "backend": backend, "gate": "passed", "env": {},
            "model": {"name": "m", "bytes_per_token": bytes_per_token, "active_parameters": params},
            "host": {"gpus": [{"gfx": g} for g in gpus]}, "build": {"backend": backend, "target": target},
            "model_sha256": "m"}
    return bench.row_from(result, base)


def test_generation_as_share_of_the_specified_bandwidth():
    # a 4 GB model at 12.8 t/s reads 51.2 GB/s: 20 % of gfx1151's specified 256 GB/s
    row = _row(12.8)
    c = row["ceiling"]
    assert c["tg_pct_of_bandwidth"] == 20.0 and c["bandwidth_gbs"] == GFX1151_GBS
    assert c["bandwidth_source"] == "specified peak of gfx1151 (data/targets.toml)"
    assert c["pp_pct_of_gemm_peak"] is None and c["why_none"] is None
    assert describe(row) == "tg128 @ d0: 12.80 ± 0.10 t/s (20 % of 256 GB/s specified)"


def test_prompt_processing_as_share_of_the_gemm_peak():
    # 8 B parameters at 1,000 t/s: 2 x 8e9 x 1e3 = 16 TFLOP/s of 59.4 = 26.94 %
    c = _row(1000.0, "pp")["ceiling"]
    assert c["pp_pct_of_gemm_peak"] == 26.9 and c["gemm_peak_tflops"] == GFX1151_TFLOPS
    assert c["gemm_source"] == "specified FP16 peak of gfx1151 (data/targets.toml)"
    assert c["tg_pct_of_bandwidth"] is None


def _fake_kernels(tmp_path: Path) -> Path:
    """A kernels build whose harness is tests/data/fake_kernel_harness.py (NumPy, no GPU)."""
    from rocforge_build.kernels import runner

    out = tmp_path / "kernels"
    out.mkdir()
    exe = out / "rocforge-kernels"
    exe.write_text(f"#!{sys.executable}\n" + (DATA / "fake_kernel_harness.py").read_text())
    exe.chmod(0o755)
    (out / runner.MANIFEST).write_text(json.dumps({"target": "gfx1151", "platform": "amd", "binary": str(exe)}))
    return out


def test_measured_copy_bandwidth_beats_the_specified_peak(tmp_path, capsys, monkeypatch):
    from rocforge_build.kernels import runner

    kernels = _fake_kernels(tmp_path)
    # --quick copies a few MB: start-up costs, not bandwidth; it is never kept as a ceiling
    assert cli.main(["kernels", "bench", "--out", str(kernels), "--quick", "--only", "memcpy",
                     "--iters", "1", "--json"]) == 0
    capsys.readouterr()
    assert not roofline.measured_path().exists()
    assert _row(12.8)["ceiling"]["bandwidth_source"].startswith("specified")
    # a full run (its 256 MiB copy made 4 MiB: NumPy stands in for the GPU, the size is not the point)
    full = runner.table()
    monkeypatch.setattr(runner, "table", lambda: {**full, "bench": [
        {**e, "n": 1 << 20} if e["kernel"] == "memcpy" else e for e in full["bench"]]})
    assert cli.main(["kernels", "bench", "--out", str(kernels), "--only", "memcpy", "--iters", "1",
                     "--json"]) == 0
    memcpy = json.loads(capsys.readouterr().out)["results"][0]
    saved = json.loads(roofline.measured_path().read_text())["gfx1151"]
    assert saved["memcpy_gbs"] == round(memcpy["gbs"], 1)
    c = _row(12.8)["ceiling"]
    assert c["bandwidth_gbs"] == saved["memcpy_gbs"]
    assert c["bandwidth_source"] == f"measured: rocforge kernels bench memcpy on {saved['measured']}"
    assert c["tg_pct_of_bandwidth"] == round(100 * 12.8 * 4e9 / (saved["memcpy_gbs"] * 1e9), 1)
    assert c["gemm_source"].startswith("specified")  # rocforge's own GEMM is no ceiling
    assert cli.main(["kernels", "bench", "--out", str(kernels), "--only", "memcpy", "--iters", "1"]) == 0
    assert f"memcpy bandwidth saved in {roofline.measured_path()}" in capsys.readouterr().out


def test_a_hand_edited_measurement_is_not_believed():
    roofline.measured_path().parent.mkdir(parents=True, exist_ok=True)
    for bad in ('{"gfx1151": {"memcpy_gbs": -5}}', '{"gfx1151": {"memcpy_gbs": "fast"}}', "not json",
                '["gfx1151"]'):
        roofline.measured_path().write_text(bad)
        assert _row(12.8)["ceiling"]["bandwidth_source"].startswith("specified")


def test_cpu_rows_get_no_figure():
    row = _row(12.8, backend="cpu", gpus=("gfx1151",))
    c = row["ceiling"]
    assert c["device"] is None and c["bandwidth_gbs"] is None and c["tg_pct_of_bandwidth"] is None
    assert "CPU build" in c["why_none"] and "does not invent" in c["why_none"]
    assert "%" not in describe(row)


def test_a_target_the_host_lacks_gets_no_other_devices_figure():
    # a Vulkan build "for gfx1100" run on a host with no AMD GPU (the H100 runs): not 960 GB/s
    c = _row(12.8, backend="vulkan", gpus=(), target="gfx1100")["ceiling"]
    assert c["bandwidth_gbs"] is None and "no AMD GPU was detected" in c["why_none"]
    # a gfx1151 running a gfx1100 build (HSA_OVERRIDE_GFX_VERSION): the GPU that ran it counts
    assert _row(12.8, target="gfx1100")["ceiling"]["bandwidth_gbs"] == GFX1151_GBS
    two = _row(12.8, target="gfx1030", gpus=("gfx1100", "gfx1151"))["ceiling"]
    assert two["bandwidth_gbs"] is None and "which one ran it" in two["why_none"]


def _fake_llama_build(tmp_path: Path, tg_ts: float, pp_ts: float) -> Path:
    """A HIP build for gfx1151 whose llama-bench prints llama-bench's -o jsonl lines."""
    prefix = tmp_path / "llama-hip"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "rocforge-manifest.toml").write_text(
        'target = "gfx1151"\nbackend = "hip"\n[recipe]\nname = "llama-cpp"\n')
    lines = [json.dumps({"n_prompt": 512, "n_gen": 0, "n_depth": 0, "n_ubatch": 512, "avg_ts": pp_ts,
                         "stddev_ts": 1.0}),
             json.dumps({"n_prompt": 0, "n_gen": 128, "n_depth": 0, "n_ubatch": 512, "avg_ts": tg_ts,
                         "stddev_ts": 0.5})]
    exe = prefix / "bin" / "llama-bench"
    exe.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    exe.chmod(0o755)
    return prefix


def test_bench_results_and_plot_carry_the_figures(tmp_path, tiny, capsys, monkeypatch):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "r.sqlite3"))
    root = tmp_path / "root"
    fr.make_gpus(root, fr.STRIX_HALO)  # the host's KFD topology: one gfx1151
    # tiny at 44,303.4 t/s reads 44,303.4 x 2,889,216 = 128.0 GB/s: 50 % of 256 GB/s;
    # pp at 4,119,900 t/s: 2 x 1,441,792 x 4,119,900 = 11.88 TFLOP/s: 20 % of 59.4
    prefix = _fake_llama_build(tmp_path, 44_303.4, 4_119_900.0)
    assert cli.main(["--root", str(root), "bench", str(prefix), "--model", str(tiny), "--no-gate",
                     "--no-warmup", "--reps", "1", "--json"]) == 0
    rows = {r["test"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tg"]["ceiling"]["model_bytes_per_token"] == TINY_BYTES_PER_TOKEN
    assert rows["tg"]["ceiling"]["tg_pct_of_bandwidth"] == 50.0
    assert rows["pp"]["ceiling"]["pp_pct_of_gemm_peak"] == 20.0

    assert cli.main(["results", "show"]) == 0
    shown = capsys.readouterr().out
    assert "(50 % of 256 GB/s specified)" in shown and "(20 % of 59.4 FP16 TFLOPS specified)" in shown
    # the variant as bench names it (it read `ub=512 fa=False env={}`)
    assert f"  {prefix} ub=512 fa=0  tg128 @ d0" in shown
    assert "None" not in shown and "{}" not in shown
    assert cli.main(["results", "export", "--json"]) == 0
    exported = {r["test"]: r for r in json.loads(capsys.readouterr().out)}
    assert exported["tg"]["ceiling"] == rows["tg"]["ceiling"]
    assert cli.main(["results", "export", "--csv"]) == 0
    table = {r["test"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert table["tg"]["ceiling_tg_pct_of_bandwidth"] == "50.0"
    assert table["tg"]["ceiling_bandwidth_source"] == "specified peak of gfx1151 (data/targets.toml)"
    assert table["pp"]["ceiling_pp_pct_of_gemm_peak"] == "20.0"
    assert cli.main(["results", "compare", "1", "1"]) == 0  # the run against itself: no change
    out = capsys.readouterr().out
    assert "44303.40   44303.40    +0.0%   50.0%   50.0%  ok" in out and "20.0%   20.0%  ok" in out
    page = tmp_path / "plot.html"
    assert cli.main(["results", "plot", "-o", str(page)]) == 0
    text = page.read_text()
    assert "at depth 0 (50 % of 256 GB/s specified)</title>" in text  # the point's hover
    assert "tg: % of 256 GB/s, specified peak of gfx1151 (data/targets.toml)" in text  # the legend


def test_rows_stored_before_the_ceiling_still_plot_and_show(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "r.sqlite3"))
    old = {"prefix": "/b/llama-hip", "backend": "hip", "test": "tg", "n_prompt": 0, "n_gen": 128,
           "depth": 0, "ubatch": 512, "fa": True, "env": {}, "t_s": 50.0, "stddev": 0.1, "status": "ok"}
    with Store() as s:
        s.add_row(s.start_run("bench"), "bench", old)
    assert cli.main(["results", "show"]) == 0
    assert "tg128 @ d0: 50.00 ± 0.10 t/s\n" in capsys.readouterr().out
    assert "50.0 t/s at depth 0</title>" in plot.page([old], "old")


def test_an_empty_embedding_table_is_counted_not_a_crash(tmp_path):
    # a hostile or broken header: token_embd with no rows (64 x 0) must not divide by zero
    import gguf as gguf_writer

    path = tmp_path / "empty-embd.gguf"
    w = gguf_writer.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((0, 64), np.float16))
    w.add_tensor("output.weight", np.zeros((100, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cost = gguf.check(path).per_token()
    assert (cost.bytes, cost.parameters) == (100 * 64 * 2, 100 * 64)  # the output matrix only
