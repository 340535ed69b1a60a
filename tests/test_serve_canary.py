"""The canary's comparison math on hand-made distributions (the right answers worked out by hand in
each test) and its reply parser on real replies: tests/data/canary/llama-server-0.3.9-*.json were
captured on 2026-11-27 from a real llama-server of the May 2025 tree (llama-cpp-python 0.3.9's
vendor/llama.cpp, CPU build by rocforge) serving SmolLM2-135M-Instruct Q4_1 (tests/trained_model.py):
`curl 127.0.0.1:PORT/completion -d '{"prompt": "It is a truth universally acknowledged, that a single
man", "n_predict": 3, "n_probs": 3, "temperature": 0, "top_k": 1, "seed": 42, "ignore_eos": true}'`
and the same with the prompt as token ids [1589, 314, 253, 4569, 21902, 14494], n_predict 4, n_probs 5.
The 2024 `probs` form (llama.cpp's server before PR #10783) is written here from its README."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rocforge_build.serve import canary, canary_compare
from rocforge_build.serve.canary import CanaryError
from rocforge_build.serve.canary_compare import Position

DATA = Path(__file__).parent / "data" / "canary"
L = math.log


def pos(token, **probs) -> Position:
    return Position(token, {int(k[1:]): L(v) for k, v in probs.items()})


def test_kld_of_identical_distributions_is_zero():
    p = {1: L(0.7), 2: L(0.2), 3: L(0.05)}
    assert canary_compare.position_kld(p, dict(p)) == pytest.approx(0.0, abs=1e-12)


def test_kld_coarsened_to_the_reference_top_k_plus_the_rest():
    # reference 0.5/0.5 (nothing left over), server 0.9/0.1:
    # 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 (-0.587787) + 0.5 (1.609438) = 0.510826
    assert canary_compare.position_kld({1: L(0.5), 2: L(0.5)}, {1: L(0.9), 2: L(0.1)}) == pytest.approx(0.510826, abs=1e-6)
    # reference 0.6/0.2 (rest 0.2), server 0.6/0.2 listing a third token 0.1 (rest of the
    # reference's top-K: 0.2): the same coarse distribution, KLD 0
    assert canary_compare.position_kld({1: L(0.6), 2: L(0.2)}, {1: L(0.6), 2: L(0.2), 3: L(0.1)}) == pytest.approx(0, abs=1e-12)


def test_a_reference_token_the_server_did_not_list_gets_its_smallest_listed_probability():
    # reference {1: 0.5, 2: 0.5}; server lists {1: 0.9, 3: 0.05}: token 2 is taken as 0.05
    # 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.05) + rest: p_rest 0, so nothing = -0.293893 + 1.151293 = 0.857399
    assert canary_compare.position_kld({1: L(0.5), 2: L(0.5)}, {1: L(0.9), 3: L(0.05)}) == pytest.approx(0.857399, abs=1e-6)


def test_same_answers_compare_clean():
    ref = (pos(5, t5=0.8, t6=0.1), pos(7, t7=0.6, t8=0.3))
    c = canary_compare.compare(ref, ref)
    assert (c.compared, c.kld_mean, c.top1, c.ppl_ratio, c.parted_at) == (2, 0.0, 1.0, 1.0, None)


def test_ppl_ratio_of_the_reference_tokens():
    # the reference's tokens at p 0.8 and 0.5, the server's 0.4 and 0.5:
    # exp(mean(-ln 0.4, -ln 0.5)) / exp(mean(-ln 0.8, -ln 0.5)) = sqrt(0.8/0.4) = 1.414214
    ref = (pos(5, t5=0.8, t6=0.1), pos(7, t7=0.5, t8=0.3))
    got = (pos(5, t5=0.4, t6=0.3), pos(7, t7=0.5, t8=0.3))
    assert canary_compare.compare(ref, got).ppl_ratio == pytest.approx(math.sqrt(2), abs=1e-6)


def test_a_parting_at_a_near_tie_ends_the_comparison_there_without_top1_blame():
    # position 1: the reference 0.45/0.44 (margin 0.01 < CLEAR_MARGIN): the server chose the other.
    # Position 1 still saw the same tokens as the reference's, so its distribution counts (KLD:
    # 0.45 ln(0.45/0.44) + 0.44 ln(0.44/0.45) = 0.01 x 0.022473 = 0.000225, mean over 2 positions
    # 0.000112); position 2 follows another token and is not compared; top-1 is judged on position 0
    ref = (pos(5, t5=0.9), pos(7, t7=0.45, t8=0.44), pos(9, t9=0.9))
    got = (pos(5, t5=0.9), pos(8, t7=0.44, t8=0.45), pos(3, t3=0.9))
    c = canary_compare.compare(ref, got)
    assert (c.compared, c.parted_at, c.clear_parting, c.top1) == (2, 1, False, 1.0)
    assert c.kld_mean == pytest.approx(0.000112, abs=1e-6)
    assert canary_compare.judge(c, _plan()) == ()


def test_a_near_tie_at_the_first_token_still_compares_that_token():
    # a swapped answer whose first token is a near-tie in the reference (0.40/0.38) but whose
    # distribution is another prompt's (0.05/0.05, 0.9 elsewhere): compared on that one position,
    # KLD 0.4 ln(0.4/0.05) + 0.38 ln(0.38/0.05) + 0.22 ln(0.22/0.9) = 0.831777 + 0.770696 - 0.309929
    # = 1.292544, a failure (nothing compared would have been no evidence either way)
    ref = (pos(7, t7=0.40, t8=0.38),)
    got = (pos(8, t7=0.05, t8=0.05, t9=0.9),)
    c = canary_compare.compare(ref, got)
    assert (c.compared, c.parted_at, c.clear_parting) == (1, 0, False) and math.isnan(c.top1)
    assert c.kld_mean == pytest.approx(1.292544, abs=1e-6)
    assert canary_compare.judge(c, _plan())[0].startswith("kld_mean 1.293")


def test_one_token_s_ppl_ratio_is_judged_with_the_least_spread_a_right_build_shows():
    # one compared token, the server's log p of the reference's token 0.0706 below (a right CPU
    # build at -np 4 measured so, 2026-11-27): ratio 1.073, but one token has no spread of its own;
    # with TOKEN_LOG_RATIO_SD 0.1 its lower bound is e^(0.0706 - 0.3) < 1: not a failure
    ref = (pos(5, t5=0.5, t6=0.3),)
    got = (pos(5, t5=0.5 * math.exp(-0.0706), t6=0.3),)
    c = canary_compare.compare(ref, got)
    assert c.ppl_ratio == pytest.approx(1.0731, abs=1e-4) and c.ppl_ratio_low == pytest.approx(math.exp(0.0706 - 0.3), abs=1e-6)
    assert canary_compare.judge(c, _plan()) == ()


def test_a_parting_where_the_reference_was_clear_is_a_top1_failure():
    ref = (pos(5, t5=0.9), pos(7, t7=0.9, t8=0.05))
    got = (pos(5, t5=0.9), pos(8, t7=0.05, t8=0.9))
    c = canary_compare.compare(ref, got)
    assert (c.parted_at, c.clear_parting, c.compared) == (1, True, 2) and c.top1 == 0.5
    failed = canary_compare.judge(c, _plan())
    assert failed[0].startswith("top-1 (the answer parted from the reference's at token 1")


def test_a_drifted_distribution_fails_kld_with_the_greedy_text_unchanged():
    # the argmax stays (a greedy text canary sees nothing), the distribution moved: KLD fails
    ref = tuple(pos(5, t5=0.6, t6=0.3, t7=0.1) for _ in range(4))
    got = tuple(pos(5, t5=0.4, t6=0.35, t7=0.25) for _ in range(4))
    failed = canary_compare.judge(canary_compare.compare(ref, got), _plan())
    assert any(f.startswith("kld_mean") for f in failed) and not any(f.startswith("top") for f in failed)


def _plan(file_type="F16") -> canary.CanaryPlan:
    return canary.CanaryPlan(("a", "b"), 0, 0, 4, 10, file_type, 49152)


def test_parse_a_real_reply_of_the_may_2025_server():
    body = (DATA / "llama-server-0.3.9-completion-text.json").read_bytes()
    got = canary.parse_reply(body, 3)
    assert [p.token for p in got] == [416, 2093, 699]  # " can never know"
    assert got[0].top == {416: -0.8105931282043457, 2526: -1.5267205238342285, 28: -2.1355957984924316}
    toks = canary.parse_reply((DATA / "llama-server-0.3.9-completion-tokens.json").read_bytes(), 5)
    assert len(toks) == 4 and all(len(p.top) == 5 for p in toks)
    assert json.loads((DATA / "llama-server-0.3.9-completion-tokens.json").read_text())["content"] == " by all, and"


def test_parse_the_2024_probs_form():
    body = json.dumps({"content": " can", "completion_probabilities": [
        {"content": " can", "probs": [{"tok_str": " can", "prob": 0.5}, {"tok_str": " cannot", "prob": 0.25}]}]})
    (p,) = canary.parse_reply(body.encode(), 2)
    assert p.token == " can" and p.top == {" can": pytest.approx(L(0.5)), " cannot": pytest.approx(L(0.25))}


def test_post_sampling_top_probs_are_read_as_probabilities():
    body = json.dumps({"completion_probabilities": [{"id": 3, "prob": 1.0, "top_probs": [{"id": 3, "prob": 1.0}]}]})
    (p,) = canary.parse_reply(body.encode(), 1)
    assert p.top == {3: 0.0}


@pytest.mark.parametrize("body, says", [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"content": "x"}', "no completion_probabilities"),
    (b'{"completion_probabilities": [{"id": 1, "top_logprobs": [{"id": 1, "logprob": "x"}]}]}', "without a token and a number"),
    (b'{"completion_probabilities": [{"id": 1, "top_logprobs": [{"id": 1, "logprob": NaN}]}]}', "out of range"),
    (b'{"completion_probabilities": [{"id": 1, "top_logprobs": [{"id": 1, "logprob": 3.0}]}]}', "out of range"),
    # an integer past a float's range (JSON allows any length): out of range, not an OverflowError, and
    # the message quotes it bounded
    (b'{"completion_probabilities": [{"id": 1, "top_logprobs": [{"id": 1, "logprob": ' + b"9" * 400 + b'}]}]}', "out of range"),
    (b'{"completion_probabilities": [{"id": 1, "probs": [{"tok_str": "a", "prob": ' + b"9" * 4000 + b'}]}]}', "out of range"),
    (b'{"completion_probabilities": [{"top_logprobs": [{"id": 1, "logprob": -1.0}]}]}', "which token was chosen"),
])
def test_bad_replies_are_one_line(body, says):
    with pytest.raises(CanaryError) as e:
        canary.parse_reply(body, 3)
    assert says in e.value.message and "\n" not in e.value.message and len(e.value.message) < 300


def test_plan_bounds_the_long_prompt_by_the_model_and_the_slot():
    class M:
        n_ctx_train, file_type, n_vocab = 8192, "Q4_1", 49152

    p = canary.plan(M(), canary.Target("http://x", {}, 32768, 4))
    assert p.long_tokens == 8192 - p.n_predict and len(p.texts) == 4 and "training context (8192)" in p.notes[0]
    M.n_ctx_train = 131072
    assert canary.plan(M(), canary.Target("http://x", {}, 32768, 1)).long_tokens == canary.LONG_WANTED > 8192
    small = canary.plan(M(), canary.Target("http://x", {}, 2048, 1))
    assert small.long_tokens == 2048 - small.n_predict and "slot's context (2048)" in small.notes[0]
    assert len(small.texts) == 2 and len(set(small.texts)) == 2  # a swap needs two different requests
    short = canary.plan(M(), canary.Target("http://x", {}, 32768, 4), short=True)
    assert short.long_tokens == 0 and len(short.texts) == 1 and short.n_predict < p.n_predict


def test_a_few_tokens_ppl_ratio_fails_only_beyond_its_noise():
    # 16 tokens: the server's log p of the reference's token alternately 0.3 below and 0.22 above
    # it (mean 0.04 below: ratio e^0.04 = 1.041 > 1.02, standard error 0.26/sqrt(16) = 0.065, lower
    # bound e^(0.04 - 3 x 0.067) < 1): noise, not judged a failure
    ref = tuple(pos(5, t5=0.5, t6=0.1) for _ in range(16))
    got = tuple(pos(5, t5=0.5 * math.exp(-0.3 if i % 2 else 0.22), t6=0.1) for i in range(16))
    c = canary_compare.compare(ref, got)
    assert c.ppl_ratio == pytest.approx(math.exp(0.04), abs=1e-6) and c.ppl_ratio_low < 1.0
    assert not any(f.startswith("ppl_ratio") for f in canary_compare.judge(c, _plan()))
    # every token 0.1 lower (ratio e^0.1 = 1.105, no spread): a failure
    steady = tuple(pos(5, t5=0.5 * math.exp(-0.1), t6=0.1) for _ in range(16))
    assert any(f.startswith("ppl_ratio 1.105") for f in canary_compare.judge(canary_compare.compare(ref, steady), _plan()))


def test_a_wildly_wrong_log_probability_is_a_ppl_ratio_of_inf_not_an_overflow():
    # the reference's token at log p 0, the server's at -800 (a broken backend's -inf clamps to
    # -1e4 alike): the PPL ratio is e^800, past a float (e^709.8 is the largest): inf, a failure
    ref = (Position(5, {5: 0.0, 6: -30.0}),)
    got = canary.parse_reply(json.dumps({"completion_probabilities": [
        {"id": 5, "top_logprobs": [{"id": 5, "logprob": -800.0}, {"id": 7, "logprob": -800.0}]}]}).encode(), 10)
    c = canary_compare.compare(ref, got)
    assert c.ppl_ratio == math.inf and c.ppl_ratio_low == math.inf
    assert any(f.startswith("ppl_ratio inf (limit <=") for f in canary_compare.judge(c, _plan("Q4_1")))
    assert canary.Row("request 1", 3, c, ("x",)).to_json()["ppl_ratio"] is None  # stored as plain JSON
