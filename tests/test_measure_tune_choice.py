"""measure/tune_choice.py on hand-written measurements: which variant each context range keeps,
and why, with no build made and no llama.cpp run.  The builds are prefixes as `rocforge build`
leaves them (a CPU and a HIP llama.cpp build; llama-server answers --help with nothing, so the
stored command has no flash-attention flag).  A variant's pp and tg rows carry the same t/s, so
its range score (their geometric mean) is that t/s."""

from __future__ import annotations

import pytest
from stackfixtures import make_build
from tiny_gguf import write as write_gguf

from rocforge_build.measure import bench, gguf, tune, tune_choice, verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.session import Session

# data/tune.toml [search.default] is flash attention on, micro-batch 512: DEFAULT is the recipe's
# defaults exactly, WIDE differs from them in one setting
DEFAULT, WIDE = bench.Variant(512, True), bench.Variant(1024, True)


def rows(t_s: float, depth: int = 0, stddev: float = 0.5) -> list[dict]:
    return [{"test": t, "depth": depth, "status": "ok", "t_s": t_s, "stddev": stddev, "n_prompt": 512,
             "n_gen": 128} for t in ("pp", "tg")]


class Heard:
    """What the choice told the person watching, in order (labels, not objects)."""

    def __init__(self):
        self.events = []

    def repeating(self, cand, v):
        self.events.append(("repeating", cand.build.backend, v.label()))

    def verifying(self, range_name, cand, v, shape):
        self.events.append(("verifying", range_name, cand.build.backend, v.label(), shape.label()))

    def refused(self, cand, v, shape):
        self.events.append(("refused", cand.build.backend, v.label(), shape.label()))

    def nothing_verified(self, range_name):
        self.events.append(("nothing verified", range_name))


@pytest.fixture
def builds(tmp_path):
    """A CPU and a HIP build of llama.cpp for gfx1151, each with a llama-server."""
    out = {}
    for backend in ("cpu", "hip"):
        prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", backend,
                            files=("bin/llama-bench", "bin/llama-perplexity"))
        server = prefix / "bin" / "llama-server"
        server.write_text("#!/bin/sh\nexit 0\n")
        server.chmod(0o755)
        out[backend] = LlamaBuild.open(prefix)
    return out


def candidate(build, measured: dict, remeasured: dict | None = None) -> tune.Candidate:
    """A gated-in candidate whose search measured `measured` ({variant: rows}); a repeat of a
    variant gives `remeasured`'s rows for it (the same rows when not named)."""
    cand = tune.Candidate(build, "passed", measured=dict(measured))
    again = {**measured, **(remeasured or {})}
    cand.remeasure = lambda v: again[v]
    return cand


def never(*_):
    raise AssertionError("no clock reading may pass the deadline in this test")


# -- settle_all -----------------------------------------------------------------------------------

def test_one_repeat_each_tells_a_clear_leader_apart(builds):
    # 200 against 100 t/s: one measurement each has no spread to compare with, so both are measured
    # once more; the repeats agree exactly (spread 0), and 100 apart is beyond that: settled
    fast = candidate(builds["cpu"], {WIDE: rows(200)})
    slow = candidate(builds["hip"], {DEFAULT: rows(100)})
    heard = Heard()
    settled = tune_choice.settle_all([fast, slow], {"short": 0}, 100.0, heard, clock=lambda: 0.0)
    assert heard.events == [("repeating", "cpu", "ub=1024 fa=1"), ("repeating", "hip", "ub=512 fa=1")]
    ranked = settled["short"]["ranked"]
    assert [(c.build.backend, v) for _, c, v in ranked] == [("cpu", WIDE), ("hip", DEFAULT)]
    assert [s for s, _, _ in ranked] == pytest.approx([200.0, 100.0])  # exp of mean logs: near, not exact
    assert settled["short"]["note"] == "ahead by 100.0 (score), beyond the 0.0 spread between repetitions"
    assert len(fast.samples[WIDE]) == len(slow.samples[DEFAULT]) == 2  # the search's run and one repeat


def test_each_range_is_ranked_at_its_own_depth_and_no_budget_means_no_repeat(builds):
    # the CPU build leads on an empty cache (200 against 100) and falls behind at depth 16384 (50
    # against 100); a search that took no time leaves settling no time (a share of it): no repeat
    cpu = candidate(builds["cpu"], {WIDE: rows(200, 0) + rows(50, 16384)})
    hip = candidate(builds["hip"], {DEFAULT: rows(100, 0) + rows(100, 16384)})
    heard = Heard()
    settled = tune_choice.settle_all([cpu, hip], {"short": 0, "long": 16384}, 0.0, heard,
                                     clock=lambda: 5.0)
    assert heard.events == []
    assert [c.build.backend for _, c, _ in settled["short"]["ranked"]] == ["cpu", "hip"]
    assert [c.build.backend for _, c, _ in settled["long"]["ranked"]] == ["hip", "cpu"]
    # 200/100 and 100/50: each leader 100 % ahead, on its one measurement
    for name in ("short", "long"):
        assert settled[name]["note"] == ("ahead by 100.0 % on one measurement each: no time was left "
                                         "to repeat them")


def test_leaders_within_the_noise_keep_the_one_closer_to_the_defaults(builds):
    # WIDE and DEFAULT of one build measure 100 t/s every time: no repeat tells them apart, so
    # settling repeats both, alternately, until its rounds end; then DEFAULT (the recipe's
    # defaults) is kept over WIDE (one setting away), although WIDE was measured first
    cand = candidate(builds["cpu"], {WIDE: rows(100), DEFAULT: rows(100)})
    heard = Heard()
    settled = tune_choice.settle_all([cand], {"short": 0}, 1000.0, heard, clock=lambda: 0.0)
    pairs = [heard.events[i:i + 2] for i in range(0, len(heard.events), 2)]
    assert pairs and all(p == [("repeating", "cpu", "ub=1024 fa=1"), ("repeating", "cpu", "ub=512 fa=1")]
                         for p in pairs)
    assert [v for _, _, v in settled["short"]["ranked"]] == [DEFAULT, WIDE]
    assert settled["short"]["note"] == ("the top two (100.0 and 100.0) are within the 0.0 spread between "
                                        "repetitions: ub=512 fa=1 was kept, the closer to the recipe's "
                                        "defaults")


def test_no_candidate_settles_and_chooses_nothing(builds, tmp_path):
    # every build failed its gate: nothing ranked, nothing verified, no preset
    heard = Heard()
    settled = tune_choice.settle_all([], {"short": 0}, 10.0, heard, clock=lambda: 0.0)
    assert settled == {"short": {"ranked": [], "note": None}}
    preset, rejected = tune_choice.choose(settled, {"short": 0}, {"short": 4096}, session(tmp_path),
                                          never, heard, exhaustive=False)
    assert (preset, rejected, heard.events) == (None, [], [])


# -- choose ---------------------------------------------------------------------------------------

def session(tmp_path) -> Session:
    model = gguf.check(str(write_gguf(tmp_path / "m.gguf", n_ctx=8192)))
    return Session(model, store=None, base={"model_sha256": "ab" * 32, "host": {"gpus": [{"kind": "igpu"}]}})


def check_failing(wrong: dict):
    """verify at a shape: fails the builds named in `wrong` (backend -> why), passes the rest, and
    records each (backend, shape, env) asked."""
    asked = []

    def check_at(build, shape, env):
        asked.append((build.backend, shape, env))
        failed = [wrong[build.backend]] if build.backend in wrong else []
        return {"passed": not failed, "reference": "/ref",
                "checks": [{**shape.to_json(), "kld_mean": 0.3 if failed else 0.001, "top1": 0.99,
                            "failed": failed}]}
    return check_at, asked


def test_a_faster_variant_wrong_at_the_range_shape_loses_to_the_next_one(builds, tmp_path):
    # the CPU build leads (200) but is wrong at the short range's shape; the HIP build (100) passes
    # there and is stored, its figures the mean of its two runs (90 and 110)
    fast = candidate(builds["cpu"], {WIDE: rows(200)})
    slow = candidate(builds["hip"], {DEFAULT: rows(90)})
    slow.samples[DEFAULT] = [rows(90), rows(110)]
    settled = {"short": {"ranked": [(200.0, fast, WIDE), (100.0, slow, DEFAULT)], "note": "as measured"}}
    check_at, asked = check_failing({"cpu": "kld_mean 0.3 > 0.005"})
    heard = Heard()
    s = session(tmp_path)
    preset, rejected = tune_choice.choose(settled, {"short": 0}, {"short": 4096}, s, check_at, heard,
                                          exhaustive=False)
    # the shape: the range's context, the variant's micro-batch and flash attention, and every
    # layer offloaded (99) on the GPU build, none on the CPU one
    assert asked == [("cpu", verify.Shape(4096, 1024, True, None), {}),
                     ("hip", verify.Shape(4096, 512, True, 99), {})]
    assert heard.events == [("verifying", "short", "cpu", "ub=1024 fa=1", "ctx=4096 ub=1024 fa=on"),
                            ("refused", "cpu", "ub=1024 fa=1", "ctx=4096 ub=1024 fa=on"),
                            ("verifying", "short", "hip", "ub=512 fa=1", "ctx=4096 ub=512 fa=on ngl=99")]
    refused = {"range": "short", "prefix": str(builds["cpu"].prefix), "variant_label": "ub=1024 fa=1",
               # the serving dimensions tune has not searched: llama.cpp's defaults, named
               "shape": {"ctx": 4096, "ubatch": 1024, "fa": True, "ngl": None, "kv": "f16", "load": "mmap",
                         "parallel": 1}, "env": {},
               "reason": "failed verify at ctx=4096 ub=1024 fa=on: kld_mean 0.3 > 0.005"}
    assert rejected == [refused]
    short = preset["ranges"]["short"]
    assert (short["prefix"], short["backend"], short["variant_label"], short["score"]) == (
        str(builds["hip"].prefix), "hip", "ub=512 fa=1", 100.0)
    assert short["repetitions"] == 2
    # mean 100 and the spread between the two runs, sqrt(((90-100)^2 + (110-100)^2) / 1)
    assert [(f["test"], f["n"], f["t_s"]) for f in short["figures"]] == [("pp", 512, 100.0), ("tg", 128, 100.0)]
    assert short["figures"][0]["stddev"] == pytest.approx(200 ** 0.5)
    assert short["runner_up"] == f"{builds['cpu'].label()} ub=1024 fa=1 score 200.0"
    assert short["verified"] == {"shape": {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": 99, "kv": "f16",
                                           "load": "mmap", "parallel": 1},
                                 "kld_mean": 0.001, "top1": 0.99, "reference": "/ref"}
    # what serve runs: the range's context, all layers on the GPU, the micro-batch with a batch of
    # at least 2048; no -fa (this llama-server lists no options), no iGPU flags for the same reason
    assert short["argv"] == [str(builds["hip"].prefix / "bin" / "llama-server"), "-m", str(s.model.path),
                             "-c", "4096", "-ngl", "99", "-ub", "512", "-b", "2048"]
    assert (short["settled"], short["rejected"]) == ("as measured", [refused])
    assert preset["model"] == {"name": s.model.name, "sha256": "ab" * 32, "path": str(s.model.path)}
    assert preset["exhaustive"] is False


def test_a_check_that_cannot_run_refuses_and_a_range_with_none_right_stores_nothing(builds, tmp_path):
    # short: the only variant's check cannot run at its shape (VerifyError): refused, nothing
    # stored for it; long: the same build passes at its own shape and is stored
    cand = candidate(builds["cpu"], {DEFAULT: rows(100, 0) + rows(80, 16384)})
    settled = {"short": {"ranked": [(100.0, cand, DEFAULT)], "note": None},
               "long": {"ranked": [(80.0, cand, DEFAULT)], "note": None}}
    passing, _ = check_failing({})

    def check_at(build, shape, env):
        if shape.ctx == 4096:
            raise verify.VerifyError("llama-perplexity: too little text for ctx 4096")
        return passing(build, shape, env)

    heard = Heard()
    preset, rejected = tune_choice.choose(settled, {"short": 0, "long": 16384}, {"short": 4096, "long": 8192},
                                          session(tmp_path), check_at, heard, exhaustive=True)
    assert [(r["range"], r["reason"]) for r in rejected] == [
        ("short", "failed verify at ctx=4096 ub=512 fa=on: llama-perplexity: too little text for ctx 4096")]
    assert ("nothing verified", "short") in heard.events and ("nothing verified", "long") not in heard.events
    assert set(preset["ranges"]) == {"long"} and preset["exhaustive"] is True
    assert preset["ranges"]["long"]["depth"] == 16384 and preset["ranges"]["long"]["runner_up"] is None


def test_every_variant_wrong_gives_no_preset_and_names_each(builds, tmp_path):
    cand = candidate(builds["hip"], {WIDE: rows(120), DEFAULT: rows(100)})
    settled = {"short": {"ranked": [(120.0, cand, WIDE), (100.0, cand, DEFAULT)], "note": None}}
    check_at, asked = check_failing({"hip": "top1 0.5 < 0.9"})
    heard = Heard()
    preset, rejected = tune_choice.choose(settled, {"short": 0}, {"short": 4096}, session(tmp_path),
                                          check_at, heard, exhaustive=False)
    assert preset is None
    assert [r["variant_label"] for r in rejected] == ["ub=1024 fa=1", "ub=512 fa=1"]
    assert heard.events[-1] == ("nothing verified", "short") and len(asked) == 2


# -- pooled_rows ----------------------------------------------------------------------------------

def test_pooled_rows_are_the_mean_at_the_asked_depth_over_the_runs_that_finished():
    # two runs at depth 0 (pp 100 and 120, tg 10 and 14), one at another depth and a failed tg
    # row: pp is the mean 110 with the runs' spread sqrt(2 * 10^2 / 1); tg likewise 12, sqrt(8)
    first = [{"test": "pp", "depth": 0, "status": "ok", "t_s": 100, "stddev": 1.0, "n_prompt": 512},
             {"test": "tg", "depth": 0, "status": "ok", "t_s": 10, "stddev": 2.0, "n_gen": 128},
             {"test": "tg", "depth": 0, "status": "failed", "t_s": None, "stddev": None}]
    second = [{"test": "pp", "depth": 0, "status": "ok", "t_s": 120, "stddev": 1.0, "n_prompt": 512},
              {"test": "pp", "depth": 4096, "status": "ok", "t_s": 60, "stddev": 1.0, "n_prompt": 512}]
    third = [{"test": "tg", "depth": 0, "status": "ok", "t_s": 14, "stddev": 2.0, "n_gen": 128}]
    got = {r["test"]: r for r in tune_choice.pooled_rows([first, second, third], 0)}
    assert got["pp"]["t_s"] == pytest.approx(110) and got["pp"]["stddev"] == pytest.approx(200 ** 0.5)
    assert got["tg"]["t_s"] == pytest.approx(12) and got["tg"]["stddev"] == pytest.approx(8 ** 0.5)
    assert got["pp"]["depth"] == 0  # the 60 t/s at depth 4096 is another range's figure
    # at depth 4096 only pp ran once: llama-bench's own spread over its repetitions is kept
    assert tune_choice.pooled_rows([first, second, third], 4096) == [
        {"test": "pp", "depth": 4096, "status": "ok", "t_s": 60.0, "stddev": 1.0, "n_prompt": 512}]
