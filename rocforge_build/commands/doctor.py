"""`rocforge doctor [--json] [--target GFX] [--rocm PATH]`: GPUs, ROCm installs, library coverage
per target, every decision with its reason, and preflight warnings (stale override, /dev/kfd
access, iGPU + dGPU, old kernel).  Exit 0 when a usable stack is found, else 1."""

from __future__ import annotations

import json

from rocforge_build.discover import findings, host_checks, resolver
from rocforge_build.forge import parallel
from rocforge_build.shellsafe import one_line


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--target", metavar="GFX", help="resolve for this gfx target")
    parser.add_argument("--rocm", metavar="PATH", help="use this ROCm install (inside --root)")


# -- output ---------------------------------------------------------------------------------------
def esc(text: object) -> str:
    """Text read from a store, the system or a file (a manifest's reasons, a path, a warning), as
    rich markup on one line: a line break or escape sequence in it is a hand-edited or hostile
    value, and must not forge a line of doctor's report or drive the terminal."""
    from rich.markup import escape

    return escape(one_line(text))


def show_table(console, title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """A rich table on a terminal wide enough for every cell, else plain lines (title, then one
    `column: value; ...` line per row): rich fits a table to the width by cutting cells with an
    ellipsis, and a cut path or version (`/opt/rocm/core-10.1/lib/llvm/amdgcn/bitcode`,
    `10.1.0a20261102`) is a wrong answer, worst when piped (80 columns)."""
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    natural = console.measure(t, options=console.options.update_width(1 << 20)).maximum
    if console.is_terminal and natural <= console.width:
        console.print(t)
        return
    console.print(f"[bold]{title}[/]", highlight=False)
    for r in rows:
        cells = [f"{c}: {v}" if c else v for c, v in zip(columns, r, strict=True) if v]
        console.print("  " + "; ".join(cells), highlight=False)


def run(args) -> int:
    res = resolver.resolve(args.rootfs, target=args.target, rocm=args.rocm)
    found = findings.gather(args.rootfs, res, _advisories)
    if args.json:
        data = res.to_json()
        data["host"] = [c.to_json() for c in found.host]
        data["coverage"] = findings.coverage_rows(res)
        data["warnings"] = list(found.warnings)  # one list: the resolver's and the system checks'
        data["blockers"] = list(found.blockers)  # empty exactly when usable
        data["usable"] = found.usable
        data["build_servers"] = parallel.doctor_checks()
        print(json.dumps(data, indent=2))
        return 0 if found.usable else 1

    from rich.console import Console
    # soft wrap: a line longer than the screen is left to the terminal (or the pipe) whole,
    # never broken by rich at 80 columns
    console = Console(soft_wrap=True)
    _print_tables(console, res)
    for line in host_checks.text_lines(found.host):
        console.print(line, highlight=False)
    for row in parallel.doctor_checks():  # configured cache server / distcc hosts (forge/parallel.py)
        console.print(esc(f"{row['what']} {row['address']}: {row['status']}"), highlight=False)
    for w in found.warnings:
        console.print(f"[yellow]warning:[/] {esc(w)}", highlight=False)
    for b in found.blockers:
        console.print(f"[red]problem:[/] {esc(b)}", highlight=False)
    if found.usable:
        console.print(f"[green]usable:[/] ROCm {esc(str(res.rocm.path))} for {res.target or 'building'}; "
                      "`eval \"$(rocforge env)\"` sets it up", highlight=False)
    else:
        console.print("[red]not usable:[/] see the problems above", highlight=False)
    return 0 if found.usable else 1



def _advisories(report):
    """known_bad.find joined to the signed nightly advisories of `substitute.stores`."""
    from rocforge_build import config
    from rocforge_build.substitute import advisories

    return advisories.known_bad_finder(config.effective().get("substitute") or {}, report)


def _print_tables(console, res: resolver.Resolution) -> None:
    """The text report's tables: GPUs, ROCm installs, library coverage per target, decisions."""
    yes = "[green]yes[/]"
    no = "[red]no[/]"

    rows = []
    for i, g in enumerate(res.gpus):
        used = yes if i in res.selected else ("[dim]-[/]" if g.source == "--target" else no)
        rows.append([str(g.index) if g.index >= 0 else "-", "-" if g.node is None else str(g.node),
                     esc(g.gfx), esc(g.kind), str(g.compute_units or "-"),
                     f"0x{g.device_id:04x}" if g.device_id else "-",
                     yes if g.known else "[yellow]no[/]", used])
    if not res.gpus:
        rows.append(["-", "-", "none detected", "", "", "", "", ""])
    show_table(console, f"GPUs (from {esc(res.gpu_source)})" if res.gpus else "GPUs (none detected)",
               ("#", "node", "target", "kind", "CUs", "device", "known", "used"), rows)

    rows = []
    for inst in res.installs:
        chosen = "[green]*[/]" if res.rocm is not None and inst.path == res.rocm.path else ""
        rows.append([chosen, esc(str(inst.path)), esc(inst.layout), esc(inst.version or "?"),
                     esc(str(inst.compiler_dir or "-")), esc(str(inst.bitcode_dir or "-")),
                     esc(", ".join(inst.sources))])
    if not res.installs:
        rows.append(["", "none found", "", "", "", "", ""])
    show_table(console, "ROCm installs",
               ("", "path", "layout", "version", "compiler", "device bitcode", "found as"), rows)

    cov = findings.coverage_rows(res)
    if cov:
        show_table(console, "Library coverage per target",
                   ("install", "target", "rocBLAS", "hipBLASLt", "bitcode", "dist_info", "kernels"),
                   [[esc(r["install"]), esc(r["target"]),
                     *(yes if r[k] else no for k in ("rocblas", "hipblaslt", "bitcode", "dist_info", "kernels"))]
                    for r in cov])

    show_table(console, "Decisions", ("key", "value", "reason"),
               [[esc(d.key), "[dim]unset[/]" if d.value is None else esc(d.text()), esc(d.reason)]
                for d in res.decisions])
