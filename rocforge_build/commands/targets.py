"""`rocforge targets [--wide] [--json] [NAME...]`: the target table.

Plain aligned text, one line per target, so it reads at 80 columns and through a pipe: target
names are never cut (only the last column, the example products, is shortened on a narrow
terminal).  `--wide` adds every column (TheRock groups, peaks, all products); `--json` has all.
"""

from __future__ import annotations

import json
import shutil
import sys

from rocforge_build.discover import targets


def add_arguments(parser) -> None:
    parser.add_argument("names", nargs="*", metavar="GFX", help="show only these targets")
    parser.add_argument("--wide", action="store_true",
                        help="every column: TheRock groups, peak figures, all example products")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    chosen = [targets.get_target(n) for n in args.names] if args.names else targets.all_targets()
    if args.json:
        print(json.dumps([t.to_json() for t in chosen], indent=2))
        return 0
    rows = [_row(t, args.wide) for t in chosen]
    header = ["target", "version", "kind", "wave", "override"]
    if args.wide:
        header += ["TheRock groups", "peak GB/s", "peak FP16 TFLOPS", "products"]
    else:
        header += ["example product"]
    width = shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else 0
    for line in _align([header, *rows], cut_last_to=0 if args.wide else width):
        print(line)
    if not args.wide:
        print("(--wide: TheRock groups, peak figures, every product; --json: all fields)")
    return 0


def _row(t: targets.Target, wide: bool) -> list[str]:
    override = f"{t.override_with} ({targets.get_target(t.override_with).hsa_version})" \
        if t.override_with else "-"
    row = [t.name, t.hsa_version, t.kind, str(t.wave_size), override]
    if wide:
        return row + [", ".join(t.therock_groups), _num(t.peak_bandwidth_gbs),
                      _num(t.peak_fp16_tflops), "; ".join(t.marketing) or "-"]
    return row + [t.marketing[0] if t.marketing else "-"]


def _align(rows: list[list[str]], cut_last_to: int) -> list[str]:
    """Left-aligned columns two spaces apart; only the last column may be shortened (with …)
    to fit `cut_last_to` columns (0: never)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        head = "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  "
        last = r[-1]
        room = cut_last_to - len(head)
        if cut_last_to and len(last) > room:
            last = last[: max(room - 1, 1)] + "…"
        lines.append((head + last).rstrip())
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
