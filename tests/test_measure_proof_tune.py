"""tune's last step without builds or llama.cpp runs: each range's ranked variants are verified at
the range's own shape before one is stored (issue 22 item 7).  The search is replaced by fixed
figures and verify at a shape by a stand-in that fails the variants a test names, so each test
states which variant wins, which is refused and what the output says about it.  The real runs
are in test_measure_slow.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stackfixtures import make_build
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.measure import bench, tune, verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.store import Store
from rocforge_build.workflows import tune as tune_workflow

# the leader of every range: twice the runner-up's pp and tg at every depth
LEADER, RUNNER_UP = bench.Variant(512, True), bench.Variant(256, False)


def rows(t_s: float, depth: int) -> list[dict]:
    return [{"test": t, "depth": depth, "status": "ok", "t_s": t_s, "stddev": 0.0, "n_prompt": 512,
             "n_gen": 128} for t in ("pp", "tg")]


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A CPU build with the programs tune checks for (llama-server answers --help with nothing),
    a model trained at 8192 tokens, a search that measured LEADER and RUNNER_UP, and verify at a
    shape failing the variants put in `world["wrong"]`.  Returns that dict; `calls` records each
    shape verified."""
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu",
                        files=("bin/llama-bench", "bin/llama-perplexity"))
    server = prefix / "bin" / "llama-server"
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o755)
    model = write_gguf(tmp_path / "m.gguf", n_ctx=8192)
    state = {"prefix": str(prefix), "model": model, "wrong": set(), "calls": []}

    def candidates(asked, say, *, quiet):
        return [LlamaBuild.open(prefix)], []

    def tune_build(b, measuring):
        cand = tune.Candidate(b, "passed")
        cand.measured = {v: [r for d in measuring.ranges.values() for r in rows(t_s, d)]
                         for v, t_s in ((LEADER, 200.0), (RUNNER_UP, 100.0))}
        cand.remeasure = lambda v: cand.measured[v]
        return cand, (cand, {}, 8)

    def verify_shape(build, model, shape, *, reference, env=None, quiet=False, progress=None):
        state["calls"].append(shape)
        v = bench.Variant(shape.ubatch, shape.fa, tuple((env or {}).items()))
        failed = ["kld_mean 0.3 > 0.005: wrong on purpose"] if v in state["wrong"] else []
        check = {**shape.to_json(), "kld_mean": 0.3 if failed else 0.001, "top1": 0.99, "failed": failed}
        return {"passed": not failed, "reference": "/ref", "checks": [check]}

    monkeypatch.setattr(tune_workflow, "candidates", candidates)
    monkeypatch.setattr(tune_workflow, "_tune_build", tune_build)
    monkeypatch.setattr(verify, "verify_shape", verify_shape)
    return state


def tune_json(capsys, world, *extra) -> tuple[int, dict, str]:
    code = cli.main(["tune", "llama-cpp", "--target", "gfx1151", "--model", str(world["model"]),
                     "--json", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_a_leader_wrong_at_its_shape_is_refused_and_the_runner_up_stored(world, capsys):
    world["wrong"] = {LEADER}
    code, summary, _ = tune_json(capsys, world, "--contexts", "short")
    assert code == 0
    # the short range runs at 4096 tokens (data/tune.toml), within the model's 8192; a CPU build
    # offloads nothing (ngl None); the leader's micro-batch and flash attention, then the runner-up's
    assert world["calls"] == [verify.Shape(4096, 512, True, None), verify.Shape(4096, 256, False, None)]
    short = summary["preset"]["ranges"]["short"]
    assert short["variant_label"] == RUNNER_UP.label() == "ub=256 fa=0"
    assert short["verified"]["shape"] == {"ctx": 4096, "ubatch": 256, "fa": False, "ngl": None, "kv": "f16",
                                          "load": "mmap", "parallel": 1}
    refused = {"range": "short", "prefix": world["prefix"], "variant_label": "ub=512 fa=1",
               "shape": {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None, "kv": "f16", "load": "mmap",
                         "parallel": 1}, "env": {},
               "reason": "failed verify at ctx=4096 ub=512 fa=on: kld_mean 0.3 > 0.005: wrong on purpose"}
    assert summary["rejected"] == [refused] and short["rejected"] == [refused]
    with Store() as s:  # what is stored is the runner-up, and the preset names the leader it refused
        stored = s.preset(summary["preset"]["model"]["sha256"])
    assert stored.ranges["short"].variant_label == "ub=256 fa=0"
    assert stored.to_json()["ranges"]["short"]["rejected"] == [refused]  # kept, unread, as tune wrote it
    # the text summary says it too
    assert cli.main(["tune", "llama-cpp", "--target", "gfx1151", "--model", str(world["model"]),
                     "--contexts", "short"]) == 0
    out = capsys.readouterr().out
    assert f"short: cpu {world['prefix']} ub=256 fa=0" in out
    assert f"  not stored: ub=512 fa=1 ({world['prefix']}): failed verify at ctx=4096 ub=512 fa=on" in out


def test_a_range_with_no_variant_right_at_its_shape_is_named_while_another_is_stored(world, capsys,
                                                                                       monkeypatch):
    # both variants wrong, but only at the long range's shape (8192 tokens: the model's training
    # context bounds the range's 32768)
    world["wrong"] = {LEADER, RUNNER_UP}
    stand_in = verify.verify_shape

    def wrong_only_long(build, model, shape, **kw):
        # at the short range's 4096 tokens, asked as for a variant not in world["wrong"]
        return stand_in(build, model, shape, **{**kw, "env": {"RIGHT": "1"}} if shape.ctx == 4096 else kw)

    monkeypatch.setattr(verify, "verify_shape", wrong_only_long)
    code, summary, _ = tune_json(capsys, world)
    assert code == 0 and set(summary["preset"]["ranges"]) == {"short"}
    assert summary["preset"]["ranges"]["short"]["variant_label"] == "ub=512 fa=1"
    assert [(r["range"], r["variant_label"], r["shape"]["ctx"]) for r in summary["rejected"]] == [
        ("long", "ub=512 fa=1", 8192), ("long", "ub=256 fa=0", 8192)]
    assert summary["preset"]["ranges"]["short"]["rejected"] == []


def test_every_candidate_wrong_at_its_shape_stores_nothing_and_says_so(world, capsys):
    world["wrong"] = {LEADER, RUNNER_UP}
    code, summary, err = tune_json(capsys, world, "--contexts", "short")
    assert code == 2 and summary["preset"] is None
    assert [r["variant_label"] for r in summary["rejected"]] == ["ub=512 fa=1", "ub=256 fa=0"]
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "no variant finished its runs" not in err  # not the wrong reason
    p = world["prefix"]
    assert lines[0] == ("rocforge: error: no preset was made: every ranked variant failed verify at "
                        f"its range's own shape (short: ub=512 fa=1 of {p} at ctx=4096 ub=512 fa=on; "
                        f"short: ub=256 fa=0 of {p} at ctx=4096 ub=256 fa=off)")
    assert lines[1].startswith("rocforge: hint: why each failed is under `rejected` (--json)")
    assert lines[1].endswith(f"rocforge verify {p} --model {world['model']} --ctx 4096 --ubatch 512 --fa on "
                             "--kv f16 --load mmap --parallel 1")
    with Store() as s:
        assert s.preset_models() == []  # nothing stored
    # the text summary names them too, with no winner for the range
    assert cli.main(["tune", "llama-cpp", "--target", "gfx1151", "--model", str(world["model"]),
                     "--contexts", "short"]) == 2
    out = capsys.readouterr().out
    assert "short: nothing stored: every ranked variant failed verify at the range's shape" in out
    assert out.count("  not stored: ") == 2


def test_a_check_that_cannot_run_at_the_shape_refuses_the_variant(world, capsys, monkeypatch):
    def crashes(build, model, shape, **kw):
        if shape.ubatch == 512:
            raise verify.VerifyError("llama-perplexity failed (signal 11): Segmentation fault")
        return {"passed": True, "reference": "/ref",
                "checks": [{**shape.to_json(), "kld_mean": 0.001, "top1": 0.99, "failed": []}]}

    monkeypatch.setattr(verify, "verify_shape", crashes)
    code, summary, _ = tune_json(capsys, world, "--contexts", "short")
    assert code == 0 and summary["preset"]["ranges"]["short"]["variant_label"] == "ub=256 fa=0"
    assert summary["rejected"][0]["reason"].endswith("Segmentation fault")


def test_settling_stops_at_the_deadline():
    a, b = bench.Variant(256, True), bench.Variant(512, True)
    cand = tune.Candidate(object())
    cand.measured = {a: rows(110, 0), b: rows(100, 0)}
    clock, asked = [0.0], []

    def remeasure(c, v):
        asked.append(v)
        clock[0] += 1.0  # each repeat takes one second
        return rows(110 if v == a else 100, 0)

    # a deadline already past: nothing is repeated; the one measurement each decides, and says so
    out = tune.settle([cand], 0, remeasure, {"fa": True, "ubatch": 512}, rounds=3, deadline=0.0,
                      clock=lambda: clock[0])
    assert asked == [] and out["ranked"][0][2] == a
    assert out["note"] == "ahead by 10.0 % on one measurement each: no time was left to repeat them"
    # one second left: the leader is repeated, the deadline passes before the runner-up's repeat,
    # and no later round starts (3 rounds would have asked for 6 repeats)
    out = tune.settle([cand], 0, remeasure, {"fa": True, "ubatch": 512}, rounds=3, deadline=1.0,
                      clock=lambda: clock[0])
    assert asked == [a] and len(cand.samples[a]) == 2 and b not in cand.samples
    assert out["ranked"][0][2] == a and "no time was left" in out["note"]


def test_the_verify_command_for_a_shape_is_quoted(tmp_path):
    shape = {"ctx": 4096, "ubatch": 256, "fa": False, "ngl": 99}
    line = verify.command_line(Path("/p"), tmp_path / "my model.gguf", shape, {"B": "x y", "A": "1"})
    assert line == (f"rocforge verify /p --model '{tmp_path}/my model.gguf' --ctx 4096 --ubatch 256 "
                    "--fa off --kv f16 --load mmap --parallel 1 --env A=1 --env 'B=x y'")
