"""measure/bench_session.py: `rocforge bench`'s run as the results store records it, with fake
llama-bench programs (test_measure_bench.logging_build)."""

from __future__ import annotations

from test_measure_bench import logging_build
from tiny_gguf import write as write_gguf


def test_a_recorded_run_keeps_its_spec_and_says_how_it_ended(tmp_path, monkeypatch):
    """bench_session.recorded: one results-store run of kind bench holding the spec it asked, ended "done"
    with llama-bench's time; a build whose llama-bench fails every variant ends it "partly failed"."""
    from rocforge_build.measure import bench, bench_session
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.session import open_session

    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "data"))
    log = tmp_path / "calls.log"
    good = LlamaBuild.open(logging_build(tmp_path, "good", log))
    model = write_gguf(tmp_path / "m.gguf")
    s = open_session(str(model), [good], ("llama-bench",))
    spec = bench.Spec(s.model, (0,), 32, 8, 1, None, warmup=False)
    run_id, out = bench_session.recorded(s, [good], spec, bench.variants([], [None], {}), gate=None,
                                 argv=["rocforge", "bench"], quiet=True)
    info = s.store.run_info(run_id)
    assert info["kind"] == "bench" and info["status"] == "done" and info["argv"] == ["rocforge", "bench"]
    assert info["info"]["spec"] == {"depths": [0], "n_prompt": 32, "n_gen": 8, "reps": 1}
    assert info["info"]["llama_bench_s"] > 0 and [r["test"] for r in out.rows] == ["pp", "tg"]
    broken = tmp_path / "broken"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin/llama-bench").write_text("#!/bin/sh\necho 'ggml: out of memory' >&2\nexit 1\n")
    (broken / "bin/llama-bench").chmod(0o755)
    run_id, out = bench_session.recorded(s, [LlamaBuild.open(broken)], spec, bench.variants([], [None], {}), gate=None,
                                 argv=None, quiet=True)
    assert out.failed and s.store.run_info(run_id)["status"] == "partly failed"
