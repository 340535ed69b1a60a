"""`rocforge results list|show|export|compare|plot`: read the results store."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from rocforge_build import argtypes
from rocforge_build.errors import UsageError
from rocforge_build.measure import compare as cmp
from rocforge_build.measure.store import Store
from rocforge_build.shellsafe import one_line as shown  # every stored string printed for people

# a bench row's `ceiling` (measure/roofline.py), flattened into CSV columns `ceiling_<key>`
CEILING_FIELDS = ("tg_pct_of_bandwidth", "bandwidth_gbs", "bandwidth_source", "pp_pct_of_gemm_peak",
                  "gemm_peak_tflops", "gemm_source", "model_bytes_per_token", "active_parameters",
                  "device", "why_none")
CSV_FIELDS = ("id", "run", "kind", "status", "created", "prefix", "backend", "stamp", "gate", "test",
              "n_prompt", "n_gen", "depth", "ubatch", "fa", "env", "t_s", "stddev", "error", "passed",
              "reference", "model_sha256") + tuple(f"ceiling_{k}" for k in CEILING_FIELDS)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="the runs").add_argument("--json", action="store_true", help="machine-readable output")
    show = sub.add_parser("show", help="one run's rows (default: the last run)")
    show.add_argument("run", nargs="?", type=argtypes.run_id, metavar="RUN",
                      help="a run number from `results list` (default: the last run)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    exp = sub.add_parser("export", help="rows as JSON or CSV")
    fmt = exp.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--json", action="store_true", help="a JSON list of rows")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per line (a row's ceiling as ceiling_* columns)")
    exp.add_argument("--run", type=argtypes.run_id, metavar="RUN", help="only this run's rows (default: every run)")
    exp.add_argument("--prefix", metavar="PREFIX", help="only this build's rows")
    c = sub.add_parser("compare", help="flag regressions of NEW against BASE")
    runs = "a run number, a build prefix (its latest bench run) or PREFIX@RUN"
    c.add_argument("a", metavar="BASE", help=f"the baseline: {runs}")
    c.add_argument("b", metavar="NEW", help=f"what is compared with it: {runs}")
    c.add_argument("--threshold", type=argtypes.percent, default=cmp.DEFAULT_THRESHOLD * 100,
                   metavar="PCT", help="a figure this many percent slower is a regression "
                   f"(default {cmp.DEFAULT_THRESHOLD * 100:g})")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("plot", help="depth curves as a self-contained HTML/SVG file")
    p.add_argument("--run", type=argtypes.run_id, action="append", metavar="RUN", help="runs to plot (default: the last bench run)")
    p.add_argument("--prefix", action="append", metavar="PREFIX", help="only these builds")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="the HTML file to write")


def run(args) -> int:
    with Store() as store:
        return globals()[f"_{args.action}"](store, args)


def _list(store: Store, args) -> int:
    runs = store.runs()
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    if not runs:
        print(f"no results yet in {store.path}")
    for r in runs:
        print(f"{r['id']:>4}  {shown(r['kind']):<7} {shown(r['started'])}  {shown(r['status']):<13} "
              f"{r['rows']:>4} rows  {shown(' '.join(r['argv']))[:80]}")
    return 0


def _last_run(store: Store, kind: str | None = None) -> int:
    runs = [r for r in store.runs() if kind is None or r["kind"] in kind]
    if not runs:
        raise UsageError(f"no runs in {store.path}", "run `rocforge bench` first")
    return runs[-1]["id"]


def _show(store: Store, args) -> int:
    run_id = args.run or _last_run(store)
    info = store.run_info(run_id)
    if info is None:
        raise UsageError(f"there is no run {run_id}", "see `rocforge results list`")
    rows = [r.to_json() for r in store.rows(run_id=run_id)]
    if args.json:
        print(json.dumps({**info, "rows": rows}, indent=2, default=str))
        return 0
    from rocforge_build.measure.bench import Variant
    from rocforge_build.measure.session import describe
    from rocforge_build.measure.verify import kld_shown

    print(f"run {run_id}: {shown(info['kind'])} {shown(info['status'])} ({shown(info['started'])} - "
          f"{shown(info['finished'] or '...')})")
    print(f"  {shown(' '.join(info['argv']))}")
    for r in rows:
        if r["kind"] == "verify":
            checks = ", ".join(f"ctx {c['ctx']}: KLD {kld_shown(c['kld_mean'])} top-1 {c['top1']}" for c in r["checks"] or [])
            print(f"  verify {shown(r['prefix'])}: {'passed' if r['passed'] else 'FAILED'} ({checks})")
        else:
            print(f"  {shown(r.get('prefix'))} {shown(Variant.of_row(r).label())}  {shown(describe(r))}")
    return 0


def _export(store: Store, args) -> int:
    prefix = str(Path(args.prefix).expanduser().resolve()) if args.prefix else None
    if args.run is not None and store.run_info(args.run) is None:  # as `results show` says it
        raise UsageError(f"there is no run {args.run}", "see `rocforge results list`")
    rows = [r.to_json() for r in store.rows(run_id=args.run, prefix=prefix)]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    w = csv.DictWriter(sys.stdout, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        ceiling = {f"ceiling_{k}": v for k, v in (r.get("ceiling") or {}).items()}
        w.writerow({**r, **ceiling, "env": json.dumps(r.get("env")) if r.get("env") else ""})
    return 0


def _compare(store: Store, args) -> int:
    label_a, a = cmp.resolve(store, args.a)
    label_b, b = cmp.resolve(store, args.b)
    lines = cmp.compare(a, b, args.threshold / 100)
    diffs = cmp.host_differences(a, b)
    if args.json:
        print(json.dumps({"a": label_a, "b": label_b, "threshold": args.threshold / 100,
                          "lines": [x.to_json() for x in lines], "flagged": len(cmp.flagged(lines)),
                          "host_differences": [{"key": k, "a": va, "b": vb, "text": cmp.difference_line(k, va, vb)}
                                               for k, va, vb in diffs]}, indent=2, default=str))
    else:
        print(cmp.table(lines, label_a, label_b, args.threshold / 100))
        print(cmp.differences_text(diffs))
    return 1 if cmp.flagged(lines) else 0


def _plot(store: Store, args) -> int:
    from rocforge_build import replace
    from rocforge_build.measure import plot

    out = Path(args.output)
    replace.check_own_file(out, "-o", plot.made_by_rocforge)  # before any work
    runs = args.run or [_last_run(store, ("bench", "tune"))]
    prefixes = {str(Path(p).expanduser().resolve()) for p in args.prefix or []}
    rows = [r.data | {"status": r.status} for run in runs for r in store.rows(run_id=run, kind="bench")
            if not prefixes or r.prefix in prefixes]
    text = plot.page(rows, f"rocforge results: run {', '.join(map(str, runs))}")
    replace.write_own_file(out, text, "-o", plot.made_by_rocforge)
    print(out)
    return 0
