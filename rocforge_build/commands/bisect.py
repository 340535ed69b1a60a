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
    from rocforge_build.workflows import bisect, bisect_report

    bisection = _bisection(args)
    say = (lambda text: None) if args.json else (
        lambda text: sys.stderr.write(f"rocforge: bisect: {text}\n"))
    found = bisect.find_first_bad(bisection, say)
    result = found.result
    doc = bisect_report.to_json(bisection.asked, found.axis.location, found.axis.good, result)
    if args.report:
        bisect_report.write_report(Path(args.report), bisection.asked, found.axis.location,
                                   found.axis.good, result, args.rootfs)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(bisection.asked.axis, result)
    return 0 if result.first_bad else 1


def _bisection(args):
    """The bisect as one checked value: every flag checked before anything is fetched or built."""
    from rocforge_build.commands import target_or_detected
    from rocforge_build.workflows import upgrade
    from rocforge_build.workflows.bisect import Bisection

    axis, good, listed = _checked(args)
    target = target_or_detected(args)
    pct = upgrade.threshold(args.threshold)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    model = _model(args.verify or args.bench, "--verify" if args.verify else "--bench")
    return Bisection(asked=_asked(args, axis, target), good=good,
                     listed=tuple(listed) if listed is not None else None, rootfs=args.rootfs,
                     root_arg=None if args.rootfs.is_host else args.root, jobs=args.jobs,
                     run_argv=tuple(argv) if argv is not None else None, model=model, pct=pct)


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


def _asked(args, axis: str, target: str):
    """The bisect as the command line gave it (the target detected when not given), for the
    candidates, the oracle and the report."""
    from rocforge_build.workflows.bisect import Asked, StepTest

    test = StepTest(run=args.run, verify=args.verify, reference=args.reference, bench=args.bench,
                    metric=args.metric, threshold=args.threshold)
    return Asked(recipe=args.recipe, target=target, backend=args.backend, axis=axis,
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
