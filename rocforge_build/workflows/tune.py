"""`rocforge tune`'s session: each backend's candidate build pulled from a substitute store, built
or reused (never a user's build of another plan replaced), gated with verify, searched one
dimension at a time (measure/tune.py), each range's leaders told apart and the winner verified at
the range's own shape (measure/tune_choice.py), and the preset stored for the model.

The command builds one `Asked` from its flags, checked before anything is built, and prints the
`Outcome`; what happens meanwhile is told through `say` (lines for people) and a
`tune_choice.Listener` (the choice's steps)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.measure import bench, serving, tune, tune_choice, verify
from rocforge_build.measure.llama_tools import MEASURE_TARGETS, LlamaBuild
from rocforge_build.measure.session import Progress, Session, open_session
from rocforge_build.rootfs import Root

TUNE_NEEDS = ("llama-bench", "llama-perplexity")  # what tune runs of each candidate


@dataclass(frozen=True)
class Candidates:
    """Which builds one tune measures, as asked: each backend's build of the recipe (`backends`
    None: every backend the recipe has) for the target, from the source and ref given, asked of
    the substitute stores or not (`substitutes`: auto or off), and the user's --build ones."""
    recipe: str
    target: str
    rootfs: Root
    backends: tuple[str, ...] | None = None
    source: str | None = None
    ref: str | None = None
    jobs: int | None = None
    substitutes: str = "auto"
    given: tuple[LlamaBuild, ...] = ()


@dataclass(frozen=True)
class Search:
    """What is measured of each candidate, as asked: the context ranges winners are picked for, the
    llama-bench shape, the gate's contexts, the values searched (empty: data/tune.toml's; `env`
    None: each backend's default variables), and whether the full cross product is measured."""
    ranges: tuple[ContextRange, ...]
    n_prompt: int = 512
    n_gen: int = 128
    reps: int = 3
    threads: int | None = None
    timeout: float | None = None
    gate_ctx: tuple[int, ...] = ()
    ubatch: tuple[int, ...] = ()
    fa: tuple[bool | None, ...] = ()
    env: dict[str, list[str]] | None = None
    kv: tuple[str, ...] = ()
    exhaustive: bool = False


@dataclass(frozen=True)
class Asked:
    """One tune as the command line gave it: the model, its candidates and its search, the command
    line recorded with the run, and whether progress is shown (not under --json)."""
    model: str
    candidates: Candidates
    search: Search
    argv: tuple[str, ...] = ()
    quiet: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one tune found: its run in the results store, the backends skipped and why, each
    candidate's gate and search, the variants refused at a range's own shape, the preset stored
    (None: none stored), each range's depth, and how many candidates passed the verify gate."""
    run: int
    skipped: list[dict]
    candidates: list[dict]
    rejected: list[dict]
    preset: dict | None
    ranges: dict[str, int]
    model_path: Path
    gated_in: int

    def to_json(self) -> dict:
        return {"run": self.run, "skipped": self.skipped, "candidates": self.candidates,
                "rejected": self.rejected, "preset": self.preset}

    def nothing_stored(self) -> UsageError:
        """Why no preset was made, in one line: no candidate passed the gate; or, per range, no
        variant finished its runs, or every ranked variant failed verify at the range's own shape
        (named)."""
        if not self.gated_in:
            return UsageError("no candidate passed the verify gate; no preset was made",
                              "see `rocforge results show` for the failed checks")
        rejected = self.rejected
        refused = [n for n in self.ranges if any(r["range"] == n for r in rejected)]
        if not refused:  # gated in, but no variant finished its pp and tg runs at a range's depth
            return UsageError("no variant finished its runs (failed or over --timeout); no preset was made",
                              f"see `rocforge results show {self.run}` for the failed runs")
        names = "; ".join(f"{r['range']}: {r['variant_label']} of {r['prefix']} at "
                          f"{verify.Shape(**r['shape']).label()}" for r in rejected)
        unfinished = [n for n in self.ranges if n not in refused]
        why = (f"every ranked variant failed verify at its range's own shape ({names})" if not unfinished else
               f"{', '.join(unfinished)}: no variant finished its runs (failed or over --timeout); "
               f"{', '.join(refused)}: every ranked variant failed verify at the range's own shape ({names})")
        first = rejected[0]
        return UsageError(f"no preset was made: {why}",
                          "why each failed is under `rejected` (--json) or 'not stored' above; the first in "
                          f"full: {verify.command_line(first['prefix'], self.model_path, first['shape'], first['env'])}")


@dataclass(frozen=True)
class ContextRange:
    """A context range winners are picked for (data/tune.toml `[ranges]`): the KV depth it is
    measured at and the context its preset serves."""
    name: str
    depth: int
    ctx: int


def wanted_ranges(contexts: str, n_prompt: int, n_gen: int) -> tuple[ContextRange, ...]:
    """The context ranges asked for (`--contexts`), in the order asked, read from data/tune.toml
    before anything is built: a typo or nothing to measure is one line, not an hour of builds."""
    if not (n_prompt or n_gen):
        raise UsageError("-p/--n-prompt and -n/--n-gen are both 0: there is nothing to measure",
                         "give one of them a number of tokens above 0")
    wanted = tuple(c.strip() for c in contexts.split(",") if c.strip())
    all_ranges = tune.rules()["ranges"]
    bad = [c for c in wanted if c not in all_ranges]
    if bad or not wanted:
        raise UsageError(f"--contexts {contexts!r}: known ranges are {', '.join(all_ranges)}")
    return tuple(ContextRange(c, int(all_ranges[c]["depth"]), int(all_ranges[c]["ctx"])) for c in wanted)


# -- the candidates -------------------------------------------------------------------------------

def _usable_as_is(plan):
    """The rocforge build already at the plan's prefix when it has every program tune runs (the
    user's full build serves as it is, whatever else it holds); None when it does not."""
    from rocforge_build.discover.builds import read_manifest

    if not plan.prefix.is_dir() or not read_manifest(plan.prefix):
        return None
    build = LlamaBuild.open(plan.prefix)
    return build if all(build.has(p) for p in TUNE_NEEDS) else None


def _holds_another_build(plan) -> bool:
    """Whether the plan's prefix holds something tune may not replace: a build it did not make
    for itself (pipeline.owner_problem: the user's build of another plan), or anything at all
    without a manifest."""
    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.forge import pipeline

    if not plan.prefix.is_dir() or not any(plan.prefix.iterdir()):
        return False
    return not read_manifest(plan.prefix) or pipeline.owner_problem(plan) is not None


def tune_prefix(prefix) -> Path:
    """Where tune builds a candidate of its own: `<builds>/tune/<the default prefix's name>`."""
    from rocforge_build.forge.locations import own_builds_dir

    return own_builds_dir("tune") / Path(prefix).name


def candidates(asked: Candidates, say: Callable[[str], None], *,
               quiet: bool) -> tuple[list[LlamaBuild], list[dict]]:
    """The builds of each backend (pulled from a substitute store, built or reused) and the
    given --build ones, each prefix once: a --build that is the very build a backend makes is
    one candidate, not two."""
    from rocforge_build import substitute
    from rocforge_build.forge import pipeline, recipes
    from rocforge_build.forge.plan import Request

    recipe = recipes.load(asked.recipe)
    names = [b for b in (asked.backends if asked.backends is not None else recipe.backends) if b]
    unknown = [b for b in names if b not in recipe.backends]
    if unknown:
        raise UsageError(f"recipe {recipe.name} has no backend {', '.join(unknown)}",
                         f"backends: {', '.join(recipe.backends)}")
    builds, skipped = [], []
    for name in names:
        req = Request(recipe=asked.recipe, target=asked.target, backend=name, source=asked.source,
                      ref=asked.ref, jobs=asked.jobs, build_targets=MEASURE_TARGETS, made_for="tune",
                      substitutes=asked.substitutes)
        try:
            plan, read = _plan(req, asked.rootfs)
        except RocforgeError as exc:
            skipped.append({"backend": name, "reason": exc.message})
            say(f"skipping backend {name}: {exc.message}")
            continue
        there = _usable_as_is(plan)
        if there is not None:
            say(f"using the {name} build at {plan.prefix} as it is (it has {', '.join(TUNE_NEEDS)})")
            builds.append(there)
            continue
        if _holds_another_build(plan):  # the user's build of another plan: never rebuilt by tune
            own = tune_prefix(plan.prefix)
            say(f"{plan.prefix} holds a build of another plan without {', '.join(TUNE_NEEDS)}; "
                f"tune builds its own at {own}")
            plan, read = _plan(dataclasses.replace(req, prefix=str(own)), asked.rootfs)
            if _holds_another_build(plan):  # the user's build there too (their --prefix): never replaced
                reason = pipeline.owner_problem(plan) or f"{own} holds files that are not a rocforge build"
                skipped.append({"backend": name, "reason": reason})
                say(f"skipping backend {name}: {reason}")
                continue
        say(f"building (or reusing) the {name} build")
        # the stores `rocforge build` asks (substitute.stores): a candidate a trusted store holds
        # is pulled, checked and verified here instead of compiled, the same path as a build's
        # (the source is downloaded only when the candidate is compiled: `read`)
        out = pipeline.execute(plan, quiet=quiet, substitute=substitute.from_stores, read=read)
        if out.status == pipeline.Status.SUBSTITUTED:
            say(f"the {name} build came from a substitute store: nothing compiled")
        builds.append(LlamaBuild.open(out.prefix))
    for b in asked.given:
        if any(b.prefix == other.prefix for other in builds):
            say(f"--build {b.prefix} is already a candidate: measured once")
            continue
        builds.append(b)
    if not builds:
        raise UsageError("no candidate build: every backend was skipped", "; ".join(s["reason"] for s in skipped))
    return builds, skipped


def _plan(req, root):
    """A candidate's plan, its source named without a download where it can be, as `rocforge
    build` plans (`BuildContext.identified`), and how to read it for a compile (None: read)."""
    from rocforge_build.forge.context import BuildContext
    from rocforge_build.forge.plan import make_plan

    context = BuildContext.of(req, root).identified()
    plan = make_plan(context, check_patches=False)
    return plan, (None if context.source_read else lambda: make_plan(context.read(), check_patches=False))


# -- the session ----------------------------------------------------------------------------------

def run(asked: Asked, say: Callable[[str], None], told: tune_choice.Listener) -> Outcome:
    """The candidates, each gated and searched under one run of the results store, then each
    range's winner chosen and stored as the model's preset; the rows measured before a Ctrl-C are
    kept (`bench.Interrupted` names the run)."""
    search = asked.search
    builds, skipped = candidates(asked.candidates, say, quiet=asked.quiet)
    s = open_session(asked.model, builds, TUNE_NEEDS, asked.candidates.rootfs)
    n_ctx = s.model.n_ctx_train
    room = (n_ctx or 10 ** 9) - search.n_prompt - search.n_gen
    ranges = {r.name: max(0, min(r.depth, room)) for r in search.ranges}
    ctx_of = {r.name: min(r.ctx, n_ctx or 10 ** 9) for r in search.ranges}
    spec = bench.Spec(s.model, tuple(sorted(set(ranges.values()))), search.n_prompt, search.n_gen,
                      search.reps, search.threads, timeout=search.timeout)
    run_id = s.store.start_run("tune", list(asked.argv), {"host": s.base["host"], "model": s.base["model"],
                                                          "ranges": ranges, "skipped": skipped})
    progress = Progress(0, quiet=asked.quiet, step="tune")
    measuring = _Measuring(s, run_id, spec, ranges, n_ctx, progress, search, asked.quiet, say)
    results, cands = [], []
    started = time.monotonic()
    status = "failed"
    preset, rejected = None, []
    try:
        for b in builds:
            cand, outcome = _tune_build(b, measuring)
            cands.append(cand)
            if outcome is not None:
                results.append(outcome)
        status = "done"
        searched = time.monotonic() - started
        settled = tune_choice.settle_all([c for c, _, _ in results], ranges, searched, told)

        def check_at(build, shape, env):
            return verify.verify_shape(build, s.model, shape, reference=None, env=env, quiet=asked.quiet)

        preset, rejected = tune_choice.choose(settled, ranges, ctx_of, s, check_at, told,
                                              exhaustive=search.exhaustive)
    except KeyboardInterrupt:
        status = "interrupted"
        raise bench.Interrupted(f"interrupted: the rows measured so far are kept (run {run_id})") from None
    finally:
        progress.close()
        s.store.finish_run(run_id, status)
    summaries = [{"prefix": str(c.build.prefix), "backend": c.build.backend, "gate": c.gate,
                  "measured": len(c.measured), "note": c.note,
                  "screen_reps": None if search.exhaustive else tune.screening(spec).reps,
                  "stopped_by_race": c.race.stopped if c.race else 0,
                  "cross_product": next((f for cc, _, f in results if cc is c), 0)} for c in cands]
    if preset:
        preset["version"] = s.store.add_preset(s.model.name, s.base["model_sha256"], run_id, preset)
    return Outcome(run_id, skipped, summaries, rejected, preset, ranges, s.model.path, len(results))


@dataclass(frozen=True)
class _Measuring:
    """What every candidate of one tune is measured with: the session (model, store, provenance),
    the run its rows go under, the llama-bench spec, each range's depth, the model's trained
    context, the progress shown, the search as asked, and where lines for people go."""
    session: Session
    run_id: int
    spec: bench.Spec
    ranges: dict[str, int]
    n_ctx: int | None
    progress: Progress
    search: Search
    quiet: bool
    say: Callable[[str], None]


def _tune_build(b: LlamaBuild, m: _Measuring):
    """One candidate build: the verify gate per flash-attention setting (a failed one is
    recorded and never wins), then the search over its variants.  Returns (candidate,
    (candidate, best, cross-product size) or None when no setting passed the gate)."""
    s, search, say = m.session, m.search, m.say
    fas = list(search.fa) or tune.rules()["search"]["fa"]
    gates = {bool(fa): verify.gate(b, s.model, reference=None, store=s.store, run_id=m.run_id, base=s.base,
                                   coverage=verify.plan(s.model, gpu=b.gpu, ctx=list(search.gate_ctx) or None,
                                                        support=serving.ServingSupport.of(b)),
                                   fa=bool(fa), quiet=m.quiet)[0] for fa in fas}
    passing = [fa for fa, v in gates.items() if v == "passed"]
    verdict = "passed" if passing else "failed"
    cand = tune.Candidate(b, verdict)
    base = {**s.base, "prefix": str(b.prefix), "backend": b.backend, "stamp": b.stamp,
            "build": b.provenance(), "gate": verdict}
    for fa, v in gates.items():
        if v != "passed":
            s.store.add_row(m.run_id, "bench", {**base, "gate": "failed", "fa": fa, "test": "gate",
                                                "status": "gate-failed"}, status="gate-failed")
            say(f"{b.label()} failed the verify gate with flash attention {'on' if fa else 'off'}: "
                "those variants never win")
    if not passing:
        return cand, None
    depths, note = bench.depths_for(b, m.spec.depths)
    if note:
        cand.note = note
    dims, env_names = tune.dimensions(b.backend, list(search.ubatch) or None,
                                      passing,
                                      search.env, m.n_ctx, _kv_searched(b, search.kv, say))

    race = None if search.exhaustive else tune.Race.from_rules()
    cand.race = race
    progress = m.progress

    def measure(v, b=b, base=base, depths=depths, race=race, settling=False):
        """The search's runs are screenings raced against the fastest; settling's repeats are
        screenings under the user's --timeout alone (--exhaustive: the full --reps throughout)."""
        run_spec = tune.run_spec(m.spec, race, settling=settling)
        progress.status(f"{b.label()} {v.label()}")
        rows, clock = [], []
        bench.run_variant(b, run_spec, v, base, depths,
                          lambda r: (s.store.add_row(m.run_id, "bench", r, status=r["status"]),
                                     rows.append(r), progress.advance(r)), clock=clock)
        if race is not None and not settling and clock:
            race.record(clock[-1], rows, run_spec)
        return rows

    if bench.wants_warmup(m.spec, b):  # the driver's pipeline compiles (see bench.Spec.warmup)
        progress.status(f"warming up {b.label()} (one discarded run)")
        bench.warm_up(b, m.spec, tune.to_variant(tuple(d[0] for d in dims), env_names))
    best = tune.search(cand, dims, env_names, {k: d if d in depths else 0 for k, d in m.ranges.items()},
                       measure, full=search.exhaustive)
    full = math.prod(len(d) for d in dims)
    cand.remeasure = lambda v, measure=measure: measure(v, settling=True)
    return cand, (cand, best, full)


def _kv_searched(b, asked: tuple[str, ...], say) -> list[str]:
    """The KV cache types searched for build `b`: those asked for, else tune.KV_SEARCHED, where its
    llama-bench has -ctk/-ctv (its own --help says); f16 alone where it has not."""
    if {"-ctk", "--cache-type-k"} & b.options("llama-bench") and {"-ctv", "--cache-type-v"} & b.options("llama-bench"):
        return list(asked or tune.KV_SEARCHED)
    if asked and list(asked) != ["f16"]:
        say(f"{b.label()}: its llama-bench has no -ctk/-ctv: the KV cache stays f16")
    return ["f16"]
