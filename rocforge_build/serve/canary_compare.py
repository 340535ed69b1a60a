"""The canary's comparison of one answer with the reference's, position by position (see
serve/canary.py for what is asked and why): the KL divergence on the reference's top-K plus one
"everything else" bucket, top-1 agreement, the PPL ratio of the reference's own tokens and its
lower bound, up to the first parting of the greedy paths; judged by verify's limits."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rocforge_build.measure import verify

CLEAR_MARGIN = 0.2  # reference's top-1 probability minus its second's: a parting there is no tie
# the least spread assumed of one token's log-probability ratio: a right CPU build at -np 4 against
# its -np 1 reference spread 0.05-0.06 nats a token (SmolLM2 Q4_1, 12-16 tokens a request,
# 2026-11-27), and one such token alone measured 0.07; with fewer tokens than that shows, the
# sample's own spread is no bound
TOKEN_LOG_RATIO_SD = 0.1


@dataclass(frozen=True)
class Position:
    """One generated position: the chosen token and the top-K distribution (token id -> log p)."""

    token: int | str
    top: dict

    def to_json(self) -> dict:
        return {"token": self.token, "top": [[k, v] for k, v in self.top.items()]}

    @classmethod
    def from_json(cls, d: dict) -> Position:
        return cls(d["token"], {k: v for k, v in d["top"]})


@dataclass(frozen=True)
class Comparison:
    """One answer against one reference answer."""

    compared: int  # positions compared (up to and including the parting)
    kld_mean: float
    top1: float
    ppl_ratio: float
    ppl_ratio_low: float  # its lower bound, 3 standard errors of the per-token log ratio below
    parted_at: int | None  # first position whose chosen token differs, None: none did
    clear_parting: bool  # the reference's margin there was clear: a top-1 failure



def _probs(top: dict) -> dict:
    return {k: math.exp(v) for k, v in top.items()}


def position_kld(ref_top: dict, got_top: dict) -> float:
    """KL(reference || server) on the reference's top-K plus one "everything else" bucket (log
    probabilities in, nats out); a token the server did not list gets its smallest listed
    probability."""
    p = _probs(ref_top)
    q_all = _probs(got_top)
    floor = min(q_all.values()) if q_all else 1e-12
    q = {k: q_all.get(k, floor) for k in p}
    kld = sum(pk * (math.log(max(pk, 1e-30)) - math.log(max(q[k], 1e-30))) for k, pk in p.items() if pk > 0)
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest = max(1e-12, 1.0 - sum(q.values()))
    if p_rest > 1e-12:
        kld += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(kld, 0.0)


def _top1(top: dict):
    return max(top, key=top.get) if top else None


def _logp(top: dict, token) -> float:
    """`token`'s log probability in a top-K list; one not listed gets the smallest listed (it is
    at most that)."""
    return top.get(token, min(top.values()) if top else -50.0)


def _margin(top: dict) -> float:
    ps = sorted(_probs(top).values(), reverse=True)
    return ps[0] - (ps[1] if len(ps) > 1 else 0.0)


def compare(ref: tuple[Position, ...], got: tuple[Position, ...]) -> Comparison:
    """The server's positions against the reference's, up to and including the first parting of
    the greedy paths: every position up to there saw the same tokens, so its distribution is
    comparable; past it the contexts differ.  A parting at a near-tie is not held against top-1."""
    klds, agree, judged_top1, logq, logp = [], 0, 0, [], []
    parted, clear = None, False
    for i, (r, g) in enumerate(zip(ref, got, strict=False)):
        klds.append(position_kld(r.top, g.top))
        logq.append(_logp(g.top, r.token))
        logp.append(_logp(r.top, r.token))
        if g.token != r.token:
            parted, clear = i, _margin(r.top) >= CLEAR_MARGIN
        if parted is None or clear:  # a near-tie's parting says nothing of top-1
            judged_top1 += 1
            agree += _top1(r.top) == _top1(g.top)
        if parted is not None:
            break
    if len(got) < len(ref) and parted is None:
        parted, clear = len(got), True  # a short answer: the missing positions are not the reference's
    n = len(klds)
    if n == 0:
        return Comparison(0, math.nan, math.nan, math.nan, math.nan, parted, clear)
    if clear and parted is not None and parted >= n:
        judged_top1 += 1  # the missing position counts as a disagreement
    top1 = agree / judged_top1 if judged_top1 else math.nan
    diffs = [a - b for a, b in zip(logp, logq, strict=True)]
    mean = sum(diffs) / n
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    se = max(spread, TOKEN_LOG_RATIO_SD) / math.sqrt(n)
    return Comparison(n, sum(klds) / n, top1, _exp(mean), _exp(mean - 3 * se), parted, clear)


def _exp(x: float) -> float:
    """e**x, inf past a float's range: a wildly wrong server's log-probabilities (clamped at -1e4)
    put the reference's tokens hundreds of nats away, and that is a failure, not an error."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def judge(c: Comparison | None, plan_, ppl_ref: float | None = None) -> tuple[str, ...]:
    """The checks this comparison fails, by verify's limits for the plan's file type (a
    canary.CanaryPlan: its file_type and n_vocab)."""
    if c is None or c.compared == 0:
        return ("no position could be compared",)
    _, _, limits = verify.rules(plan_.file_type)
    values = {"kld_mean": c.kld_mean, "top1": c.top1, "ppl_ratio": c.ppl_ratio}
    failed = []
    if c.clear_parting:  # first: the most telling of the failures
        failed.append(f"top-1 (the answer parted from the reference's at token {c.parted_at}, where the "
                      f"reference's choice was clear)")
    for t in limits:
        if t.metric not in values or (t.metric == "top1" and (c.clear_parting or math.isnan(c.top1))):
            continue
        if ppl_ref is not None and not t.judged(ppl_ref, plan_.n_vocab):
            continue
        # the PPL ratio of a few tokens is noisy (a right CPU build at -np 4 measured 1.04 on 16):
        # it fails when even its lower bound is above the limit
        judged = c.ppl_ratio_low if t.metric == "ppl_ratio" else values[t.metric]
        if not t.holds(judged):
            sign = "<=" if t.upper else ">="
            failed.append(f"{t.metric} {_fmt(values[t.metric])} (limit {sign} {t.limit:g})")
    return tuple(failed)


def _fmt(x: float) -> str:
    return "nan" if x is None or math.isnan(x) else f"{x:.4g}"
