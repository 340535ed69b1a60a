"""`rocforge tune RECIPE --target GFX --model GGUF`: pull, build or reuse each candidate build, gate it
with verify, search flash attention / ubatch / env one dimension at a time, pick a winner per
context range and store it as the model's preset (`rocforge preset show MODEL`)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import argtypes
from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.measure import bench, serving, tune, tune_choice, verify
from rocforge_build.measure.llama_tools import MEASURE_TARGETS, LlamaBuild
from rocforge_build.measure.session import Progress, open_session


def add_arguments(parser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe name or .toml file (llama-cpp)")
    parser.add_argument("--target", metavar="GFX", help="GPU target (default: the detected GPU)")
    parser.add_argument("--model", required=True, metavar="GGUF", help="the model file to tune for")
    parser.add_argument("--backends", metavar="B,...", help="candidate backends (default: every one the source and toolchain allow)")
    parser.add_argument("--build", action="append", default=[], metavar="PREFIX", help="also an existing build (repeatable)")
    parser.add_argument("--source", metavar="PATH|URL", help="build this source (see rocforge build)")
    parser.add_argument("--ref", metavar="REF", help="build this git tag, branch or commit of the recipe's source")
    parser.add_argument("--contexts", default="short,long", metavar="short,long", help="context ranges to pick winners for")
    parser.add_argument("--ubatch", type=argtypes.int_list(1), metavar="N,...", help="micro-batch values searched (default: data/tune.toml)")
    parser.add_argument("--fa", metavar="on,off", help="flash attention values searched (default: data/tune.toml)")
    parser.add_argument("--env", action="append", metavar="VAR=a,b", help="env values searched (default per backend)")
    parser.add_argument("--kv", type=serving.kv_list, metavar="f16,q8_0",
                        help="KV cache types searched (default: f16 and q8_0 where the build's llama-bench has -ctk/-ctv)")
    parser.add_argument("--reps", type=argtypes.reps, default=3, metavar="N", help="repetitions (-r; default 3)")
    parser.add_argument("-p", "--n-prompt", type=argtypes.tokens, default=512, metavar="N", help="prompt tokens (pp test; default 512)")
    parser.add_argument("-n", "--n-gen", type=argtypes.tokens, default=128, metavar="N", help="generated tokens (tg test; default 128)")
    parser.add_argument("--threads", type=argtypes.threads, metavar="N", help="CPU threads (-t)")
    parser.add_argument("--timeout", type=argtypes.positive_seconds, metavar="S",
                        help="stop a llama-bench run after S seconds; that variant is recorded as "
                             "failed and cannot win (e.g. flash attention that falls back to the CPU)")
    parser.add_argument("--ctx", type=argtypes.int_list(1), metavar="N,...", help="the gate's contexts (see rocforge verify)")
    parser.add_argument("--exhaustive", action="store_true", help="measure the full cross product instead")
    parser.add_argument("--jobs", "-j", type=argtypes.jobs, metavar="N", help="build jobs")
    parser.add_argument("--no-substitutes", action="store_true",
                        help="compile each candidate here: ask no substitute store (substitute.stores)")
    parser.add_argument("--json", action="store_true", help="the candidates, rows and winners as JSON")


TUNE_NEEDS = ("llama-bench", "llama-perplexity")  # what tune runs of each candidate


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


def candidates(args, say, given: list[LlamaBuild]) -> tuple[list[LlamaBuild], list[dict]]:
    """The builds of each backend (pulled from a substitute store, built or reused) and the
    `given` --build ones, each prefix once: a --build that is the very build a backend makes is
    one candidate, not two."""
    from rocforge_build.commands.build import substitute
    from rocforge_build.forge import pipeline, recipes
    from rocforge_build.forge.plan import Request

    recipe = recipes.load(args.recipe)
    names = [b for b in (args.backends.split(",") if args.backends else recipe.backends) if b]
    unknown = [b for b in names if b not in recipe.backends]
    if unknown:
        raise UsageError(f"recipe {recipe.name} has no backend {', '.join(unknown)}",
                         f"backends: {', '.join(recipe.backends)}")
    builds, skipped = [], []
    for name in names:
        req = Request(recipe=args.recipe, target=args.target, backend=name, source=args.source,
                      ref=args.ref, jobs=args.jobs, build_targets=MEASURE_TARGETS, made_for="tune",
                      substitutes="off" if getattr(args, "no_substitutes", False) else "auto")
        try:
            plan, read = _plan(req, args.rootfs)
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
            plan, read = _plan(dataclasses.replace(req, prefix=str(own)), args.rootfs)
            if _holds_another_build(plan):  # the user's build there too (their --prefix): never replaced
                reason = pipeline.owner_problem(plan) or f"{own} holds files that are not a rocforge build"
                skipped.append({"backend": name, "reason": reason})
                say(f"skipping backend {name}: {reason}")
                continue
        say(f"building (or reusing) the {name} build")
        # the stores `rocforge build` asks (substitute.stores): a candidate a trusted store holds
        # is pulled, checked and verified here instead of compiled, the same path as a build's
        # (the source is downloaded only when the candidate is compiled: `read`)
        out = pipeline.execute(plan, quiet=args.json, substitute=substitute, read=read)
        if out.status == pipeline.Status.SUBSTITUTED:
            say(f"the {name} build came from a substitute store: nothing compiled")
        builds.append(LlamaBuild.open(out.prefix))
    for b in given:
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


def _target(args) -> str:
    """--target, else the detected GPU; "" when no requested backend's toolchain compiles for a
    GPU target (cpu, vulkan) and none is detected: only hip candidates need one."""
    from rocforge_build.commands import target_or_detected
    from rocforge_build.forge import recipes

    recipe = recipes.load(args.recipe)
    names = [b for b in (args.backends.split(",") if args.backends else recipe.backends) if b]
    if args.target or any(recipe.backends[n].toolchain == "hip" for n in names if n in recipe.backends):
        return target_or_detected(args)
    try:
        return target_or_detected(args)
    except UsageError:
        return ""


def run(args) -> int:
    # every value is checked before the target is detected, a source downloaded or a build made
    wanted, all_ranges = _wanted_ranges(args)
    args.fa_values = bench.fa_list(args.fa) if args.fa else None
    args.env_values = bench.env_pairs(args.env) if args.env else None
    given = [LlamaBuild.open(p) for p in args.build]
    for b in given:
        b.program("llama-bench")
    from rocforge_build.measure import gguf

    model = gguf.check(args.model)  # a bad model is reported before anything is built
    args.target = _target(args)
    say = (lambda text: None) if args.json else (lambda text: sys.stderr.write(f"rocforge: tune: {text}\n"))
    builds, skipped = candidates(args, say, given)
    s = open_session(args.model, builds, ("llama-bench", "llama-perplexity"), args.rootfs)
    n_ctx = s.model.n_ctx_train
    room = (n_ctx or 10 ** 9) - args.n_prompt - args.n_gen
    ranges = {name: max(0, min(int(all_ranges[name]["depth"]), room)) for name in wanted}
    ctx_of = {name: min(int(all_ranges[name]["ctx"]), n_ctx or 10 ** 9) for name in wanted}
    spec = bench.Spec(model, tuple(sorted(set(ranges.values()))), args.n_prompt, args.n_gen, args.reps,
                      args.threads, timeout=args.timeout)
    run_id = s.store.start_run("tune", args.argv, {"host": s.base["host"], "model": s.base["model"],
                                                   "ranges": ranges, "skipped": skipped})
    progress = Progress(0, quiet=args.json, step="tune")
    results, cands = [], []
    started = time.monotonic()
    status = "failed"
    preset, rejected = None, []
    try:
        for b in builds:
            cand, outcome = _tune_build(b, s, spec, run_id, ranges, n_ctx, progress, args, say)
            cands.append(cand)
            if outcome is not None:
                results.append(outcome)
        status = "done"
        searched = time.monotonic() - started
        told = _Told(say)
        settled = tune_choice.settle_all([c for c, _, _ in results], ranges, searched, told)

        def check_at(build, shape, env):
            return verify.verify_shape(build, s.model, shape, reference=None, env=env, quiet=args.json)

        preset, rejected = tune_choice.choose(settled, ranges, ctx_of, s, check_at, told,
                                              exhaustive=bool(args.exhaustive))
    except KeyboardInterrupt:
        status = "interrupted"
        raise bench.Interrupted(f"interrupted: the rows measured so far are kept (run {run_id})") from None
    finally:
        progress.close()
        s.store.finish_run(run_id, status)
    summary = {"run": run_id, "skipped": skipped,
               "candidates": [{"prefix": str(c.build.prefix), "backend": c.build.backend, "gate": c.gate,
                               "measured": len(c.measured), "note": c.note,
                               "screen_reps": None if args.exhaustive else tune.screening(spec).reps,
                               "stopped_by_race": c.race.stopped if c.race else 0,
                               "cross_product": next((f for cc, _, f in results if cc is c), 0)} for c in cands],
               "rejected": rejected, "preset": preset}
    if preset:
        preset["version"] = s.store.add_preset(s.model.name, s.base["model_sha256"], run_id, preset)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(summary, list(ranges), s.model.path, args.reps)
    if not preset:
        raise nothing_stored(results, rejected, list(ranges), run_id, s.model.path)
    return 0


def nothing_stored(results, rejected: list[dict], ranges: list[str], run_id: int, model_path) -> UsageError:
    """Why no preset was made, in one line: no candidate passed the gate; or, per range, no variant
    finished its runs, or every ranked variant failed verify at the range's own shape (named)."""
    if not results:
        return UsageError("no candidate passed the verify gate; no preset was made",
                          "see `rocforge results show` for the failed checks")
    refused = [n for n in ranges if any(r["range"] == n for r in rejected)]
    if not refused:  # gated in, but no variant finished its pp and tg runs at a range's depth
        return UsageError("no variant finished its runs (failed or over --timeout); no preset was made",
                          f"see `rocforge results show {run_id}` for the failed runs")
    names = "; ".join(f"{r['range']}: {r['variant_label']} of {r['prefix']} at "
                      f"{verify.Shape(**r['shape']).label()}" for r in rejected)
    unfinished = [n for n in ranges if n not in refused]
    why = (f"every ranked variant failed verify at its range's own shape ({names})" if not unfinished else
           f"{', '.join(unfinished)}: no variant finished its runs (failed or over --timeout); "
           f"{', '.join(refused)}: every ranked variant failed verify at the range's own shape ({names})")
    first = rejected[0]
    return UsageError(f"no preset was made: {why}",
                      "why each failed is under `rejected` (--json) or 'not stored' above; the first in "
                      f"full: {verify.command_line(first['prefix'], model_path, first['shape'], first['env'])}")


def _wanted_ranges(args) -> tuple[list[str], dict]:
    """The context ranges asked for (and every range data/tune.toml knows), checked before
    anything is built: a typo or nothing to measure is one line, not an hour of builds."""
    if not (args.n_prompt or args.n_gen):
        raise UsageError("-p/--n-prompt and -n/--n-gen are both 0: there is nothing to measure",
                         "give one of them a number of tokens above 0")
    wanted = [c.strip() for c in args.contexts.split(",") if c.strip()]
    all_ranges = tune.rules()["ranges"]
    bad = [c for c in wanted if c not in all_ranges]
    if bad or not wanted:
        raise UsageError(f"--contexts {args.contexts!r}: known ranges are {', '.join(all_ranges)}")
    return wanted, all_ranges


def _tune_build(b, s, spec, run_id, ranges: dict[str, int], n_ctx, progress, args, say):
    """One candidate build: the verify gate per flash-attention setting (a failed one is
    recorded and never wins), then the search over its variants.  Returns (candidate,
    (candidate, best, cross-product size) or None when no setting passed the gate)."""
    fas = args.fa_values or tune.rules()["search"]["fa"]
    gates = {bool(fa): verify.gate(b, s.model, reference=None, store=s.store, run_id=run_id, base=s.base,
                                   coverage=verify.plan(s.model, gpu=b.gpu, ctx=args.ctx or None,
                                                        support=serving.ServingSupport.of(b)),
                                   fa=bool(fa), quiet=args.json)[0] for fa in fas}
    passing = [fa for fa, v in gates.items() if v == "passed"]
    verdict = "passed" if passing else "failed"
    cand = tune.Candidate(b, verdict)
    base = {**s.base, "prefix": str(b.prefix), "backend": b.backend, "stamp": b.stamp,
            "build": b.provenance(), "gate": verdict}
    for fa, v in gates.items():
        if v != "passed":
            s.store.add_row(run_id, "bench", {**base, "gate": "failed", "fa": fa, "test": "gate",
                                              "status": "gate-failed"}, status="gate-failed")
            say(f"{b.label()} failed the verify gate with flash attention {'on' if fa else 'off'}: "
                "those variants never win")
    if not passing:
        return cand, None
    depths, note = bench.depths_for(b, spec.depths)
    if note:
        cand.note = note
    dims, env_names = tune.dimensions(b.backend, args.ubatch or None,
                                      passing,
                                      args.env_values, n_ctx, _kv_searched(b, args.kv, say))

    race = None if args.exhaustive else tune.Race.from_rules()
    cand.race = race

    def measure(v, b=b, base=base, depths=depths, race=race, settling=False):
        """The search's runs are screenings raced against the fastest; settling's repeats are
        screenings under the user's --timeout alone (--exhaustive: the full --reps throughout)."""
        run_spec = tune.run_spec(spec, race, settling=settling)
        progress.status(f"{b.label()} {v.label()}")
        rows, clock = [], []
        bench.run_variant(b, run_spec, v, base, depths,
                          lambda r: (s.store.add_row(run_id, "bench", r, status=r["status"]),
                                     rows.append(r), progress.advance(r)), clock=clock)
        if race is not None and not settling and clock:
            race.record(clock[-1], rows, run_spec)
        return rows

    if bench.wants_warmup(spec, b):  # the driver's pipeline compiles (see bench.Spec.warmup)
        progress.status(f"warming up {b.label()} (one discarded run)")
        bench.warm_up(b, spec, tune.to_variant(tuple(d[0] for d in dims), env_names))
    best = tune.search(cand, dims, env_names, {k: d if d in depths else 0 for k, d in ranges.items()},
                       measure, full=args.exhaustive)
    full = math.prod(len(d) for d in dims)
    cand.remeasure = lambda v, measure=measure: measure(v, settling=True)
    return cand, (cand, best, full)


def _kv_searched(b, asked: list[str] | None, say) -> list[str]:
    """The KV cache types searched for build `b`: those asked for, else tune.KV_SEARCHED, where its
    llama-bench has -ctk/-ctv (its own --help says); f16 alone where it has not."""
    if {"-ctk", "--cache-type-k"} & b.options("llama-bench") and {"-ctv", "--cache-type-v"} & b.options("llama-bench"):
        return list(asked or tune.KV_SEARCHED)
    if asked and asked != ["f16"]:
        say(f"{b.label()}: its llama-bench has no -ctk/-ctv: the KV cache stays f16")
    return ["f16"]


def _print_summary(summary: dict, ranges: list[str], model_path, reps: int) -> None:
    """The summary for people: each candidate's gate and search, then each range's winner and the
    variants refused at the range's shape (whether or not a winner was stored)."""
    from rocforge_build import shellsafe
    from rocforge_build.proc import quote

    for c in summary["candidates"]:
        how = (f"; {c['screen_reps']} repetition(s) a run, the leaders run again to tell them apart; "
               f"{c['stopped_by_race']} stopped by the race" if c["screen_reps"] else f"; {reps} repetitions a run")
        print(f"{c['prefix']} ({c['backend']}): gate {c['gate']}, {c['measured']} variants measured "
              f"(full cross product: {c['cross_product']}{how})")
    preset = summary["preset"]
    for name in ranges:
        r = (preset or {}).get("ranges", {}).get(name)
        refused = [rej for rej in summary["rejected"] if rej["range"] == name]
        if r:
            print(f"{name}: {r['backend']} {r['prefix']} {r['variant_label']} (score {r['score']:.1f})")
            if r.get("settled"):
                print(f"  {r['settled']}")
        elif refused:
            print(f"{name}: nothing stored: every ranked variant failed verify at the range's shape")
        else:
            print(f"{name}: nothing stored: no variant finished its runs")
        for rej in refused:
            print(f"  not stored: {rej['variant_label']} ({rej['prefix']}): {rej['reason']}")
    if preset:
        shellsafe.write_script(f"preset stored as version {preset['version']}: "  # a command to copy
                               f"rocforge preset show {quote([str(model_path)])}\n")


@dataclass(frozen=True)
class _Told:
    """tune_choice's steps in words, on stderr (nothing with --json)."""
    say: Callable[[str], None]

    def repeating(self, cand, v) -> None:
        self.say(f"repeating {cand.build.label()} {v.label()} to tell the leaders apart")

    def verifying(self, range_name, cand, v, shape) -> None:
        self.say(f"verifying {cand.build.label()} {v.label()} at the {range_name} range's own shape "
                 f"({shape.label()})")

    def refused(self, cand, v, shape) -> None:
        self.say(f"{cand.build.label()} {v.label()} is wrong at {shape.label()}: not stored")

    def nothing_verified(self, range_name) -> None:
        self.say(f"{range_name}: every measured variant failed verify at the range's shape: nothing stored")
