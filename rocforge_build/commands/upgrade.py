"""`rocforge upgrade PREFIX [--ref REF | --source PATH|URL | --rocm PATH | --nightly VERSION]
[--model GGUF] [--run CMD] [--threshold PCT] [--json]`: rebuild a build with changed inputs, gate
the candidate (smoke test, --run, verify and bench against the current build) and swap it in only
when every gate passes; otherwise the build stays as it was and the command exits 1."""

from __future__ import annotations

import json
import os

from rocforge_build import argtypes
from rocforge_build.errors import UsageError
from rocforge_build.refs import check_git_ref


def add_arguments(parser) -> None:
    parser.add_argument("prefix", metavar="PREFIX", help="the build to upgrade (its install prefix)")
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--ref", metavar="REF", help="build this git tag, branch or commit")
    change.add_argument("--source", metavar="PATH|URL", help="build this tree, tarball or git URL")
    change.add_argument("--rocm", metavar="PATH", help="build against the ROCm at PATH")
    change.add_argument("--nightly", metavar="VERSION",
                        help="build against this installed TheRock nightly (`nightly installed`)")
    parser.add_argument("--run", metavar="CMD",
                        help="a gate: run CMD (split into words, no shell) with ROCFORGE_PREFIX set "
                        "to the candidate; exit 0 passes, 125 cannot test, anything else fails")
    parser.add_argument("--model", metavar="GGUF", help="gates: `rocforge verify` against the "
                        "current build and a side-by-side `rocforge bench`")
    parser.add_argument("--threshold", type=argtypes.percent, metavar="PCT",
                        help="with --model: a figure this many percent slower fails (default 5)")
    parser.add_argument("--jobs", "-j", type=argtypes.jobs, metavar="N",
                        help="parallel build jobs (default: the plan's choice)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")


def run(args) -> int:
    from rocforge_build import substitute
    from rocforge_build.workflows import upgrade

    pct = upgrade.threshold(args.threshold)  # every flag is checked before the prefix is read
    if args.ref is not None:
        check_git_ref(args.ref)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    prefix, manifest = upgrade.existing_build(args.prefix)
    model = _model(args.model)
    req = upgrade.request_for(prefix, manifest, ref=args.ref, source=args.source,
                              environ=upgrade.rocm_environ(args.rocm, args.nightly), jobs=args.jobs)
    run_id, out = upgrade.recorded(prefix, req, args.rootfs, argv=args.argv, substitute=substitute.from_stores,
                                   run=argv, model=model, pct=pct,
                                   root_arg=None if args.rootfs.is_host else args.root, quiet=args.json)
    if args.json:
        print(json.dumps({**out.to_json(), "run": run_id}, indent=2))
    else:
        print_report(out)
    return 0 if out.passed else 1


def _model(model: str | None) -> str | None:
    if model is None:
        return None
    from rocforge_build.measure import gguf

    try:  # a file that is not a whole GGUF model is refused before anything is built
        gguf.check(model)
    except gguf.ModelError as exc:
        raise UsageError(f"--model {exc.message}", exc.hint) from None
    return os.path.realpath(model)


def print_report(out) -> None:
    word = {"upgraded": "UPGRADED", "refused": "REFUSED (the build is unchanged)",
            "up to date": "nothing to do: the build already has these inputs"}[out.status]
    print(f"upgrade {out.prefix}: {word}")
    for side, s in (("from", out.before), ("to", out.after)):
        if s and out.status == "upgraded":
            print(f"  {side:4} {s.get('version') or '-'} {(s.get('commit') or '')[:12]} "
                  f"{s.get('source') or ''}" + (f" (ROCm {s['rocm']})" if s.get("rocm") else ""))
    if out.gates:
        print(f"  {'gate':8} {'verdict':12} detail")
        for g in out.gates:
            print(f"  {g.name:8} {g.verdict:12} {g.detail}")
            for label, f in g.figures.items() if g.name == "bench" else ():
                print(f"           {label}: {f['current']:.2f} -> {f['candidate']:.2f} t/s "
                      f"({f['change_pct']:+.1f}%)")
    if out.previous:
        print(f"  the replaced build is kept at {out.previous}; `rocforge rollback {out.prefix}` "
              "puts it back")
