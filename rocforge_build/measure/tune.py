"""`rocforge tune`: build (or reuse) the candidate builds, gate them, search the runtime variants
one dimension at a time, and pick a winner per context range.  The winner is a preset."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rocforge_build.measure import bench
from rocforge_build.resources import load_toml, package_data


def rules() -> dict:
    return load_toml(package_data("tune.toml"), "tune settings")


def coordinate_search(dims: Sequence[Sequence], score: Callable[[tuple], float],
                      start: tuple | None = None) -> tuple[tuple, float]:
    """Vary one dimension at a time from `start`, keep the best, repeat until nothing improves.
    Finds the cross product's winner when the dimensions' effects do not interact much, with
    sum(len(d)) evaluations per sweep instead of prod(len(d))."""
    point = tuple(start) if start else tuple(d[0] for d in dims)
    best = score(point)
    improved = True
    while improved:
        improved = False
        for i, values in enumerate(dims):
            for v in values:
                cand = point[:i] + (v,) + point[i + 1:]
                s = score(cand)
                if s > best:
                    point, best, improved = cand, s, True
    return point, best


def exhaustive(dims: Sequence[Sequence], score: Callable[[tuple], float]) -> tuple[tuple, float]:
    return max(((p, score(p)) for p in itertools.product(*dims)), key=lambda x: x[1])


def range_score(rows: list[dict], depth: int) -> float:
    vals = [r["t_s"] for r in rows if r.get("depth") == depth and r.get("status") == "ok" and r.get("t_s")]
    tests = {r["test"] for r in rows if r.get("depth") == depth and r.get("status") == "ok"}
    if not vals or tests != {"pp", "tg"}:
        return -math.inf
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass
class Candidate:
    build: object  # LlamaBuild
    gate: str = "skipped"
    measured: dict = field(default_factory=dict)  # Variant -> rows
    samples: dict = field(default_factory=dict)  # Variant -> [rows, ...]: the search's and settling's
    remeasure: Callable | None = None  # Variant -> rows: one more llama-bench run of it
    race: Race | None = None  # the default search's stopwatch (None: --exhaustive)
    note: str | None = None


# The KV cache type as a dimension of the search, named so that no environment variable can be
# called the same.  A q8_0 cache holds K and V in half the memory of f16 (llama.cpp's
# tools/llama-bench: -ctk/-ctv): at long context the cache is most of what is read per token, so
# it can be faster there and leaves room for a longer context or more slots; at short context it
# costs dequantization.  Searched where the build's llama-bench has -ctk/-ctv; quantized V needs
# flash attention, so fa off with q8_0 is never measured.
KV = "-ctk/-ctv"
KV_SEARCHED = ["f16", "q8_0"]


def dimensions(backend: str, ubatches: list[int] | None, fas: list[bool] | None,
               env: dict[str, list[str]] | None, n_ctx: int | None,
               kvs: list[str] | None = None) -> tuple[list[list], list[str]]:
    """(the search's dimensions, the names of those after flash attention and the micro-batch:
    the KV cache type (KV) where `kvs` has more than f16, then each env variable)."""
    data = rules()["search"]
    ub = ubatches or [u for u in data["ubatch"] if not n_ctx or u <= n_ctx]
    fa = fas or data["fa"]
    envs = env if env is not None else {k: v for k, v in data.get("env", {}).get(backend, {}).items()
                                        if isinstance(v, list)}
    kv_dim = {KV: list(kvs)} if kvs and kvs != ["f16"] else {}
    named = {**kv_dim, **envs}
    dims = [list(fa), list(ub)] + [list(v) for v in named.values()]
    return dims, list(named)


def to_variant(point: tuple, env_names: list[str]) -> bench.Variant:
    """The variant at `point`: f16, llama.cpp's default KV cache, is no flag (the argv every earlier
    search ran)."""
    named = dict(zip(env_names, point[2:], strict=False))
    kv = named.pop(KV, None)
    return bench.Variant(ubatch=point[1], fa=point[0], env=tuple(named.items()),
                         kv=None if kv in (None, "f16") else kv)


def runnable(v: bench.Variant) -> bool:
    """llama.cpp quantizes the V cache only with flash attention: such a variant is not measured."""
    return not (v.kv and v.kv != "f16" and v.fa is False)


@dataclass
class Race:
    """The default search's stopwatch: a screening run that has already taken `factor` times the
    fastest complete screening run of the same build is stopped (data/tune.toml [screen] says why
    that cannot cost the pick).  --exhaustive runs no race."""
    factor: float
    floor_s: float
    fastest: float | None = None
    stopped: int = 0

    @classmethod
    def from_rules(cls) -> Race:
        screen = rules()["screen"]
        return cls(float(screen["race"]), float(screen["floor_s"]))

    def spec(self, spec: bench.Spec) -> bench.Spec:
        """`spec` with the race's limit where it is tighter than the user's --timeout."""
        if self.fastest is None:
            return spec
        cut = max(self.floor_s, self.factor * self.fastest)
        if spec.timeout is not None and spec.timeout <= cut:
            return spec
        return dataclasses.replace(spec, timeout=cut, stop_reason=(
            f"stopped after {cut:.1f} s, {self.factor:g}x the fastest variant's run ({self.fastest:.1f} s): "
            "it cannot win"))

    def record(self, seconds: float, rows: list[dict], spec: bench.Spec) -> None:
        if rows and all(r.get("status") == "ok" for r in rows):
            self.fastest = seconds if self.fastest is None else min(self.fastest, seconds)
        elif spec.stop_reason and any(r.get("error", "") and spec.stop_reason in r["error"] for r in rows):
            self.stopped += 1


def screening(spec: bench.Spec) -> bench.Spec:
    """The default search's first look at a variant: data/tune.toml [screen] reps (never more than
    the user's --reps); the leaders are measured again with the full --reps when settling."""
    return dataclasses.replace(spec, reps=min(spec.reps, int(rules()["screen"]["reps"])))


def run_spec(spec: bench.Spec, race: Race | None, *, settling: bool) -> bench.Spec:
    """What one llama-bench run of tune measures with.  --exhaustive (no race): the user's spec.
    The default search: screenings, raced against the fastest while searching; settling's repeats
    are screenings too (more, cheaper samples within its budget), under the user's --timeout alone:
    the leaders are the pace, nothing is raced against them."""
    if race is None:
        return spec
    return screening(spec) if settling else race.spec(screening(spec))


def start_point(dims: list[list], env_names: list[str]) -> tuple:
    """Where the coordinate search starts: the recipe's defaults (data/tune.toml [search.default]),
    except where [screen] start names the value least likely to stall (flash attention off): the
    first run has no pace to be raced against, so it must be one that finishes.  Values the search
    does not hold fall back to each dimension's first.  The first sweep still measures the defaults
    (what a user would otherwise run), and the search moves only where a variant beats them."""
    rules_ = rules()
    default = {**rules_["search"].get("default", {}), **rules_["screen"].get("start", {})}
    env_default = default.get("env", {})
    wanted = [default.get("fa"), default.get("ubatch")] + [env_default.get(n) for n in env_names]
    return tuple(w if w in d else d[0] for w, d in zip(wanted, dims, strict=False))


def search(cand: Candidate, dims: list[list], env_names: list[str], ranges: dict[str, int],
           measure: Callable[[bench.Variant], list[dict]], *, full: bool = False) -> dict[str, dict]:
    """Best variant per range for one candidate: {range: {variant, score, rows}}.  Each range's
    coordinate search starts where the last one ended (the first at the defaults): every variant
    is measured at every range's depth, so its path so far costs nothing again."""
    def rows_of(point: tuple) -> list[dict]:
        v = to_variant(point, env_names)
        if not runnable(v):
            return []
        if v not in cand.measured:
            cand.measured[v] = measure(v)
        return cand.measured[v]

    best = {}
    point = start_point(dims, env_names)
    for name, depth in ranges.items():
        def score(p, depth=depth):
            return range_score(rows_of(p), depth)

        point, s = exhaustive(dims, score) if full else coordinate_search(dims, score, start=point)
        v = to_variant(point, env_names)
        best[name] = {"variant": v, "score": s,
                      "rows": [r for r in cand.measured.get(v, []) if r.get("depth") == depth]}
    return best


def range_scores(cand: Candidate, v: bench.Variant, depth: int) -> list[float]:
    """The range's score of every measurement of `v` (the search's and each settling repeat)."""
    return [s for rows in cand.samples.get(v, [cand.measured[v]]) if (s := range_score(rows, depth)) > -math.inf]


def ranking(cands: list[Candidate], depth: int) -> list[tuple[float, Candidate, bench.Variant]]:
    """Every measured variant of every candidate, best first, by the mean of its scores at `depth`:
    each variant was measured at every range's depth, whichever range's search asked for it."""
    out = []
    for c in cands:
        for v in c.measured:
            scores = range_scores(c, v, depth)
            if scores:
                out.append((sum(scores) / len(scores), c, v))
    return sorted(out, key=lambda x: -x[0])


def distance(v: bench.Variant, default: dict) -> int:
    """How many settings of `v` differ from the recipe's defaults."""
    env_default = default.get("env", {})
    d = int(v.fa != default.get("fa")) + int(v.ubatch != default.get("ubatch")) + int(bool(v.kv))
    return d + sum(1 for k, val in v.env if env_default.get(k, val) != val)


def spread(scores: list[float]) -> float:
    return max(scores) - min(scores) if len(scores) > 1 else math.inf


def settle(cands: list[Candidate], depth: int, remeasure: Callable[[Candidate, bench.Variant], list[dict]],
           default: dict, *, rounds: int, deadline: float, clock: Callable[[], float]) -> dict:
    """Decide between the two leaders at `depth` by measuring both again, alternately, until the
    leader's advantage exceeds the spread between either one's repetitions, or `rounds` or the
    deadline ends it.  Within noise, the one closer to the defaults wins, and the note says so."""
    for _ in range(rounds + 1):
        ranked = ranking(cands, depth)
        if len(ranked) < 2:
            break
        (sa, ca, va), (sb, cb, vb) = ranked[:2]
        noise = max(spread(range_scores(ca, va, depth)), spread(range_scores(cb, vb, depth)))
        if sa - sb > noise or clock() >= deadline:
            break
        for c, v in ((ca, va), (cb, vb)):
            if clock() < deadline:
                c.samples.setdefault(v, [c.measured[v]]).append(remeasure(c, v))
    ranked = ranking(cands, depth)
    if len(ranked) < 2:
        return {"ranked": ranked, "note": None}
    (sa, ca, va), (sb, cb, vb) = ranked[:2]
    noise = max(spread(range_scores(ca, va, depth)), spread(range_scores(cb, vb, depth)))
    if noise == math.inf:
        return {"ranked": ranked, "note": f"ahead by {100 * (sa / sb - 1):.1f} % on one measurement "
                                          "each: no time was left to repeat them"}
    if sa - sb > noise:
        return {"ranked": ranked, "note": f"ahead by {sa - sb:.1f} (score), beyond the {noise:.1f} "
                                          "spread between repetitions"}
    tie = f"the top two ({sa:.1f} and {sb:.1f}) are within the {noise:.1f} spread between repetitions"
    if distance(vb, default) < distance(va, default):
        ranked[0], ranked[1] = ranked[1], ranked[0]
        return {"ranked": ranked, "note": f"{tie}: {vb.label()} was kept, the closer to the recipe's "
                                          "defaults"}
    return {"ranked": ranked, "note": f"{tie}: the leader is as close to the recipe's defaults"}
