"""`rocforge bisect RECIPE --target GFX (--good REF --bad REF [--source PATH|URL] |
--versions V1,V2,... [--source TEMPLATE] | --nightlies V1,V2,... [--source PATH|URL])
[--backend B] (--run CMD | --verify GGUF [--reference PREFIX] | --bench GGUF --metric
pp512|tg128 [--threshold PCT]) [--json] [--report FILE.md]`: the first bad commit, version or
nightly, each step a cached build."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rocforge_build import argtypes
from rocforge_build.errors import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe name or .toml file")
    parser.add_argument("--target", metavar="GFX", help="GPU target, e.g. gfx1151 (default: the detected GPU)")
    parser.add_argument("--good", metavar="REF", help="a ref that works (with "
                        "--versions/--nightlies: a version in the list; default the first)")
    parser.add_argument("--bad", metavar="REF", help="a later ref that does not (with "
                        "--versions/--nightlies: a version in the list; default the last)")
    axis = parser.add_mutually_exclusive_group()
    axis.add_argument("--versions", metavar="VERSION,...", help="bisect released versions of a "
                      "tarball or sdist source, oldest first (see --source)")
    axis.add_argument("--nightlies", metavar="VERSION,...", help="bisect TheRock nightlies, oldest "
                      "first: a fixed source built against each one's ROCm (installed beside "
                      "the others, `current` unchanged)")
    parser.add_argument("--source", metavar="PATH|URL", help="git: the repository (default: the "
                        "recipe's); --versions: a tarball URL or path holding {version} (default: "
                        "the recipe's tarball URL with its version replaced); --nightlies: the "
                        "fixed source (default: the recipe's)")
    parser.add_argument("--backend", metavar="B", help="backend (default: the recipe's choice)")
    test = parser.add_mutually_exclusive_group(required=True)
    test.add_argument("--run", metavar="CMD", help="test each step with CMD (split into words, no "
                      "shell; ROCFORGE_PREFIX is the step's build): 0 good, 125 skip, else bad")
    test.add_argument("--verify", metavar="GGUF", help="test each step with `rocforge verify`")
    test.add_argument("--bench", metavar="GGUF", help="test each step with `rocforge bench` "
                      "against the good ref's figure (--metric, --threshold)")
    parser.add_argument("--reference", metavar="PREFIX",
                        help="with --verify: the build every step is compared with (default: the "
                        "good ref's build, built first)")
    parser.add_argument("--metric", choices=("pp512", "tg128"), help="with --bench: the figure")
    parser.add_argument("--threshold", type=argtypes.percent, metavar="PCT",
                        help="with --bench: slower than the good ref by more than PCT percent "
                        "is bad (default 5)")
    parser.add_argument("--jobs", "-j", type=argtypes.jobs, metavar="N", help="parallel build jobs (default: the plan's choice)")
    parser.add_argument("--json", action="store_true", help="first_bad, builds and steps as JSON")
    parser.add_argument("--report", metavar="FILE.md",
                        help="write a pre-filled upstream issue (never over a file rocforge did "
                        "not write)")


def run(args) -> int:
    from rocforge_build.commands import target_or_detected
    from rocforge_build.forge import recipes
    from rocforge_build.forge.plan import Request
    from rocforge_build.workflows import bisect, bisect_report, upgrade

    axis, good, listed = _checked(args)
    args.target = target_or_detected(args)
    pct = upgrade.threshold(args.threshold)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    model = _model(args.verify or args.bench, "--verify" if args.verify else "--bench")
    recipe = recipes.load(args.recipe)
    asked = _asked(args, axis)
    ax = bisect.axis_candidates(asked, recipe, good, listed)
    environ = {}  # per candidate: the build's environment (the nightly axis's ROCM_PATH)
    root_arg = None if args.rootfs.is_host else args.root
    say = (lambda text: None) if args.json else (
        lambda text: sys.stderr.write(f"rocforge: bisect: {text}\n"))
    reference = "" if args.run or args.reference else (
        ", and the good ref's build first (the reference)" if args.verify
        else ", and the good ref's build first (the baseline)")
    say(f"{len(ax.commits)} {ax.what}; at most {bisect.max_builds(len(ax.commits))} builds "
        f"without skips{reference}")

    # what the test runs, and no more (a whole llama.cpp tree is every example and tool)
    programs = ("llama-perplexity",) if args.verify else ("llama-bench",) if args.bench else ()

    def request(key: str) -> Request:
        prefix = bisect.step_prefix(recipe.name, args.target, args.backend, ax.names[key])
        if axis == "nightlies":
            environ[key] = {**os.environ, "ROCM_PATH": str(ax.nightlies.tree(key))}
        source, ref = ax.source_of[key]
        return Request(recipe=args.recipe, target=args.target, backend=args.backend, ref=ref,
                       source=source, prefix=str(prefix), jobs=args.jobs,
                       environ=environ.get(key), build_targets=programs, made_for="bisect")

    def build(key: str) -> tuple[bool, str | None]:
        req = request(key)
        built, failed = bisect.build_step(req, args.rootfs)
        if not failed and axis == "nightlies":
            bisect.check_uses_rocm(Path(req.prefix), environ[key]["ROCM_PATH"])
        return built, failed

    check = bisect.oracle(asked.test, argv, ax.good, args.good, model, pct, root_arg, build,
                          lambda key: Path(request(key).prefix), lambda key: request(key).environ)

    def test(key: str) -> bisect.Step:
        built, failed = build(key)
        req = request(key)
        prefix = req.prefix
        step = (bisect.Step(key, "skip", f"build failed: {failed}") if failed
                else check(Path(prefix), req.environ))  # the step runs as it was built
        step.ref, step.built, step.prefix = key, built or bool(failed), prefix
        say(f"{bisect.short(key)} {step.verdict}: {step.detail}  ({ax.subjects.get(key, '')})")
        return step

    steps, index, suspects = bisect.search(ax.commits, test)
    result = bisect.Result(ax.commits, ax.subjects, steps,
                           ax.commits[index] if index is not None else None, suspects)
    doc = bisect_report.to_json(asked, ax.location, ax.good, result)
    if args.report:
        bisect_report.write_report(Path(args.report), asked, ax.location, ax.good, result, args.rootfs)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(axis, result)
    return 0 if result.first_bad else 1


def _checked(args) -> tuple[str, str | None, list[str] | None]:
    """Every flag checked before anything is fetched or built: (axis, the good version and the
    candidates after it for --versions/--nightlies, else None)."""
    from rocforge_build.workflows import bisect

    axis = "versions" if args.versions is not None else (
        "nightlies" if args.nightlies is not None else "git")
    good = candidates = None
    if axis == "git":
        from rocforge_build.refs import check_git_ref

        if args.good is None or args.bad is None:
            raise UsageError("bisect needs --good REF and --bad REF (or --versions / --nightlies "
                             "with a list of versions)")
        check_git_ref(args.good, "--good")
        check_git_ref(args.bad, "--bad")
    else:
        option = f"--{axis}"
        listed = bisect.version_list(getattr(args, axis), option)
        good, candidates = bisect.version_span(listed, args.good, args.bad, option)
    if args.reference is not None:
        if not args.verify:
            raise UsageError("--reference goes with --verify")
        from rocforge_build.measure.llama_tools import LlamaBuild

        LlamaBuild.open(args.reference).program("llama-perplexity")  # one line when it is not one
    if args.bench and not args.metric:
        raise UsageError("--bench needs --metric pp512 or tg128")
    if (args.metric or args.threshold is not None) and not args.bench:
        raise UsageError("--metric and --threshold go with --bench")
    if args.report:
        from rocforge_build import replace
        from rocforge_build.workflows.bisect_report import ours

        replace.check_own_file(Path(args.report), "--report", ours)
        if not Path(args.report).absolute().parent.is_dir():
            raise UsageError(f"--report {args.report}: its directory does not exist",
                             "give a file in an existing directory")
    return axis, good, candidates


def _asked(args, axis: str):
    """The bisect as the command line gave it, for the forge's candidates, oracle and report."""
    from rocforge_build.workflows.bisect import Asked, StepTest

    test = StepTest(run=args.run, verify=args.verify, reference=args.reference, bench=args.bench,
                    metric=args.metric, threshold=args.threshold)
    return Asked(recipe=args.recipe, target=args.target, backend=args.backend, axis=axis,
                 source=args.source, good=args.good, bad=args.bad,
                 listed=getattr(args, axis) if axis != "git" else None, test=test)


def _model(model: str | None, option: str) -> str | None:
    if model is None:
        return None
    from rocforge_build.measure import gguf

    try:  # a file that is not a whole GGUF model is refused before anything is built
        gguf.check(model)
    except gguf.ModelError as exc:
        raise UsageError(f"{option} {exc.message}", exc.hint) from None
    return os.path.realpath(model)


def _print(axis: str, r) -> None:
    from rocforge_build.workflows.bisect import short
    from rocforge_build.workflows.bisect_report import WORDS

    for s in r.steps:
        print(f"  {short(s.ref)}  {s.verdict:5}  {s.detail}  {r.subjects.get(s.ref, '')}")
    if r.first_bad:
        print(f"first bad {WORDS[axis][0]}: {r.first_bad} {r.subjects.get(r.first_bad, '')}")
    else:
        print("skipped steps leave several suspects: " + ", ".join(short(c) for c in r.suspects))
    print(f"{r.builds} builds for {len(r.candidates)} candidates")
