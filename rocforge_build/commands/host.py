"""`rocforge host plan [--reserve GiB] [--json] [--write FILE]`: the exact, reviewable changes
that make this host ready for ROCm on an APU (GTT size via `ttm.pages_limit` for the boot loader
in use, the modprobe.d alternative, TuneD, firmware rollback when the firmware is known bad).
rocforge never changes the host: it prints a script, or writes it with `--write`."""

from __future__ import annotations

import json
import sys

from rocforge_build import argtypes, shellsafe


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="host_command", metavar="ACTION", required=True)
    p = sub.add_parser("plan", help="print the changes as a reviewable shell script")
    p.add_argument("--reserve", type=argtypes.gib, metavar="GiB", default=None,
                   help="RAM to keep for the CPU (default 4 GiB); the rest becomes GTT")
    p.add_argument("--json", action="store_true", help="machine-readable plan")
    p.add_argument("--write", metavar="FILE", help="write the script to FILE (never over a file "
                   "rocforge did not write)")


def run(args) -> int:
    from rocforge_build.discover import gpus, host_plan

    found = gpus.discover(args.rootfs)
    p = host_plan.plan(args.rootfs, found.gpus, args.reserve)
    script = host_plan.render_script(p)
    for line in p.by_hand:
        print(f"rocforge: warning: {line}", file=sys.stderr)
    if args.write:
        host_plan.write_script(args.write, script)
    if args.json:
        print(json.dumps(p.to_json(), indent=2))
    elif args.write:
        print(f"rocforge: wrote {args.write}; review it, then run it with `sh {args.write}`")
    else:
        shellsafe.write_script(script)
    return 0
