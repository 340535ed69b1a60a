"""`rocforge cache list [--json]` and `rocforge cache clean [--older-than DAYS] [--sources|--work|
--failed|...] [--dry-run] [--json]`: what rocforge keeps in its cache dir, and removing only what
carries rocforge's mark (workflows/cleanup.py says what is never touched, and why)."""

from __future__ import annotations

import json
import time

from rocforge_build import argtypes
from rocforge_build.shellsafe import one_line  # a file name never forges an output line

# flag -> the categories it selects (`--work` is every work dir, `--failed` only failed ones)
FLAGS = {
    "sources": ("sources", "source trees, git mirrors and downloaded tarballs"),
    "work": ("work failed running",
             "build work dirs (source copy, build dir, log), failed ones included"),
    "failed": ("failed", "only the work dirs whose last build did not install"),
    "bisect": ("bisect", "the builds `rocforge bisect` made of each commit"),
    "containers": ("containers", "the build contexts of `rocforge container`"),
    "verify": ("verify", "verify's reference outputs (verify/refs) and model texts"),
    "llama-help": ("llama-help", "the cached `--help` texts of llama.cpp programs"),
    "env": ("env", "`rocforge env`'s cached answers (made again on the next call)"),
    "ccache": ("ccache", "ask ccache to evict its entries older than --older-than (never by "
                         "default: the compiler cache is shared with your other builds)"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="every entry of the cache with its size and age",
                        description="every entry of rocforge's cache dir and the compiler cache "
                        "its builds use, with size, age (days since anything in it last changed) "
                        "and whether `rocforge cache clean` may remove it")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    cl = sub.add_parser("clean", help="remove cache entries rocforge made (never a build prefix)",
                        description="remove what rocforge made in its cache dir: by default every "
                        "category but the compiler cache; only what carries rocforge's mark, never "
                        "a build prefix, a symbolic link's target, another mounted file system "
                        "or a work dir in use; a cache dir that is /, HOME or holds files of "
                        "someone else's is refused")
    cl.add_argument("--older-than", type=argtypes.days, metavar="DAYS",
                    help="only entries unchanged for more than DAYS days")
    for flag, (_, text) in FLAGS.items():
        cl.add_argument(f"--{flag}", action="store_true", help=text)
    cl.add_argument("--dry-run", action="store_true",
                    help="say what would be removed and remove nothing")
    cl.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from rocforge_build.workflows import cleanup

    now = time.time()
    if args.action == "list":
        return _list(*cleanup.scan(), now, args.json)
    asked = {c for flag, (cats, _) in FLAGS.items() if getattr(args, flag.replace("-", "_")) for c in cats.split()}
    out = cleanup.clean_cache(asked, args.older_than, dry_run=args.dry_run, now=now)
    if args.json:
        print(json.dumps({
            "cache_dir": str(out.base), "dry_run": args.dry_run, "older_than_days": args.older_than,
            "categories": sorted(out.categories), "freed_bytes": out.freed,
            "entries": [{**r.entry.to_json(now), "removed": r.done and not args.dry_run,
                         "outcome": r.why} for r in out.removals],
            "ccache": None if out.ccache is None else {"done": out.ccache[0], "outcome": out.ccache[1]},
        }, indent=2))
    else:
        for r in out.removals:
            verb = ("would remove" if args.dry_run else "removed") if r.done else "kept"
            tail = "" if r.done else f": {r.why}"
            print(f"{verb:12} {r.entry.category:10} {_size(r.entry.size):>9}  "
                  + one_line(f"{r.entry.path}{tail}"))
        if out.ccache is not None:
            print(f"{'ccache':12} " + one_line(out.ccache[1]))
        what = "would free" if args.dry_run else "freed"
        print(one_line(f"{what} {_size(out.freed)} in {out.base}"
                       + ("" if out.removals else " (nothing matched)")))
    return 1 if out.failed else 0


def _list(base, entries, now: float, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"cache_dir": str(base),
                          "entries": [e.to_json(now) for e in entries]}, indent=2))
        return 0
    if not entries:
        print(one_line(f"nothing cached yet in {base}"))
        return 0
    totals: dict[str, int] = {}
    for e in entries:
        totals[e.category] = totals.get(e.category, 0) + e.size
        note = f"  {e.detail}" if e.detail else ""
        kept = f"  [kept: {e.kept}]" if e.kept else ""
        print(f"{e.category:10} {_size(e.size):>9} {e.age_days(now):7.1f} d  "
              + one_line(f"{e.path}{note}{kept}"))
    print(one_line(f"cache dir {base}: " + ", ".join(f"{c} {_size(s)}" for c, s in totals.items())))
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
