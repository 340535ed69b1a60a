"""verify's coverage, per-type limits and like-with-like PPL; tune's ranking and noise-aware
settling; presets as a history, their exports, and serve — without builds (the real runs are in
test_verify_shapes.py).  Each test states the right answer and where it comes from."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.measure import bench, gguf, tune, verify
from rocforge_build.measure.store import Store


@pytest.fixture(scope="module")
def model8k(tmp_path_factory):
    """A llama of 2 layers trained (as its metadata says) at 8192 tokens, like SmolLM2-135M."""
    return gguf.check(write_gguf(tmp_path_factory.mktemp("m") / "m.gguf", n_ctx=8192))


# -- the covering design -----------------------------------------------------------------------
def test_covering_rows_hold_every_value_and_start_with_the_firsts():
    dims = [[8192, 2048, 512], [2048, 256], [True, False], [99, 1]]
    rows = verify.covering(dims)
    assert rows[0] == (8192, 2048, True, 99)  # the longest context, largest ubatch, fa on, full offload
    for i, values in enumerate(dims):
        assert {r[i] for r in rows} == set(values)
    assert len(rows) == 3  # max(len) rows, not the product's 24


def test_default_coverage_for_a_cpu_and_a_gpu_build(model8k):
    cpu = verify.plan(model8k, gpu=False)
    # 32768 is past the model's 8192 training context: bounded, and said so
    assert [(s.ctx, s.ubatch, s.fa, s.ngl) for s in cpu.shapes] == [
        (8192, 2048, True, None), (2048, 256, False, None), (512, 2048, True, None)]
    assert cpu.bounds == ["the model's training context (8192)"]
    gpu = verify.plan(model8k, gpu=True)
    # GPU builds add a partial offload: half of the 2 layers
    assert {s.ngl for s in gpu.shapes} == {99, 1} and gpu.shapes[0].ngl == 99


def test_quick_and_max_ctx_bound_the_contexts(model8k):
    quick = verify.plan(model8k, gpu=False, quick=True)
    assert {s.ctx for s in quick.shapes} == {512}
    assert {s.ubatch for s in quick.shapes} == {256, 2048} and {s.fa for s in quick.shapes} == {True, False}
    low = verify.plan(model8k, gpu=False, max_ctx=2048)
    assert max(s.ctx for s in low.shapes) == 2048 and "--max-ctx 2048" in low.bounds


def test_a_short_text_bounds_the_contexts(model8k):
    cov = verify.bound_by_text(verify.plan(model8k, gpu=False), 5000)
    # llama-perplexity needs 2 x ctx tokens: 5000 tokens allow 2048 (the power of two <= 2500)
    assert max(s.ctx for s in cov.shapes) == 2048
    assert any("text's length (5000 tokens" in b for b in cov.bounds)
    with pytest.raises(verify.VerifyError):
        verify.bound_by_text(cov, 20)


def report_lines(capsys, coverage: verify.Coverage) -> list[str]:
    from types import SimpleNamespace

    from rocforge_build.commands.verify import report

    checks = [verify.Check(s.ctx, 0.001, 0.99, 10.0, 10.0, s.ubatch, s.fa, s.ngl, passed=True).to_json()
              for s in coverage.shapes]
    report(SimpleNamespace(prefix="/b"), SimpleNamespace(prefix="/ref"),
           {"passed": True, "coverage": coverage.to_json(), "checks": checks})
    return capsys.readouterr().out.splitlines()


def test_verify_says_what_it_covered_and_what_bounded_it(model8k, capsys):
    # a GPU build, --max-ctx 4096: the contexts 32768 and 8192 come down to 4096 (the model's 8192
    # bounds nothing below 4096); half of the 2 layers is the partial offload
    lines = report_lines(capsys, verify.plan(model8k, gpu=True, max_ctx=4096))
    assert lines[:3] == ["/b against /ref: PASSED",
                         "  covered: contexts 512, 2048, 4096; micro-batches 256, 2048; flash attention on "
                         "and off; -ngl 99, 1",
                         "  bounded by: --max-ctx 4096"]
    # a CPU build (no -ngl), bounded by the model's training context and then by a 5000-token text
    cov = verify.bound_by_text(verify.plan(model8k, gpu=False), 5000)
    assert report_lines(capsys, cov)[1:3] == [
        "  covered: contexts 512, 2048; micro-batches 256, 2048; flash attention on and off",
        "  bounded by: the model's training context (8192); the text's length (5000 tokens: contexts up to 2048)"]
    # nothing bounded it: no such line
    lines = report_lines(capsys, verify.Coverage([verify.Shape(512, 256, False)]))
    assert lines[1] == "  covered: contexts 512; micro-batches 256; flash attention off"
    assert not any("bounded by" in line for line in lines)


def test_a_tiny_negative_mean_kld_prints_as_zero(capsys):
    # llama-perplexity's floating-point sums leave a KLD of identical logits at about -1e-9; KLD is
    # never negative, so the table says 0.000000; a clearly negative figure stays visible
    from types import SimpleNamespace

    from rocforge_build.commands.verify import report

    cov = verify.Coverage([verify.Shape(512, 256, False), verify.Shape(2048, 256, False)])
    checks = [verify.Check(512, -3e-9, 1.0, 10.0, 10.0, 256, False, None, passed=True).to_json(),
              verify.Check(2048, -0.25, 1.0, 10.0, 10.0, 256, False, None, passed=True).to_json()]
    report(SimpleNamespace(prefix="/b"), SimpleNamespace(prefix="/ref"),
           {"passed": True, "coverage": cov.to_json(), "checks": checks})
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert [r[4] for r in rows if r[0] in ("512", "2048")] == ["0.000000", "-0.250000"]
    assert verify.kld_shown(-0.0) == 0.0 and str(verify.kld_shown(-0.0)) == "0.0"


def test_shipped_text_is_pride_and_prejudice_long_enough_for_32768():
    text = verify.text_file().read_text(encoding="utf-8")
    assert text.startswith("PRIDE AND PREJUDICE") and "It is a truth universally acknowledged" in text
    # >= 70K tokens at the ~4.2 characters a token common 32K-49K BPE vocabularies reach on English
    # prose: 684,768 characters; SmolLM2's tokenizer made 8192 + 8192 tokens of its first ~75 K words
    assert len(text) > 4.2 * 70_000 * 2


# -- limits: like with like, per type -----------------------------------------------------------
def test_reference_ppl_is_its_own_final_estimate():
    out = "...\n[1]17.38,[2]17.33,\nFinal estimate: PPL = 17.3358 +/- 0.62417\n"
    assert verify.parse_final_ppl(out) == 17.3358


def test_quantized_models_get_their_measured_limits():
    _, _, f16 = verify.rules("F16")
    _, _, q4 = verify.rules("Q4_0")
    lim = {t.metric: t.limit for t in f16}
    qlim = {t.metric: t.limit for t in q4}
    assert lim == {"kld_mean": 0.005, "top1": 0.95, "ppl_ratio": 1.01}
    # each measured type its own (a right Vulkan build on the H100, per type: Q8_0 <= 0.00367 KLD,
    # >= 95.6 % top-1; Q4_1 <= 0.00372, >= 95.2 %; Q4_0 <= 0.00401, >= 95.1 %; PPL ratio <= 1.0021)
    assert qlim == {"kld_mean": 0.012, "top1": 0.931, "ppl_ratio": 1.02}
    per_type = {ft: {t.metric: t.limit for t in verify.rules(ft)[2]} for ft in ("Q8_0", "Q4_1", "Q4_K_M")}
    assert per_type["Q8_0"] == {"kld_mean": 0.011, "top1": 0.936, "ppl_ratio": 1.02}
    assert per_type["Q4_1"] == {"kld_mean": 0.0112, "top1": 0.932, "ppl_ratio": 1.02}
    # a type never measured: the loosest measured limits, and the reason says it was not measured
    assert per_type["Q4_K_M"] == {"kld_mean": 0.012, "top1": 0.93, "ppl_ratio": 1.02}
    assert "not measured" in next(t.reason for t in verify.rules("Q4_K_M")[2] if t.metric == "kld_mean")
    assert "Q8_0 weights" in next(t.reason for t in verify.rules("Q8_0")[2] if t.metric == "kld_mean")
    # the right builds measured pass their type's limits (Q4_0's worst check, Q8_0's worst check)
    right_q4_0 = verify.judge(verify.Check(2048, 0.00401, 0.95064, 22.9143, 22.976, 256, False), q4, 49152)
    assert right_q4_0.passed
    q8 = verify.rules("Q8_0")[2]
    assert verify.judge(verify.Check(2048, 0.00367, 0.956, 22.9, 22.93, 256, False), q8, 49152).passed
    # the flash-attention fault of test_verify_shapes.py on the trained Q4_1 model, at 512 tokens
    wrong = verify.judge(verify.Check(512, 0.29538, 0.72255, 23.4546, 17.3358, 2048, True), q4, 49152)
    assert not wrong.passed and len(wrong.failed) == 3


def test_failures_are_attributed_to_flash_attention_only_when_they_follow_it():
    def c(fa, passed, ctx=512):
        return verify.Check(ctx, 0, 1, 1, 1, 256, fa, None, passed=passed)

    # wrong with fa on; the same shape with fa off passes: fa off stays usable
    assert verify.verdicts([c(True, False), c(False, True)]) == {"on": "failed", "off": "passed"}
    # a failure with fa off at a shape never tried with fa on condemns both
    assert verify.verdicts([c(True, True), c(False, False, ctx=2048)]) == {"on": "failed", "off": "failed"}
    assert verify.verdicts([c(True, True), c(False, True)]) == {"on": "passed", "off": "passed"}


# -- tune: ranking and settling -----------------------------------------------------------------
def rows(pp, tg, depth=0):
    return [{"test": "pp", "depth": depth, "status": "ok", "t_s": pp},
            {"test": "tg", "depth": depth, "status": "ok", "t_s": tg}]


def test_every_measured_variant_is_ranked_for_every_range():
    a, b = bench.Variant(512, True), bench.Variant(256, False)
    cand = tune.Candidate(object())
    cand.measured = {a: rows(100, 100) + rows(50, 50, 4096), b: rows(90, 90) + rows(80, 80, 4096)}
    # each range ranks both, whichever range's search measured them
    assert [v for _, _, v in tune.ranking([cand], 0)] == [a, b]
    assert [v for _, _, v in tune.ranking([cand], 4096)] == [b, a]


def settle_with(first: dict, repeats: dict, default=None, rounds=3):
    cand = tune.Candidate(object())
    cand.measured = {v: rows(s, s) for v, s in first.items()}
    queue = {v: list(r) for v, r in repeats.items()}
    clock = [0.0]

    def remeasure(c, v):
        clock[0] += 1
        score = queue[v].pop(0)
        return rows(score, score)

    out = tune.settle([cand], 0, remeasure, default or {"fa": True, "ubatch": 512}, rounds=rounds,
                      deadline=100.0, clock=lambda: clock[0])
    return out, cand


def test_a_lead_beyond_the_noise_is_kept():
    a, b = bench.Variant(256, True), bench.Variant(512, True)
    out, cand = settle_with({a: 110, b: 100}, {a: [111, 110], b: [100, 101]})
    assert out["ranked"][0][2] == a and "beyond the" in out["note"]
    assert len(cand.samples[a]) == 2  # one repeat each told them apart (spread 1 < lead ~10)


def test_a_tie_within_the_noise_goes_to_the_defaults():
    near, far = bench.Variant(512, True), bench.Variant(2048, False)
    # far leads (mean 101.4 against 100.2) by less than the spread between repetitions (9): a tie
    out, _ = settle_with({far: 102, near: 100}, {far: [101, 106, 97, 101], near: [104, 96, 101, 100]})
    assert out["ranked"][0][2] == near and "closer to the recipe's defaults" in out["note"]


def test_the_default_search_starts_at_the_defaults_and_the_next_range_where_the_last_ended():
    # fa off wins everywhere; the micro-batch peaks at 1024 at depth 0 and at 2048 at depth 4096.
    # The first run is ub 512 with fa off (it has no pace to be raced against, so it must be the
    # setting that does not stall), the second the recipe's defaults (fa on, ub 512); then ub on
    # the fa-off plane (3 more), fa again at 1024 (1 more); the long range starts at (off, 1024)
    # and adds nothing new but 2048's fa-on point: 7 of 8 at most.
    peak = {0: {256: 0.7, 512: 0.9, 1024: 1.0, 2048: 0.95}, 4096: {256: 0.6, 512: 0.8, 1024: 0.9, 2048: 1.0}}
    order = []

    def measure(v):
        order.append(v)
        return [r for d in (0, 4096) for r in rows(*(2 * [100 * peak[d][v.ubatch] * (0.5 if v.fa else 1)]), d)]

    cand = tune.Candidate(object())
    dims = [[True, False], [256, 512, 1024, 2048]]
    best = tune.search(cand, dims, [], {"short": 0, "long": 4096}, measure)
    assert order[:2] == [bench.Variant(512, False), bench.Variant(512, True)]
    assert (best["short"]["variant"], best["long"]["variant"]) == (bench.Variant(1024, False), bench.Variant(2048, False))
    assert len(order) == len(set(order)) < 8  # nothing measured twice, fewer than the cross product


def test_screening_uses_one_repetition_never_more_than_asked(model8k):
    assert tune.screening(bench.Spec(model8k, reps=3)).reps == 1
    assert tune.screening(bench.Spec(model8k, reps=1)).reps == 1


def test_settling_repeats_screenings_unraced_and_exhaustive_runs_the_full_reps(model8k):
    spec = bench.Spec(model8k, reps=3, timeout=60)
    race = tune.Race(factor=2.0, floor_s=3.0, fastest=4.0)
    searching = tune.run_spec(spec, race, settling=False)
    assert (searching.reps, searching.timeout) == (1, 8.0)  # one repetition, raced at 2 x 4 s
    settling = tune.run_spec(spec, race, settling=True)
    assert (settling.reps, settling.timeout) == (1, 60)  # the leaders are the pace: the user's limit
    assert tune.run_spec(spec, None, settling=False) is spec  # --exhaustive: 3 repetitions, as asked
    assert tune.run_spec(spec, None, settling=True) is spec


def test_a_stored_figure_is_the_mean_over_every_run_of_the_variant():
    from rocforge_build.measure.tune_choice import pooled_rows

    def run(pp, tg, sd=0.0):
        return [{"test": "pp", "depth": 0, "status": "ok", "t_s": pp, "stddev": sd},
                {"test": "tg", "depth": 0, "status": "ok", "t_s": tg, "stddev": sd},
                {"test": "tg", "depth": 4096, "status": "failed", "t_s": None, "stddev": None}]
    got = {r["test"]: r for r in pooled_rows([run(100, 10), run(110, 12), run(90, 8)], 0)}
    assert got["pp"]["t_s"] == pytest.approx(100) and got["pp"]["stddev"] == pytest.approx(10)
    assert got["tg"]["t_s"] == pytest.approx(10) and got["tg"]["stddev"] == pytest.approx(2)
    one = {r["test"]: r for r in pooled_rows([run(100, 10, sd=3.5)], 0)}
    assert one["pp"]["stddev"] == 3.5  # one run: llama-bench's own spread over its repetitions
    assert pooled_rows([run(100, 10)], 4096) == []  # a failed row is no figure


def bench_stub(tmp_path: Path, script: str):
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)

    class Build:
        gpu = False
        runtime_env: dict = {}

        def program(self, name):
            return exe
    return Build()


def test_the_race_stops_a_slow_run_and_keeps_what_it_finished(tmp_path, model8k):
    # llama-bench prints depth 0's rows first, then hangs at depth (as flash attention falling back
    # to the CPU did on the H100): the race stops it at 2 x the fastest run (0.6 s), not after the
    # user's 60 s, and its depth-0 rows still give it a short-range score
    build = bench_stub(tmp_path, """
echo '{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 900.0, "stddev_ts": 1.0}'
echo '{"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 90.0, "stddev_ts": 1.0}'
exec sleep 60
""")
    race = tune.Race(factor=2.0, floor_s=0.1, fastest=0.6)
    spec = race.spec(tune.screening(bench.Spec(model8k, depths=(0, 4096), timeout=60)))
    assert spec.timeout == pytest.approx(1.2) and spec.reps == 1
    t0, clock = time.monotonic(), []
    got = bench.run_variant(build, spec, bench.Variant(512, True), {}, (0, 4096), lambda r: None, clock=clock)
    assert time.monotonic() - t0 < 10
    race.record(clock[-1], got, spec)
    assert race.stopped == 1 and race.fastest == 0.6  # a stopped run is no one's pace
    assert tune.range_score(got, 0) == pytest.approx((900 * 90) ** 0.5)
    assert tune.range_score(got, 4096) == float("-inf")
    failed = [r for r in got if r["status"] == "failed"]
    assert {r["depth"] for r in failed} == {4096} and "2x the fastest variant's run (0.6 s)" in failed[0]["error"]


def test_the_race_waits_for_a_complete_run_and_never_loosens_the_users_timeout(model8k):
    race = tune.Race(factor=2.0, floor_s=3.0)
    spec = bench.Spec(model8k, timeout=15)
    assert race.spec(spec) is spec  # no complete run yet: the user's --timeout alone
    race.record(4.0, rows(10, 10), spec)
    assert race.spec(spec).timeout == 8.0
    race.record(0.5, rows(10, 10), spec)
    assert race.spec(spec).timeout == 3.0  # the floor: process start and model load are not a pace
    assert race.spec(bench.Spec(model8k, timeout=2)).timeout == 2  # the user's tighter limit stays
    race.record(0.1, rows(10, 10) + [{"test": "tg", "depth": 4096, "status": "failed", "error": "x"}], spec)
    assert race.fastest == 0.5  # an incomplete run sets no pace


# -- presets: a history, chosen versions, exports -----------------------------------------------
def preset(model="m", score=1.0, env=None, argv=None):
    return {"model": {"name": model, "sha256": "ab" * 32, "path": "/m/m.gguf"}, "created": "now",
            "ranges": {"short": {"prefix": "/p", "backend": "cpu", "stamp": "s1", "depth": 0, "ctx": 4096,
                                 "variant": {}, "variant_label": "ub=512 fa=1", "score": score, "figures": [],
                                 "runner_up": None, "env": env or {},
                                 "argv": argv or ["/p/bin/llama-server", "-m", "/m/m.gguf", "-c", "4096"],
                                 # as tune stores it: the shape it verified, serving dimensions included
                                 "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": False, "ngl": None,
                                                        "kv": "f16", "load": "mmap", "parallel": 1}},
                                 "notes": []}}}


def test_presets_are_a_history_per_model_and_use_picks_a_version(capsys):
    with Store() as s:
        v1 = s.add_preset("m", "ab" * 32, 1, preset(score=1.0))
        assert s.add_preset("other", "cd" * 32, 2, preset(model="other")) == 1  # the other model's own 1
        v2 = s.add_preset("m", "ab" * 32, 3, preset(score=2.0))
    assert (v1, v2) == (1, 2)  # m's own numbers, whatever was stored between them
    assert cli.main(["preset", "history", "m", "--json"]) == 0
    hist = json.loads(capsys.readouterr().out)
    assert [(h["version"], h["run_id"], h["in_use"]) for h in hist] == [(1, 1, False), (2, 3, True)]
    assert cli.main(["preset", "use", "m", "1"]) == 0
    assert "m (sha256 abababababab): preset version 1" in capsys.readouterr().out
    assert cli.main(["preset", "show", "m", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["version"], shown["in_use"], shown["ranges"]["short"]["score"]) == (1, "chosen", 1.0)
    assert cli.main(["preset", "show", "other", "--json"]) == 0  # m's choice is m's alone
    assert json.loads(capsys.readouterr().out)["in_use"] == "newest"
    assert cli.main(["preset", "use", "m", "3"]) == 2  # 3 is a row of the table, not a version of m
    assert "m has no preset version 3" in capsys.readouterr().err


def test_two_models_sharing_a_name_have_their_own_histories(tmp_path, capsys):
    from rocforge_build.measure import provenance

    paths = []
    for quant, seed in (("q4", 0), ("q8", 1)):
        (tmp_path / quant).mkdir()
        paths.append(write_gguf(tmp_path / quant / "model.gguf", seed=seed))
    # one name (as two quantizations of one model share general.name), two files
    assert gguf.check(paths[0]).name == gguf.check(paths[1]).name == "model"
    q4, q8 = (provenance.model_sha256(p) for p in paths)
    with Store() as s:
        for sha, path, score, version in ((q4, paths[0], 4.0, 1), (q8, paths[1], 8.0, 1), (q8, paths[1], 8.5, 2)):
            p = preset("model", score=score)
            p["model"].update(sha256=sha, path=str(path))
            assert s.add_preset("model", sha, None, p) == version
    for argv in (["preset", "show", "model"], ["preset", "history", "model"], ["preset", "use", "model", "1"],
                 ["preset", "export", "model", "--format", "shell"], ["serve", "model", "--dry-run"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert err == [f"rocforge: error: 'model' names 2 models with presets: {q4[:12]} ({paths[0]}), "
                       f"{q8[:12]} ({paths[1]})",
                       "rocforge: hint: pick one: pass its GGUF path or its sha256 (the first 12 hex digits "
                       "are enough)"], argv
    # the path, the sha256 or its first 12 hex digits pick one history
    assert cli.main(["preset", "show", str(paths[0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranges"]["short"]["score"] == 4.0
    assert cli.main(["preset", "history", q8[:12], "--json"]) == 0
    assert [(h["version"], h["data"]["ranges"]["short"]["score"]) for h in json.loads(capsys.readouterr().out)] == [
        (1, 8.0), (2, 8.5)]
    assert cli.main(["preset", "use", q8, "1"]) == 0
    capsys.readouterr()
    for path, score in ((paths[1], 8.0), (paths[0], 4.0)):  # q8's choice leaves q4's newest in use
        assert cli.main(["preset", "show", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["ranges"]["short"]["score"] == score
    assert cli.main(["preset", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"model  sha256 {q4[:12]}  1 version(s)  {paths[0]}",
                                                    f"model  sha256 {q8[:12]}  2 version(s)  {paths[1]}"]


def as_build(prefix: Path, stamp: str = "s1") -> Path:
    """`prefix` made a rocforge build (its manifest, stamp `stamp`), with a bin/llama-server:
    a preset is printed or served only for its own build's program."""
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "rocforge-manifest.toml").write_text(
        f'stamp = "{stamp}"\ntarget = ""\nbackend = "cpu"\n[recipe]\nname = "llama-cpp"\n')
    server = prefix / "bin" / "llama-server"
    if not server.exists():
        server.write_text("#!/bin/sh\n")
        server.chmod(0o755)
    return server


def test_export_quotes_for_systemd_and_llama_swap(tmp_path, capsys):
    hostile = "a b$HOME%i\"q'"
    server = as_build(tmp_path / "p")
    p = preset(env={"GGML_X": hostile}, argv=[str(server), "-m", "/m/m.gguf", "-c", "4096"])
    p["ranges"]["short"]["prefix"] = str(tmp_path / "p")
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["preset", "export", "m", "--format", "systemd", "--port", "8081"]) == 0
    unit = capsys.readouterr().out
    # systemd.unit(5): `%` doubled, `"` escaped inside double quotes; systemd.exec(5): `$` has no
    # special meaning in Environment= (doubled only on command lines, systemd.service(5))
    assert 'Environment="GGML_X=a b$HOME%%i\\"q\'"' in unit
    assert f'ExecStart="{server}" "-m" "/m/m.gguf" "-c" "4096" "--host" "127.0.0.1" "--port" "8081"' in unit
    assert cli.main(["preset", "export", "m", "--format", "llama-swap"]) == 0
    swap = yaml.safe_load(capsys.readouterr().out)  # PyYAML's safe dumper wrote it: any value round-trips
    assert swap["models"]["m"]["env"] == [f"GGML_X={hostile}"]
    assert swap["models"]["m"]["cmd"].endswith("--port ${PORT}")


DUMP_ARGV = r'''#!{python}
import json, os, sys
json.dump({"argv": sys.argv[1:], "GGML_X": os.environ.get("GGML_X")}, open(os.environ["ARGV_OUT"], "w"))
'''


def test_export_shell_runs_exactly_the_presets_command(tmp_path, capsys):
    exe = tmp_path / "bin" / "llama-server"  # writes the argv and env it was started with
    exe.parent.mkdir()
    exe.write_text(DUMP_ARGV.replace("{python}", sys.executable))
    exe.chmod(0o755)
    hostile = "a b$HOME%i\"q'`id`;$(id)"
    argv = [str(exe), "-m", "/m/my model.gguf", "-c", "4096", "--alias", "it's $USER"]
    p = preset(env={"GGML_X": hostile}, argv=argv)
    p["ranges"]["short"]["prefix"] = str(tmp_path)  # the program lies inside its build's prefix
    as_build(tmp_path)
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["preset", "export", "m", "--format", "shell"]) == 0
    script = tmp_path / "m.sh"
    script.write_text(capsys.readouterr().out)
    script.chmod(0o755)
    out = tmp_path / "argv.json"
    # run by bash, by its own #!/bin/sh, and sourced by bash: each time exactly the preset's argv
    # (then the caller's arguments) and env, nothing expanded
    extra = ["--port", "9", "--log-prefix", "a b"]
    for how in (["bash", str(script), *extra], [str(script), *extra],
                ["bash", "-c", 'source "$0" "$@"', str(script), *extra]):
        out.unlink(missing_ok=True)
        subprocess.run(how, env={**os.environ, "ARGV_OUT": str(out)}, check=True, timeout=60)
        assert json.loads(out.read_text()) == {"argv": argv[1:] + extra, "GGML_X": hostile}, how


HELP = """usage: llama-server [options]
  -fa,   --flash-attn [on|off|auto]       set Flash Attention use
  --no-mmap                               do not memory-map model (slower load but may reduce pageouts)
"""
DIO = "  -dio,  --direct-io                      use DirectIO if available\n"


@pytest.mark.parametrize("host, backend, tree_help, added", [
    # Strix Halo (an APU: host facts say igpu), a HIP build of a tree with both flags: both added
    ("strix", "hip", HELP + DIO, ["--no-mmap", "-dio"]),
    # an older tree without -dio: only what it has
    ("strix", "hip", HELP, ["--no-mmap"]),
    # an iGPU beside a dGPU (Raphael + RX 7900 XTX): the server may run on the dGPU, nothing added
    ("igpu+dgpu", "hip", HELP + DIO, []),
    # a CPU build on the APU offloads nothing to GPU memory: nothing added
    ("strix", "cpu", HELP + DIO, []),
])
def test_an_apu_preset_loads_without_mmap_where_the_tree_can(tmp_path, host, backend, tree_help, added):
    import fixtures_roots as fr
    from stackfixtures import make_build

    from rocforge_build.measure import preset as preset_mod
    from rocforge_build.measure import provenance
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.rootfs import Root

    root = tmp_path / "root"
    (fr.make_strix_halo if host == "strix" else fr.make_igpu_dgpu)(root)
    facts = provenance.host(Root(str(root)))  # what tune passes: the host facts of every row
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", backend)
    server = prefix / "bin" / "llama-server"  # answers --help as the tree's llama-server would
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text(f"#!/bin/sh\ncat <<'EOF'\n{tree_help}EOF\n")
    server.chmod(0o755)
    build = LlamaBuild.open(prefix)
    env, argv, notes = preset_mod.command(build, "/m/m.gguf", {"ubatch": 512, "fa": True}, 4096,
                                          preset_mod.is_igpu(build, facts))
    base = [str(server), "-m", "/m/m.gguf", "-c", "4096"] + (["-ngl", "99"] if backend != "cpu" else [])
    assert argv == base + ["-fa", "on", "-ub", "512", "-b", "2048"] + added
    assert [n.split(":")[0] for n in notes] == added


def test_export_refuses_a_hostile_env_name(capsys):
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, preset(env={"X;touch /tmp/p": "1"}))
    assert cli.main(["preset", "export", "m", "--format", "systemd"]) == 11  # refused as the store reads it
    assert "field ranges.short.env: 'X;touch /tmp/p' is not an environment variable name" in capsys.readouterr().err


# -- serve --------------------------------------------------------------------------------------
FAKE_SERVER = r'''#!{python}
"""Answers /health like llama-server: 503 while "loading", then 200; writes its argv."""
import http.server, json, sys, time, os
argv = sys.argv[1:]
open(os.environ["ARGV_OUT"], "w").write(json.dumps(argv))
port = int(argv[argv.index("--port") + 1])
ready = time.monotonic() + 0.5
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.monotonic() > ready else 503)
        self.end_headers()
    def do_POST(self):  # the one-token warm-up serve sends to /completion
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200 if self.path == "/completion" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_build(tmp_path: Path) -> Path:
    from stackfixtures import make_build

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = prefix / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(FAKE_SERVER.replace("{python}", sys.executable))
    exe.chmod(0o755)
    return prefix


def test_serve_runs_the_preset_waits_for_health_and_stops_on_ctrl_c(tmp_path):
    from rocforge_build.discover.builds import read_manifest

    prefix = fake_build(tmp_path)
    stamp = read_manifest(prefix).get("stamp")
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf", "-c", "4096"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), stamp
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    port = free_port()
    argv_out = tmp_path / "argv.json"
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", "m", "--port", str(port), "--wait", "30",
                             "--no-canary"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "ARGV_OUT": str(argv_out)})
    line = proc.stdout.readline()
    assert f"at http://127.0.0.1:{port}" in line
    assert json.loads(argv_out.read_text())[-4:] == ["--host", "127.0.0.1", "--port", str(port)]
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    time.sleep(0.2)
    with socket.socket() as s:  # the server is gone: nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_refuses_a_build_changed_since_it_was_verified(tmp_path, capsys):
    prefix = fake_build(tmp_path)
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), "an-older-stamp"
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "rebuilt since the preset was verified" in err and "rocforge verify" in err


def test_serve_takes_rocforges_reference_rebuilt_since_the_preset_as_proven(tmp_path, capsys):
    """A CPU build of the packaged recipe as shipped is the reference itself: rebuilt (an upgrade to
    a new commit), there is nothing verify could compare it with (it says so in one line), so serve
    does not ask for a verify that cannot prove it; its canary checks it against rocforge's own
    build of the plan.  Found walking tests/journeys/test_upgrade_journey.py: serve named a verify command,
    the command printed the reference line, and serve refused again."""
    import hashlib

    import tomlkit

    from rocforge_build.forge import recipes

    prefix = fake_build(tmp_path)
    path = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    doc["recipe"]["sha256"] = hashlib.sha256(recipes.load("llama-cpp").text.encode()).hexdigest()
    doc["source"]["identity"] = doc["source"]["commit"] = "1" * 40
    path.write_text(tomlkit.dumps(doc))
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), "an-older-stamp"
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["serve", "m", "--dry-run"]) == 0, capsys.readouterr().err
    assert str(prefix / "bin/llama-server") in capsys.readouterr().out


# the preset's range was verified at ctx=4096 ub=512 fa=on (a CPU build: ngl None) with GGML_X=1
SHAPE = {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None}


def rebuilt_preset(tmp_path: Path, model) -> tuple[Path, str, str]:
    """A stored preset whose build has been rebuilt since (its stamp is not the preset's): (prefix,
    the build's stamp now, the model's sha256)."""
    from rocforge_build.discover.builds import read_manifest

    prefix = fake_build(tmp_path)
    from rocforge_build.measure import provenance

    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", str(model.path), "-c", "4096"])
    sha = provenance.model_sha256(Path(model.path))  # as tune stores it: serve checks the file is this model
    p["model"].update(sha256=sha, path=str(model.path))
    r = p["ranges"]["short"]
    r.update(prefix=str(prefix), stamp="an-older-stamp", variant={"ubatch": 512, "fa": True, "env": {"GGML_X": "1"}},
             verified={"shape": SHAPE, "kld_mean": 0.001, "top1": 0.99, "reference": "/ref"})
    with Store() as s:
        s.add_preset("m", sha, 1, p)
    return prefix, read_manifest(prefix)["stamp"], sha


def verify_row(prefix, stamp, sha, shapes, *, env=None, failed=()) -> dict:
    # as verify writes a check: its serving dimensions at llama-perplexity's defaults
    checks = [{"ctx": c, "ubatch": u, "fa": fa, "ngl": ngl, "kv": "f16", "load": "mmap", "parallel": 1,
               "passed": (c, u, fa, ngl) not in failed} for c, u, fa, ngl in shapes]
    return {"prefix": str(prefix), "stamp": stamp, "model_sha256": sha, "env": env or {},
            "passed": all(c["passed"] for c in checks), "checks": checks}


EXACT = (4096, 512, True, None)


@pytest.mark.parametrize("case", ["quick", "other ubatch", "other fa", "other env", "no env", "failed elsewhere",
                                  "older stamp", "other model"])
def test_serve_wants_a_verify_of_the_rebuilt_build_at_the_presets_shape(tmp_path, capsys, model8k, case):
    prefix, stamp, sha = rebuilt_preset(tmp_path, model8k)
    env = {"GGML_X": "1"}
    # each row below passed every check it ran, but none proves the preset's shape with its env
    row = {
        # `verify --quick`: the shortest context only (verify.plan), 512 tokens, not the preset's 4096
        "quick": verify_row(prefix, stamp, sha, [(512, 2048, True, None), (512, 256, False, None)], env=env),
        "other ubatch": verify_row(prefix, stamp, sha, [(4096, 2048, True, None)], env=env),
        "other fa": verify_row(prefix, stamp, sha, [(4096, 512, False, None)], env=env),
        "other env": verify_row(prefix, stamp, sha, [EXACT], env={"GGML_X": "0"}),
        "no env": verify_row(prefix, stamp, sha, [EXACT]),
        # the shape passed, another check of the same verify failed: the build is wrong somewhere
        "failed elsewhere": verify_row(prefix, stamp, sha, [EXACT, (512, 256, True, None)], env=env,
                                       failed={(512, 256, True, None)}),
        "older stamp": verify_row(prefix, "an-older-stamp", sha, [EXACT], env=env),
        "other model": verify_row(prefix, stamp, "cd" * 32, [EXACT], env=env),
    }[case]
    with Store() as s:
        s.add_row(s.start_run("verify"), "verify", row, status="passed" if row["passed"] else "failed")
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "has not passed verify with this model at the preset's shape (ctx=4096 ub=512 fa=on with GGML_X=1)" in err
    assert (f"hint: verify it at that shape: rocforge verify {prefix} --model {model8k.path} --ctx 4096 "
            "--ubatch 512 --fa on --kv f16 --load mmap --parallel 1 --env GGML_X=1") in err


def test_serve_accepts_the_rebuilt_build_once_verified_at_the_presets_shape(tmp_path, capsys, model8k):
    prefix, stamp, sha = rebuilt_preset(tmp_path, model8k)
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    hint = capsys.readouterr().err.split("verify it at that shape: ")[1].strip()
    # the command the refusal gives, read by verify's own parser, checks exactly the preset's shape
    # first (verify.plan: the given context, micro-batch and flash attention meet in row 0)
    args = cli.build_parser("verify").parse_args(hint.split()[1:])
    cov = verify.plan(model8k, gpu=False, ctx=args.ctx, ubatch=args.ubatch, fa=[args.fa == "on"],
                      kv=args.kv, load=args.load, parallel=args.parallel)
    assert cov.shapes == [verify.Shape(*EXACT)]
    assert {k: v[0] for k, v in bench.env_pairs(args.env).items()} == {"GGML_X": "1"}
    # the row that command writes when it passes: serve runs the preset again
    with Store() as s:
        s.add_row(s.start_run("verify"), "verify", verify_row(prefix, stamp, sha, [EXACT], env={"GGML_X": "1"}),
                  status="passed")
    assert cli.main(["serve", "m", "--dry-run"]) == 0
    assert f"{prefix}/bin/llama-server -m {model8k.path} -c 4096 --host 127.0.0.1 --port 8080" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--port", "0"], ["--port", "70000"], ["--wait", "nan"], ["--wait", "-1"]])
def test_serve_flags_are_checked(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "m", *flag])
    assert exc.value.code == 2 and f"argument {flag[0]}" in capsys.readouterr().err


def test_the_reference_reads_only_the_start_of_the_text_a_check_needs(tmp_path, monkeypatch):
    """llama-perplexity tokenizes its whole file first (Pride and Prejudice: 178 s with a
    byte-token vocabulary on 2 cores, 0.2 s for 40 K characters): a check at 512 tokens (4 chunks)
    gets the first 5 x 512 x 32 characters, ended at a line; a text no longer than that is used
    as it is; the start is written once."""
    monkeypatch.setattr(verify, "cache_dir", lambda: tmp_path / "cache")
    whole = verify.text_file()
    text = whole.read_text(encoding="utf-8")
    start = verify.text_start(whole, 512)
    body = start.read_text(encoding="utf-8")
    assert start != whole and text.startswith(body) and body.endswith("\n")
    assert 5 * 512 * 32 // 2 < len(body) <= 5 * 512 * 32
    mtime = start.stat().st_mtime_ns
    assert verify.text_start(whole, 512) == start and start.stat().st_mtime_ns == mtime
    short = tmp_path / "short.txt"
    short.write_text(text[:1000], encoding="utf-8")
    assert verify.text_start(short, 512) == short


def test_a_start_too_short_for_the_tokenizer_falls_back_to_the_whole_text(tmp_path, monkeypatch):
    """A tokenizer of longer tokens than 32 characters on average: the reference runs on the whole
    text, and a text too short even then bounds the coverage by the whole text's tokens."""
    monkeypatch.setattr(verify, "cache_dir", lambda: tmp_path / "cache")
    whole = verify.text_file()
    seen = []

    def base(ref, model, text, ctx, fa, progress=None):
        seen.append(text)
        if text != whole:
            raise verify.TextTooShort(700)
        return tmp_path / "base", 20.0

    monkeypatch.setattr(verify, "reference_base", base)
    assert verify._reference(None, None, whole, 512, True) == (tmp_path / "base", 20.0)
    assert seen[0] != whole and seen[1] == whole
