"""`rocforge tune RECIPE --target GFX --model GGUF`: pull, build or reuse each candidate build, gate it
with verify, search flash attention / ubatch / env one dimension at a time, pick a winner per
context range and store it as the model's preset (`rocforge preset show MODEL`).  The flags are
checked, in order, before anything is built and become one `workflows.tune.Asked`; the session
is workflows/tune.py; this prints its `Outcome`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rocforge_build import argtypes
from rocforge_build.errors import UsageError
from rocforge_build.measure import bench, serving
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.workflows import tune as tune_session


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


def _target(args) -> str:
    """--target, else the detected GPU; "" when no requested backend's toolchain compiles for a
    GPU target (cpu, vulkan) and none is detected: only hip candidates need one."""
    from rocforge_build.commands import target_or_detected
    from rocforge_build.forge import recipes

    recipe = recipes.load(args.recipe)
    asked = _backends(args)
    names = list(recipe.backends) if asked is None else asked
    if args.target or any(recipe.backends[n].toolchain == "hip" for n in names if n in recipe.backends):
        return target_or_detected(args)
    try:
        return target_or_detected(args)
    except UsageError:
        return ""


def run(args) -> int:
    # every value is checked before the target is detected, a source downloaded or a build made
    ranges = tune_session.wanted_ranges(args.contexts, args.n_prompt, args.n_gen)
    fa = tuple(bench.fa_list(args.fa)) if args.fa else ()
    env = bench.env_pairs(args.env) if args.env else None
    given = tuple(LlamaBuild.open(p) for p in args.build)
    for b in given:
        b.program("llama-bench")
    from rocforge_build.measure import gguf

    gguf.check(args.model)  # a bad model is reported before anything is built
    asked = tune_session.Asked(
        model=args.model,
        candidates=tune_session.Candidates(
            recipe=args.recipe, target=_target(args), rootfs=args.rootfs, backends=_backends(args),
            source=args.source, ref=args.ref, jobs=args.jobs,
            substitutes="off" if args.no_substitutes else "auto", given=given),
        search=tune_session.Search(
            ranges=ranges, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.reps,
            threads=args.threads, timeout=args.timeout, gate_ctx=tuple(args.ctx or ()),
            ubatch=tuple(args.ubatch or ()), fa=fa, env=env, kv=tuple(args.kv or ()),
            exhaustive=args.exhaustive),
        argv=tuple(args.argv), quiet=args.json)
    say = (lambda text: None) if args.json else (lambda text: sys.stderr.write(f"rocforge: tune: {text}\n"))
    out = tune_session.run(asked, say, _Told(say))
    if args.json:
        print(json.dumps(out.to_json(), indent=2, default=str))
    else:
        _print_summary(out, args.reps)
    if not out.preset:
        raise out.nothing_stored()
    return 0


def _backends(args) -> tuple[str, ...] | None:
    """--backends as names; None when not given (every backend of the recipe)."""
    return tuple(b for b in args.backends.split(",") if b) if args.backends else None


def _print_summary(out: tune_session.Outcome, reps: int) -> None:
    """The summary for people: each candidate's gate and search, then each range's winner and the
    variants refused at the range's shape (whether or not a winner was stored)."""
    from rocforge_build import shellsafe
    from rocforge_build.proc import quote

    for c in out.candidates:
        how = (f"; {c['screen_reps']} repetition(s) a run, the leaders run again to tell them apart; "
               f"{c['stopped_by_race']} stopped by the race" if c["screen_reps"] else f"; {reps} repetitions a run")
        print(f"{c['prefix']} ({c['backend']}): gate {c['gate']}, {c['measured']} variants measured "
              f"(full cross product: {c['cross_product']}{how})")
    preset = out.preset
    for name in out.ranges:
        r = (preset or {}).get("ranges", {}).get(name)
        refused = [rej for rej in out.rejected if rej["range"] == name]
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
                               f"rocforge preset show {quote([str(out.model_path)])}\n")


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
