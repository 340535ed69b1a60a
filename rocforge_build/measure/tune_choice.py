"""tune's choice once the search is done: the leaders of each context range told apart by measuring
them again, and each range's winner the best-ranked variant that also passes verify at the exact
shape its preset will run.  What happens is told to a `Listener`; the command words it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rocforge_build.measure import bench, known_bad, serving, tune, verify
from rocforge_build.measure.preset import command, is_igpu
from rocforge_build.measure.session import Session


class Listener(Protocol):
    """Told each step of the choice as it happens, so a person watching sees why it takes time."""

    def repeating(self, cand: tune.Candidate, v: bench.Variant) -> None: ...

    def verifying(self, range_name: str, cand: tune.Candidate, v: bench.Variant, shape: verify.Shape) -> None: ...

    def refused(self, cand: tune.Candidate, v: bench.Variant, shape: verify.Shape) -> None: ...

    def nothing_verified(self, range_name: str) -> None: ...


# (build, shape, env) -> verify's result at that shape ({"passed", "checks", "reference"})
CheckAtShape = Callable[[object, verify.Shape, dict], dict]


@dataclass(frozen=True)
class Verified:
    """A range's winner: its ranking score, its candidate build and variant, and the check it passed."""
    score: float
    cand: tune.Candidate
    variant: bench.Variant
    check: dict


def settle_all(cands: list[tune.Candidate], ranges: dict[str, int], searched_s: float, listener: Listener,
               clock: Callable[[], float] = time.monotonic) -> dict[str, dict]:
    """Per range, every measured variant ranked, the two leaders measured again until they are
    told apart beyond the noise between repetitions (or the budget, a share of the search's time,
    ends)."""
    rules = tune.rules()
    default = dict(rules["search"].get("default", {}))
    deadline = clock() + rules["settle"]["budget_share"] * searched_s

    def remeasure(cand: tune.Candidate, v: bench.Variant) -> list[dict]:
        listener.repeating(cand, v)
        return cand.remeasure(v)

    return {name: tune.settle(cands, depth, remeasure, default, rounds=int(rules["settle"]["rounds"]),
                              deadline=deadline, clock=clock)
            for name, depth in ranges.items()}


def choose(settled: dict[str, dict], ranges: dict[str, int], ctx_of: dict[str, int], session: Session,
           check_at: CheckAtShape, listener: Listener, *, exhaustive: bool) -> tuple[dict | None, list[dict]]:
    """Each range's winner: the best-ranked variant that also passes verify at exactly the shape
    the preset will run (its context, micro-batch, flash attention, env and offload).  Returns
    (the preset, or None when no range has a winner; every variant refused, with its range): a
    variant that fails is never stored, and the output names it whether or not a preset is."""
    out, rejected = {}, []
    for name, depth in ranges.items():
        won, refused = first_verified(name, settled[name]["ranked"], ctx_of[name], check_at, listener,
                                      session.base.get("host"))
        rejected += refused
        if won is None:
            if refused:
                listener.nothing_verified(name)
            continue
        out[name] = entry(won, depth, ctx_of[name], settled[name]["ranked"], str(session.model.path),
                          session.base["host"])
        out[name]["settled"] = settled[name]["note"]
        out[name]["rejected"] = refused
    if not out:
        return None, rejected
    from rocforge_build.measure.store import now

    return {"model": {"name": session.model.name, "sha256": session.base["model_sha256"],
                      "path": str(session.model.path)},
            "created": now(), "ranges": out, "reason": tune.rules()["score"]["reason"],
            "exhaustive": exhaustive}, rejected


def range_shape(ctx: int, cand: tune.Candidate, v: bench.Variant, host: dict | None = None) -> verify.Shape:
    """The shape a preset of `v` runs at (preset.serving_shape, what its command spells): the
    range's context, the variant's micro-batch (llama.cpp's 512 when it sets none), flash attention
    and KV cache type, every layer offloaded on a GPU build, the weights' loading on this host."""
    from rocforge_build.measure.preset import serving_shape

    return serving_shape(cand.build, v.to_json(), ctx, is_igpu(cand.build, host or {}) if host is not None else False)


def first_verified(name: str, ranked: list, ctx: int, check_at: CheckAtShape,
                   listener: Listener, host: dict | None = None) -> tuple[Verified | None, list[dict]]:
    """The first of `ranked` that passes verify at the range's own shape, or None; and the ones
    before it that failed there (a check that could not run at the shape is a failure too)."""
    rejected = []
    for score, cand, v in ranked:
        shape = range_shape(ctx, cand, v, host)
        listener.verifying(name, cand, v, shape)
        fault = known_bad.find(cand.build.manifest, shape.fa, shape.parallel, shape.ctx * shape.parallel)
        try:  # a shape its build is known to compute wrong is never stored, whatever one check says
            check = ({"passed": False, "checks": [{"failed": [
                f"matches a known llama.cpp fault: {known_bad.describe(fault)}"]}]} if fault
                else check_at(cand.build, shape, dict(v.env)))
        except verify.VerifyError as exc:
            check = {"passed": False, "checks": [{"failed": [exc.message]}]}
        if check["passed"]:
            return Verified(score, cand, v, check), rejected
        why = "; ".join(check["checks"][0]["failed"])[:300]
        rejected.append({"range": name, "prefix": str(cand.build.prefix), "variant_label": v.label(),
                         "shape": shape.to_json(), "env": dict(v.env),
                         "reason": f"failed verify at {shape.label()}: {why}"})
        listener.refused(cand, v, shape)
    return None, rejected


def pooled_rows(samples: list[list[dict]], depth: int) -> list[dict]:
    """One row per test at `depth` over every llama-bench run of a variant (the search's and
    settling's): the mean t/s, and the spread between the runs where there are several (a single
    run keeps llama-bench's own stddev over its repetitions)."""
    out = []
    for test in ("pp", "tg"):
        got = [r for rows in samples for r in rows
               if r.get("depth") == depth and r.get("test") == test and r.get("status") == "ok" and r.get("t_s")]
        if got:
            vals = [r["t_s"] for r in got]
            mean = sum(vals) / len(vals)
            sd = (sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else got[0]["stddev"]
            out.append({**got[-1], "t_s": mean, "stddev": sd})
    return out


def entry(won: Verified, depth: int, ctx: int, ranked: list, model_path: str, host: dict) -> dict:
    """A range's part of the preset: the winner's build, variant, pooled figures, runner-up, the
    check it passed at its shape, and the command that runs it."""
    cand, v, check = won.cand, won.variant, won.check
    rows = pooled_rows(cand.samples.get(v, [cand.measured[v]]), depth) or \
        [r for r in cand.measured[v] if r.get("depth") == depth] or \
        [r for r in cand.measured[v] if r.get("depth") == 0]
    env, argv, notes = command(cand.build, model_path, v.to_json(), ctx, is_igpu(cand.build, host))
    runner = next(((sc, c, w) for sc, c, w in ranked if (c, w) != (cand, v)), None)
    return {
        "prefix": str(cand.build.prefix), "backend": cand.build.backend, "stamp": cand.build.stamp,
        "depth": rows[0]["depth"] if rows else depth, "ctx": ctx,
        "variant": v.to_json(), "variant_label": v.label(), "score": won.score,
        "repetitions": len(cand.samples.get(v, [None])),
        "figures": [{"test": r["test"], "n": r["n_prompt"] if r["test"] == "pp" else r["n_gen"],
                     "depth": r["depth"], "t_s": r["t_s"], "stddev": r["stddev"]} for r in rows],
        "runner_up": (f"{runner[1].build.label()} {runner[2].label()} score {runner[0]:.1f}") if runner else None,
        "verified": {"shape": check["checks"][0] and {k: check["checks"][0][k]
                                                      for k in ("ctx", "ubatch", "fa", "ngl", *serving.SERVING_FIELDS)},
                     "kld_mean": check["checks"][0]["kld_mean"], "top1": check["checks"][0]["top1"],
                     "reference": check["reference"]},
        "env": env, "argv": argv, "notes": notes,
    }
