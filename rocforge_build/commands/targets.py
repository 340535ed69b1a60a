"""`rocforge targets [--json] [NAME...]`: the target table."""

from __future__ import annotations

import json

from rocforge_build.discover import targets


def add_arguments(parser) -> None:
    parser.add_argument("names", nargs="*", metavar="GFX", help="show only these targets")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    chosen = [targets.get_target(n) for n in args.names] if args.names else targets.all_targets()
    if args.json:
        print(json.dumps([t.to_json() for t in chosen], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GPU targets")
    for col in ("target", "version", "kind", "wave", "TheRock groups", "override",
                "peak GB/s", "peak FP16 TFLOPS", "examples"):
        table.add_column(col)
    for t in chosen:
        override = targets.get_target(t.override_with).hsa_version if t.override_with else "-"
        table.add_row(
            t.name, t.hsa_version, t.kind, str(t.wave_size),
            ", ".join(t.therock_groups), override,
            _num(t.peak_bandwidth_gbs), _num(t.peak_fp16_tflops), "; ".join(t.marketing),
        )
    Console().print(table)
    return 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
