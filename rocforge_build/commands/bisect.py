"""`rocforge bisect RECIPE --target GFX --good REF --bad REF [--source GIT] [--backend B]
(--run CMD | --verify GGUF | --bench GGUF --metric pp512|tg128 [--threshold PCT]) [--json]
[--report FILE.md]`: the first bad first-parent commit, each step a cached build."""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path

from rocforge_build import argtypes
from rocforge_build.errors import UsageError

REPORT_MARK = "<!-- written by rocforge bisect"


def add_arguments(parser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe name or .toml file")
    parser.add_argument("--target", required=True, metavar="GFX", help="GPU target, e.g. gfx1151")
    parser.add_argument("--good", required=True, metavar="REF", help="a ref that works")
    parser.add_argument("--bad", required=True, metavar="REF", help="a later ref that does not")
    parser.add_argument("--source", metavar="GIT", help="the git repository (default: the recipe's)")
    parser.add_argument("--backend", metavar="B", help="backend (default: the recipe's choice)")
    test = parser.add_mutually_exclusive_group(required=True)
    test.add_argument("--run", metavar="CMD", help="test each step with CMD (split into words, no "
                      "shell; ROCFORGE_PREFIX is the step's build): 0 good, 125 skip, else bad")
    test.add_argument("--verify", metavar="GGUF", help="test each step with `rocforge verify`")
    test.add_argument("--bench", metavar="GGUF", help="test each step with `rocforge bench` "
                      "against the good ref's figure (--metric, --threshold)")
    parser.add_argument("--metric", choices=("pp512", "tg128"), help="with --bench: the figure")
    parser.add_argument("--threshold", type=argtypes.non_negative_number, metavar="PCT",
                        help="with --bench: slower than the good ref by more than PCT percent "
                        "is bad (default 5)")
    parser.add_argument("--jobs", "-j", type=argtypes.positive_int, metavar="N", help="parallel build jobs (default: the plan's choice)")
    parser.add_argument("--json", action="store_true", help="first_bad, builds and steps as JSON")
    parser.add_argument("--report", metavar="FILE.md",
                        help="write a pre-filled upstream issue (never over a file rocforge did "
                        "not write)")


def run(args) -> int:
    from rocforge_build.build import bisect, recipes, upgrade
    from rocforge_build.build.plan import Request
    from rocforge_build.refs import check_git_ref

    check_git_ref(args.good, "--good")
    check_git_ref(args.bad, "--bad")
    if args.bench and not args.metric:
        raise UsageError("--bench needs --metric pp512 or tg128")
    if (args.metric or args.threshold is not None) and not args.bench:
        raise UsageError("--metric and --threshold go with --bench")
    pct = upgrade.threshold(args.threshold)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    model = _model(args.verify or args.bench)
    if args.report:
        from rocforge_build import replace

        replace.check_own_file(Path(args.report), "--report", _ours)
        if not Path(args.report).absolute().parent.is_dir():
            raise UsageError(f"--report {args.report}: its directory does not exist",
                             "give a file in an existing directory")
    recipe = recipes.load(args.recipe)
    location = bisect.git_location(recipe, args.source, args.good)
    commits, subjects = bisect.candidates(location, args.good, args.bad)
    root_arg = None if args.rootfs.is_host else args.root
    say = (lambda text: None) if args.json else (
        lambda text: sys.stderr.write(f"rocforge: bisect: {text}\n"))
    say(f"{len(commits)} first-parent commits after {args.good} up to {args.bad}; at most "
        f"{bisect.max_builds(len(commits))} builds without skips")
    source = args.source

    def request(sha: str) -> Request:
        prefix = bisect.step_prefix(recipe.name, args.target, args.backend, sha)
        return Request(recipe=args.recipe, target=args.target, backend=args.backend, ref=sha,
                       source=source, prefix=str(prefix), jobs=args.jobs)

    if argv:
        check = bisect.run_test(argv)
    elif args.verify:
        check = bisect.verify_test(model, root_arg)
    else:
        base = request(sources_sha(location, args.good))
        built, failed = bisect.build_step(base, args.rootfs)
        if failed:
            raise UsageError(f"--good {args.good} does not build: {failed}")
        baseline = bisect.bench_figure(Path(base.prefix), model, args.metric, root_arg)
        if not baseline:
            raise UsageError(f"--good {args.good} gave no {args.metric} figure",
                             "check the model with `rocforge bench` on that build")
        check = bisect.bench_test(model, args.metric, baseline, pct, root_arg)

    def test(sha: str) -> bisect.Step:
        req = request(sha)
        built, failed = bisect.build_step(req, args.rootfs)
        step = (bisect.Step(sha, "skip", f"build failed: {failed}") if failed
                else check(Path(req.prefix)))
        step.ref, step.built, step.prefix = sha, built or bool(failed), req.prefix
        say(f"{sha[:12]} {step.verdict}: {step.detail}  ({subjects.get(sha, '')})")
        return step

    steps, index, suspects = bisect.search(commits, test)
    result = bisect.Result(commits, subjects, steps, commits[index] if index is not None else None,
                           suspects)
    doc = _json(args, location, result)
    if args.report:
        _write_report(args, location, result, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(result)
    return 0 if result.first_bad else 1


def sources_sha(location: str, ref: str) -> str:
    from rocforge_build.build import sources

    return sources._git_resolve(location, ref)


def _model(model: str | None) -> str | None:
    if model is None:
        return None
    if not Path(model).is_file():
        raise UsageError(f"{model}: no such model file", "give a GGUF model file")
    return str(Path(model).resolve())


def _ours(head: bytes) -> bool:
    return head.startswith(REPORT_MARK.encode())


def _json(args, location: str, r) -> dict:
    return {"recipe": args.recipe, "target": args.target, "backend": args.backend,
            "source": location, "good": args.good, "bad": args.bad,
            "candidates": len(r.candidates), "first_bad": r.first_bad,
            "first_bad_subject": r.subjects.get(r.first_bad) if r.first_bad else None,
            "suspects": r.suspects, "builds": r.builds, "steps": [s.to_json() for s in r.steps],
            "test": _test_words(args)}


def _test_words(args) -> str:
    if args.run:
        return f"--run {shlex.quote(args.run)}"
    if args.verify:
        return f"--verify {shlex.quote(args.verify)}"
    return (f"--bench {shlex.quote(args.bench)} --metric {args.metric}"
            + (f" --threshold {args.threshold:g}" if args.threshold is not None else ""))


def _print(r) -> None:
    for s in r.steps:
        print(f"  {s.ref[:12]}  {s.verdict:5}  {s.detail}  {r.subjects.get(s.ref, '')}")
    if r.first_bad:
        print(f"first bad commit: {r.first_bad} {r.subjects.get(r.first_bad, '')}")
    else:
        print("skipped steps leave several suspects: " + ", ".join(c[:12] for c in r.suspects))
    print(f"{r.builds} builds for {len(r.candidates)} candidates")


def _write_report(args, location: str, r, doc: dict) -> None:
    """A pre-filled upstream issue: what regressed, where, on what, and how to reproduce it."""
    from rocforge_build import replace
    from rocforge_build.measure import provenance

    try:
        host = provenance.host(args.rootfs)
    except Exception as exc:  # the report is still useful without it; say what happened
        from rocforge_build.errors import reason

        host = {"error": f"host details unreadable: {reason(exc)}"}
    manifest = _step_manifest(r)
    toolchain = manifest.get("toolchain", {}) if isinstance(manifest.get("toolchain"), dict) else {}
    title = (f"Regression in {r.first_bad[:12]}: {r.subjects.get(r.first_bad, '')}" if r.first_bad
             else f"Regression between {args.good} and {args.bad}")
    lines = [f"{REPORT_MARK}; edit freely, rocforge may overwrite this file -->", "",
             f"# {title}", "",
             f"First bad commit: `{r.first_bad or 'one of ' + ', '.join(r.suspects)}`  ",
             f"Good: `{args.good}`, bad: `{args.bad}` ({len(r.candidates)} first-parent commits, "
             f"{r.builds} builds)  ", f"Repository: {location}", "",
             "## Hardware and host", "", f"- target: {args.target}",
             f"- platform: {platform.platform()}"]
    lines += [f"- {k}: {json.dumps(v, default=str)}" for k, v in sorted(host.items())]
    lines += ["", "## ROCm and toolchain", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(toolchain.items()) if not isinstance(v, dict)]
    lines += [f"- backend: {manifest.get('backend', args.backend or 'default')}", "",
              "## How it was found", "", "```sh",
              f"rocforge bisect {shlex.quote(args.recipe)} --target {args.target} "
              f"--good {shlex.quote(args.good)} --bad {shlex.quote(args.bad)}"
              + (f" --source {shlex.quote(args.source)}" if args.source else "")
              + (f" --backend {args.backend}" if args.backend else "") + f" {_test_words(args)}",
              "```", "", "| commit | verdict | detail | subject |", "|---|---|---|---|"]
    lines += [f"| `{s.ref[:12]}` | {s.verdict} | {s.detail.replace('|', '/')} | "
              f"{r.subjects.get(s.ref, '').replace('|', '/')} |" for s in r.steps]
    flags = manifest.get("flags", {}) if isinstance(manifest.get("flags"), dict) else {}
    if flags.get("configure"):
        lines += ["", "Configure line of the builds:", "", "```sh",
                  " ".join(shlex.quote(str(a)) for a in flags["configure"]), "```"]
    replace.write_own_file(Path(args.report), "\n".join(lines) + "\n", "--report", _ours)


def _step_manifest(r) -> dict:
    from rocforge_build.discover.builds import read_manifest

    for s in reversed(r.steps):
        m = read_manifest(Path(s.prefix)) if s.prefix else None
        if m:
            return m
    return {}
