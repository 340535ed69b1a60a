"""`rocforge build RECIPE --target GFX [...]`: plan, fetch, patch, configure, build, install,
smoke-test and record a recipe; `--dry-run [--json]` prints the plan only."""

from __future__ import annotations

import json
import sys

from rocforge_build import argtypes, substitute
from rocforge_build.commands import target_or_detected
from rocforge_build.errors import UsageError
from rocforge_build.forge import pipeline, recipes
from rocforge_build.forge.backend_choice import check_requested
from rocforge_build.forge.context import needs_gpu_target
from rocforge_build.forge.plan import Request
from rocforge_build.forge.plan_text import print_plan
from rocforge_build.refs import check_git_ref
from rocforge_build.shellsafe import one_line


def add_arguments(parser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe name (see `rocforge recipe list`) or a .toml file")
    parser.add_argument("--target", metavar="GFX",
                        help="GPU target, e.g. gfx1151 (default: the detected GPU; a cpu or "
                        "vulkan build needs none)")
    parser.add_argument("--rocm", metavar="PATH",
                        help="the ROCm installation to build with (default: the resolved one, "
                        "as `rocforge env` resolves it)")
    parser.add_argument("--backend", metavar="B", help="backend (default: the recipe's choice for the target)")
    parser.add_argument("--ref", metavar="REF", help="build this git tag/branch/commit of the recipe's git source")
    parser.add_argument("--source", metavar="PATH|URL",
                        help="a local tree, tarball file, tarball URL or git URL (offline mirror)")
    parser.add_argument("--prefix", metavar="PREFIX", help="install prefix (default: data dir "
                        "builds/RECIPE-TARGET-BACKEND; builds/RECIPE-BACKEND for cpu and vulkan)")
    parser.add_argument("--jobs", "-j", type=argtypes.jobs, metavar="N",
                        help="parallel build jobs (default: min(cores, available memory / the "
                             "recipe's per-job memory); the plan says why)")
    parser.add_argument("--cmake-target", "--build-target", action="append", default=[],
                        type=argtypes.cmake_target, metavar="NAME", dest="cmake_targets",
                        help="build and install only this CMake target (repeatable; also "
                        "spelled --build-target)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan; build and download nothing, and exit as the build "
                        "would.  A local or cached source is read; of a remote one not in the "
                        "cache, what depends on its contents is shown as decided after the fetch")
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    parser.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    parser.add_argument("--no-cache", action="store_true", help="do not use ccache/sccache")
    parser.add_argument("--no-recheck", action="store_true",
                        help="after a rebuild, do not re-measure and compare with the prefix's earlier results")
    subs = parser.add_mutually_exclusive_group()
    subs.add_argument("--no-substitutes", action="store_true",
                      help="compile it here: ask no substitute store (substitute.stores)")
    subs.add_argument("--substitute-only", action="store_true",
                      help="pull a verified build from substitute.stores or fail with one line; "
                      "never compile (CI pipelines, air-gapped machines)")
    parser.add_argument("--distribute", action="store_true",
                        help="spread compiles over build.distcc_hosts (or build.icecc_scheduler; "
                        "with sccache as the launcher: sccache-dist as sccache's own config sets it up)")


def _target(args) -> str:
    """--target, else the detected GPU; "" (no GPU target) for a `--backend` that needs none
    (cpu, vulkan) on a machine where no GPU is detected; an unknown `--backend` is named first."""
    if args.backend:
        check_requested(recipes.load(args.recipe), args.backend)
    if args.target or needs_gpu_target(args.recipe, args.backend):
        return target_or_detected(args, args.rocm)
    try:
        return target_or_detected(args, args.rocm)
    except UsageError:
        return ""


def run(args) -> int:
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run", "rocforge build ... --dry-run --json")
    targets = tuple(dict.fromkeys(args.cmake_targets))  # a repeat builds nothing more
    if len(targets) > argtypes.CMAKE_TARGETS_MAX:
        raise UsageError(f"--cmake-target: {len(targets)} targets, at most "
                         f"{argtypes.CMAKE_TARGETS_MAX}", "build the recipe's default targets instead")
    if args.ref is not None:  # before anything is fetched or written (sources.source_for again)
        check_git_ref(args.ref)
    req = Request(
        recipe=args.recipe, target=_target(args), backend=args.backend,
        ref=args.ref, rocm=args.rocm,
        source=args.source, prefix=args.prefix, jobs=args.jobs, force=args.force,
        no_cache=args.no_cache, distribute=args.distribute, build_targets=targets,
        substitutes="off" if args.no_substitutes else "only" if args.substitute_only else "auto",
    )
    if args.dry_run:
        plan = pipeline.dry_run(req, args.rootfs)
        if args.json:
            print(json.dumps(plan.to_json(), indent=2, default=str))
        else:
            print_plan(plan)
        sys.stdout.flush()
        pipeline.check(plan)  # the build's own checks: a dry run exits as the build would
        return 0
    outcome = pipeline.build(req, args.rootfs, substitute=substitute.from_stores)
    if outcome.status == "up to date":
        sys.stderr.write(f"rocforge: {outcome.prefix} is up to date ({outcome.seconds:.2f}s; "
                         "--force rebuilds)\n")
    if outcome.status == "substituted":
        for line in outcome.notes:  # the stores that had no usable build before the one that did
            sys.stderr.write(f"rocforge: substitute: passed over {one_line(line)}\n")
    print(outcome.prefix)
    if outcome.status == "built" and not args.no_recheck:
        from rocforge_build.measure.recheck import after_build

        after_build(outcome.prefix, argv=args.argv)
    return 0
