"""`rocforge bisect RECIPE --target GFX (--good REF --bad REF [--source PATH|URL] |
--versions V1,V2,... [--source TEMPLATE] | --nightlies V1,V2,... [--source PATH|URL])
[--backend B] (--run CMD | --verify GGUF [--reference PREFIX] | --bench GGUF --metric
pp512|tg128 [--threshold PCT]) [--json] [--report FILE.md]`: the first bad commit, version or
nightly, each step a cached build."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import argtypes
from rocforge_build.errors import UsageError

REPORT_MARK = "<!-- written by rocforge bisect"


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
    from rocforge_build.forge import bisect, recipes, upgrade
    from rocforge_build.forge.plan import Request

    axis, good, listed = _checked(args)
    args.target = target_or_detected(args)
    pct = upgrade.threshold(args.threshold)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    model = _model(args.verify or args.bench)
    recipe = recipes.load(args.recipe)
    ax = _candidates(args, axis, recipe, good, listed)
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
                       environ=environ.get(key), build_targets=programs)

    def build(key: str) -> tuple[bool, str | None]:
        req = request(key)
        built, failed = bisect.build_step(req, args.rootfs)
        if not failed and axis == "nightlies":
            _check_uses_rocm(Path(req.prefix), environ[key]["ROCM_PATH"])
        return built, failed

    check = _oracle(args, ax.good, argv, model, pct, root_arg, build,
                    lambda key: Path(request(key).prefix))

    def test(key: str) -> bisect.Step:
        built, failed = build(key)
        prefix = request(key).prefix
        step = (bisect.Step(key, "skip", f"build failed: {failed}") if failed
                else check(Path(prefix)))
        step.ref, step.built, step.prefix = key, built or bool(failed), prefix
        say(f"{bisect.short(key)} {step.verdict}: {step.detail}  ({ax.subjects.get(key, '')})")
        return step

    steps, index, suspects = bisect.search(ax.commits, test)
    result = bisect.Result(ax.commits, ax.subjects, steps,
                           ax.commits[index] if index is not None else None, suspects)
    doc = _json(args, axis, ax.location, ax.good, result)
    if args.report:
        _write_report(args, axis, ax.location, ax.good, result, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(axis, result)
    return 0 if result.first_bad else 1


def _checked(args) -> tuple[str, str | None, list[str] | None]:
    """Every flag checked before anything is fetched or built: (axis, the good version and the
    candidates after it for --versions/--nightlies, else None)."""
    from rocforge_build.forge import bisect

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

        replace.check_own_file(Path(args.report), "--report", _ours)
        if not Path(args.report).absolute().parent.is_dir():
            raise UsageError(f"--report {args.report}: its directory does not exist",
                             "give a file in an existing directory")
    return axis, good, candidates


@dataclass
class _Axis:
    """The candidates of one bisect: what each is called, where its source comes from."""
    location: str
    good: str
    commits: list[str]
    subjects: dict[str, str]
    names: dict[str, str]  # candidate -> its step prefix's name
    source_of: dict[str, tuple]  # candidate -> (--source, --ref) of its build
    what: str
    nightlies: object = None


def _candidates(args, axis: str, recipe, good: str | None, listed: list[str] | None) -> _Axis:
    from rocforge_build.forge import bisect

    if axis == "git":
        location = bisect.git_location(recipe, args.source, args.good)
        commits, subjects = bisect.candidates(location, args.good, args.bad)
        good = sources_sha(location, args.good)
        return _Axis(location, good, commits, subjects, {c: c[:12] for c in [good, *commits]},
                     {c: (args.source, c) for c in [good, *commits]},
                     f"first-parent commits after {args.good} up to {args.bad}")
    if axis == "versions":
        location = bisect.version_template(recipe, args.source)
        bisect.check_version_files(location, [good, *listed])
        source_of = {v: (bisect.version_source(location, v), None) for v in [good, *listed]}
        for where, _ in source_of.values():  # each one a tarball rocforge can fetch, checked now
            _tarball_spec(recipe, where)
        return _Axis(location, good, listed, {v: source_of[v][0] for v in listed},
                     {v: f"v-{v}" for v in [good, *listed]}, source_of,
                     f"versions after {good} up to {listed[-1]}")
    _rocm_backend(recipe, args.backend)
    source, ref = _fixed_source(recipe, args.source)
    location = source or recipe.name
    nightlies = _nightlies(args, [good, *listed])
    return _Axis(location, good, listed, {v: nightlies.describe(v) for v in listed},
                 {v: f"nightly-{v}" for v in [good, *listed]}, {v: (source, ref) for v in [good, *listed]},
                 f"TheRock nightlies after {good} up to {listed[-1]}, source {location}", nightlies)


def _oracle(args, good: str, argv, model, pct: float, root_arg, build, prefix_of):
    """The test each step's build gets: --run's program; --verify against --reference or the good
    ref's build; --bench against the good ref's figure."""
    from rocforge_build.forge import bisect

    if argv:
        return bisect.run_test(argv)
    if args.verify and args.reference:
        return bisect.verify_test(model, Path(args.reference).absolute(), root_arg)
    built, failed = build(good)  # the good ref's build is the reference or the baseline
    if failed:
        raise UsageError(f"--good {args.good or good} does not build: {failed}")
    if args.verify:
        return bisect.verify_test(model, prefix_of(good), root_arg)
    baseline = bisect.bench_figure(prefix_of(good), model, args.metric, root_arg)
    if not baseline:
        raise UsageError(f"--good {args.good or good} gave no {args.metric} figure",
                         "check the model with `rocforge bench` on that build")
    return bisect.bench_test(model, args.metric, baseline, pct, root_arg)


def _tarball_spec(recipe, where: str) -> None:
    from rocforge_build.forge import sources

    spec = sources.spec_for(recipe, source=where)
    if spec.kind != "tarball":
        raise UsageError(f"--versions: {where} is a {spec.kind} source, not a tarball",
                         "give --source a tarball URL or file holding {version}")


def _fixed_source(recipe, source: str | None) -> tuple[str | None, str | None]:
    """The nightly axis's one source: a git source pinned to one commit now (every step builds
    the same tree), anything else as given."""
    from rocforge_build.forge import sources

    spec = sources.spec_for(recipe, source=source)
    if spec.kind == "git":
        return source, sources_sha(spec.location, spec.ref or "HEAD")
    return source, None


def _nightlies(args, versions: list[str]):
    """Each version's tree: installed, or found in the configured sources (checked now)."""
    from rocforge_build import config
    from rocforge_build.discover import targets
    from rocforge_build.nightly import axis

    target = targets.get_target(args.target).name
    cfg = config.effective()
    return axis.plan(versions, target, cfg, config.nightly_prefix(cfg))


def _rocm_backend(recipe, backend: str | None) -> None:
    """--nightlies with a --backend that does not build with ROCm: refused before anything."""
    be = recipe.backends.get(backend) if backend is not None else None
    if be is not None and be.toolchain != "hip":
        raise UsageError(f"--nightlies: backend {backend} builds with the {be.toolchain} "
                         "toolchain, not a ROCm one", "give --backend a backend whose toolchain "
                         "is hip")


def _check_uses_rocm(prefix: Path, rocm: str) -> None:
    """A nightly step's build must have been made with that nightly's ROCm: a backend of the
    host toolchain would make every step the same build."""
    from rocforge_build.discover.builds import read_manifest

    tc = (read_manifest(prefix) or {}).get("toolchain")
    used = tc.get("rocm_path") if isinstance(tc, dict) else None
    if not isinstance(used, str) or os.path.realpath(used) != os.path.realpath(rocm):
        kind = tc.get("kind") if isinstance(tc, dict) else None
        raise UsageError(f"--nightlies: the build at {prefix} does not use the nightly's ROCm "
                         f"(its toolchain is {kind or 'unknown'}), so every step would be the "
                         "same build", "give --backend a backend whose toolchain is hip")


def sources_sha(location: str, ref: str) -> str:
    from rocforge_build.forge import sources

    return sources._git_resolve(location, ref)


def _model(model: str | None) -> str | None:
    if model is None:
        return None
    if not Path(model).is_file():
        raise UsageError(f"{model}: no such model file", "give a GGUF model file")
    return str(Path(model).resolve())


def _ours(head: bytes) -> bool:
    return head.startswith(REPORT_MARK.encode())


WORDS = {"git": ("commit", "first-parent commits"), "versions": ("version", "versions"),
         "nightlies": ("nightly", "TheRock nightlies")}


def _json(args, axis: str, location: str, good: str, r) -> dict:
    return {"recipe": args.recipe, "target": args.target, "backend": args.backend, "axis": axis,
            "source": location, "good": args.good if axis == "git" else good,
            "bad": args.bad if axis == "git" else r.candidates[-1],
            "candidates": len(r.candidates), "first_bad": r.first_bad,
            "first_bad_subject": r.subjects.get(r.first_bad) if r.first_bad else None,
            "suspects": r.suspects, "builds": r.builds, "steps": [s.to_json() for s in r.steps],
            "test": _test_words(args)}


def _axis_words(args, axis: str, good: str, r) -> str:
    """The command line's candidate part, as given (the report's reproduction)."""
    if axis == "git":
        return (f"--good {shlex.quote(args.good)} --bad {shlex.quote(args.bad)}"
                + (f" --source {shlex.quote(args.source)}" if args.source else ""))
    listed = getattr(args, axis)
    return (f"--{axis} {shlex.quote(listed)} --good {shlex.quote(good)} --bad "
            f"{shlex.quote(r.candidates[-1])}"
            + (f" --source {shlex.quote(args.source)}" if args.source else ""))


def _test_words(args) -> str:
    if args.run:
        return f"--run {shlex.quote(args.run)}"
    if args.verify:
        return f"--verify {shlex.quote(args.verify)}" + (
            f" --reference {shlex.quote(args.reference)}" if args.reference else "")
    return (f"--bench {shlex.quote(args.bench)} --metric {args.metric}"
            + (f" --threshold {args.threshold:g}" if args.threshold is not None else ""))


def _print(axis: str, r) -> None:
    from rocforge_build.forge.bisect import short

    for s in r.steps:
        print(f"  {short(s.ref)}  {s.verdict:5}  {s.detail}  {r.subjects.get(s.ref, '')}")
    if r.first_bad:
        print(f"first bad {WORDS[axis][0]}: {r.first_bad} {r.subjects.get(r.first_bad, '')}")
    else:
        print("skipped steps leave several suspects: " + ", ".join(short(c) for c in r.suspects))
    print(f"{r.builds} builds for {len(r.candidates)} candidates")


def _write_report(args, axis: str, location: str, good: str, r, doc: dict) -> None:
    """A pre-filled upstream issue: what regressed, where, on what, and how to reproduce it."""
    from rocforge_build import replace
    from rocforge_build.forge.bisect import short
    from rocforge_build.measure import provenance

    try:
        host = provenance.host(args.rootfs)
    except Exception as exc:  # the report is still useful without it; say what happened
        from rocforge_build.errors import reason

        host = {"error": f"host details unreadable: {reason(exc)}"}
    manifest = _step_manifest(r)
    toolchain = manifest.get("toolchain", {}) if isinstance(manifest.get("toolchain"), dict) else {}
    word, plural = WORDS[axis]
    bad = args.bad if axis == "git" else r.candidates[-1]
    shown_good = args.good if axis == "git" else good
    title = (f"Regression in {short(r.first_bad)}: {r.subjects.get(r.first_bad, '')}"
             if r.first_bad else f"Regression between {shown_good} and {bad}")
    where = {"git": "Repository", "versions": "Tarballs", "nightlies": "Source"}[axis]
    lines = [f"{REPORT_MARK}; edit freely, rocforge may overwrite this file -->", "",
             f"# {title}", "",
             f"First bad {word}: `{r.first_bad or 'one of ' + ', '.join(r.suspects)}`  ",
             f"Good: `{shown_good}`, bad: `{bad}` ({len(r.candidates)} {plural}, "
             f"{r.builds} builds)  ", f"{where}: {location}", "",
             "## Hardware and host", "", f"- target: {args.target}",
             f"- platform: {platform.platform()}"]
    lines += [f"- {k}: {json.dumps(v, default=str)}" for k, v in sorted(host.items())]
    lines += ["", "## ROCm and toolchain", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(toolchain.items()) if not isinstance(v, dict)]
    lines += [f"- backend: {manifest.get('backend', args.backend or 'default')}", "",
              "## How it was found", "", "```sh",
              f"rocforge bisect {shlex.quote(args.recipe)} --target {args.target} "
              f"{_axis_words(args, axis, good, r)}"
              + (f" --backend {args.backend}" if args.backend else "") + f" {_test_words(args)}",
              "```", "", f"| {word} | verdict | detail | {'subject' if axis == 'git' else 'what'} |",
              "|---|---|---|---|"]
    lines += [f"| `{short(s.ref)}` | {s.verdict} | {s.detail.replace('|', '/')} | "
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
