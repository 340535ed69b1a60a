"""measure/verify.py without builds: the covering design and what bounds it, the report of what a
verify covered, the shipped text and how much of it a reference reads, and the limits (like with
like, per quantization type, top-1 only against a reference better than chance).  Each test states
the right answer and where it comes from; the real runs are in tests/e2e/test_verify_shapes.py."""

from __future__ import annotations

import pytest
from tiny_gguf import write as write_gguf

from rocforge_build.measure import gguf, verify


@pytest.fixture(scope="module")
def model8k(tmp_path_factory):
    """A llama of 2 layers trained (as its metadata says) at 8192 tokens, like SmolLM2-135M."""
    return gguf.check(write_gguf(tmp_path_factory.mktemp("m") / "m.gguf", n_ctx=8192))


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


def test_top1_is_judged_only_against_a_reference_better_than_chance():
    # Measured on the H100 (2026-11-23): a right Vulkan build against the CPU build, random F16
    # model of 32,000 tokens, reference PPL 45,391 (chance is 32,000): mean KLD 0.00015, PPL ratio
    # 0.999, but top-1 agreement 94.5 %: near-ties decided by rounding.  The broken build (no coopmat
    # guard) had KLD 0.41 and PPL 32000.0; a trained model's PPL is a few units.
    _, _, limits = verify.rules()
    right_random = verify.judge(verify.Check(512, 0.00015, 0.9451, 45345.4, 45390.7), limits, 32000)
    assert right_random.passed and not right_random.failed
    assert [w.split(" ", 1)[0] for w in right_random.not_judged] == ["top1"]
    broken_random = verify.judge(verify.Check(512, 0.409, 0.0, 32000.0, 45390.7), limits, 32000)
    assert not broken_random.passed and broken_random.failed[0].startswith("kld_mean")
    # a trained model (PPL 7.7 of 128,256 tokens: Llama-3.2-3B in llama.cpp #27506) judges top-1
    trained = verify.judge(verify.Check(512, 0.001, 0.9451, 7.73, 7.72), limits, 128256)
    assert not trained.passed and [w.split(" ", 1)[0] for w in trained.failed] == ["top1"]
    assert not trained.not_judged
    # unknown vocabulary: every limit applies
    assert not verify.judge(verify.Check(512, 0.00015, 0.9451, 45345.4, 45390.7), limits, None).passed
