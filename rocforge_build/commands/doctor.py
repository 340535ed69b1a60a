"""`rocforge doctor [--json] [--target GFX] [--rocm PATH]`: GPUs, ROCm installs, library coverage
per target, every decision with its reason, and preflight warnings (stale override, /dev/kfd
access, iGPU + dGPU, old kernel).  Exit 0 when a usable stack is found, else 1."""

from __future__ import annotations

import json
import os
import re

from rocforge_build.discover import host, host_checks, known_bad, resolver
from rocforge_build.forge import parallel
from rocforge_build.resources import load_toml, package_data
from rocforge_build.rootfs import Root
from rocforge_build.shellsafe import one_line

_CHECKS = package_data("doctor.toml")


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--target", metavar="GFX", help="resolve for this gfx target")
    parser.add_argument("--rocm", metavar="PATH", help="use this ROCm install (inside --root)")


# -- system checks --------------------------------------------------------------------------------
def _groups(root: Root) -> dict[str, list[str]]:
    text = root.read_text("/etc/group") if root.is_file("/etc/group") else ""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[0]:
            out[parts[0]] = [m for m in parts[3].split(",") if m]
    return out


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")


def _kernel_version(root: Root) -> str | None:
    """`6.14` or `6.14.0` of the running kernel, read by host.py (osrelease, /proc/version, uname)."""
    kernel = host.read_kernel(root)
    m = re.search(r"(\d+\.\d+)(?:\.\d+)?", kernel.release) if kernel else None
    return m.group(0) if m else None


def _vkey(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def system_checks(root: Root, res: resolver.Resolution) -> tuple[list[str], list[str]]:
    """(warnings, blockers): blockers make the stack unusable for running GPU code."""
    checks = load_toml(_CHECKS, "doctor checks")
    warnings: list[str] = []
    blockers: list[str] = []
    detected = [g for g in res.gpus if g.source != "--target"]
    group_names = checks["access"]["groups"]
    groups = _groups(root)
    user = _user()
    kfd = "/dev/kfd"
    if not root.exists(kfd):
        msg = ("/dev/kfd is missing: the amdgpu kernel driver is not loaded, or the container "
               "was started without --device=/dev/kfd --device=/dev/dri")
        (blockers if detected else warnings).append(msg)
    else:
        host = root.host(kfd)
        if root.is_host:
            ok = os.access(host, os.R_OK | os.W_OK)
        else:
            mode = host.stat().st_mode
            ok = (mode & 0o006) == 0o006 or any(user in groups.get(g, []) for g in group_names)
        if not ok:
            members = "; ".join(f"{g}: {', '.join(groups[g]) or 'no members'}"
                                for g in group_names if g in groups) or "no render/video group"
            blockers.append(
                f"/dev/kfd is not readable and writable by {user or 'this user'} ({members}); "
                f"run `sudo usermod -aG {','.join(group_names)} {user or '$USER'}` and log in again")
    kernel = _kernel_version(root)
    if kernel:
        for g in {t.generation for g in detected if (t := g.target)}:
            rule = checks["kernel"].get(g)
            if rule and _vkey(kernel) < _vkey(rule["min"]):
                warnings.append(f"kernel {kernel} is older than {rule['min']}, which rocforge "
                                f"recommends for {g} GPUs: {rule['why']}")
    return warnings, blockers


def host_fingerprint(root: Root, res: resolver.Resolution) -> dict:
    """The fields of a measurement's host (measure/provenance.host) that the known-bad list
    matches, read from the same files: kernel, the detected GPUs, firmware, command line."""
    kernel = host.read_kernel(root)
    gpus = [g for g in res.gpus if g.source != "--target"]
    return {**host.fingerprint(root, gpus), "kernel": kernel.release if kernel else None,
            "gpus": [{"gfx": g.gfx} for g in gpus]}


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


def _interesting_targets(res: resolver.Resolution) -> list[str]:
    names: list[str] = []
    for g in res.gpus:
        names.append(g.gfx)
        if g.known and g.target.override_with:
            names.append(g.target.override_with)
    if res.target:
        names.append(res.target)
    return list(dict.fromkeys(names))


def coverage_rows(res: resolver.Resolution) -> list[dict]:
    rows = []
    for inst in res.installs:
        for gfx in _interesting_targets(res):
            ok, why = inst.coverage.kernels_for(gfx)
            c = inst.coverage
            rows.append({"install": str(inst.path), "target": gfx, "kernels": ok, "evidence": why,
                         "rocblas": gfx in c.rocblas, "hipblaslt": gfx in c.hipblaslt,
                         "bitcode": gfx in c.bitcode, "dist_info": gfx in c.dist})
    return rows


def stack_blockers(res: resolver.Resolution) -> list[str]:
    """Why the resolved stack cannot serve the target: every `usable: false` has a reason."""
    if res.rocm is None:
        return [f"no ROCm install found: {resolver.install_hint(res.target)}"]
    if res.target is not None:
        ok, why = res.rocm.coverage.kernels_for(res.target)
        if not ok:
            return [f"ROCm {res.rocm.path} has no kernels for {res.target} ({why}): "
                    + resolver.install_hint(res.target)]
    return []


def run(args) -> int:
    res = resolver.resolve(args.rootfs, target=args.target, rocm=args.rocm)
    host_found, warnings, blockers = _findings(args.rootfs, res)
    usable = not blockers
    if args.json:
        data = res.to_json()
        data["host"] = [c.to_json() for c in host_found]
        data["coverage"] = coverage_rows(res)
        data["warnings"] = warnings  # one list: the resolver's and the system checks'
        data["blockers"] = blockers  # empty exactly when usable
        data["usable"] = usable
        data["build_servers"] = parallel.doctor_checks()
        print(json.dumps(data, indent=2))
        return 0 if usable else 1

    from rich.console import Console
    # soft wrap: a line longer than the screen is left to the terminal (or the pipe) whole,
    # never broken by rich at 80 columns
    console = Console(soft_wrap=True)
    _print_tables(console, res)
    for line in host_checks.text_lines(host_found):
        console.print(line, highlight=False)
    for row in parallel.doctor_checks():  # configured cache server / distcc hosts (forge/parallel.py)
        console.print(esc(f"{row['what']} {row['address']}: {row['status']}"), highlight=False)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {esc(w)}", highlight=False)
    for b in blockers:
        console.print(f"[red]problem:[/] {esc(b)}", highlight=False)
    if usable:
        console.print(f"[green]usable:[/] ROCm {esc(str(res.rocm.path))} for {res.target or 'building'}; "
                      "`eval \"$(rocforge env)\"` sets it up", highlight=False)
    else:
        console.print("[red]not usable:[/] see the problems above", highlight=False)
    return 0 if usable else 1



def _nightly_finder(res: resolver.Resolution, problems: list[str]):
    """known_bad.find, joined to the signed nightly advisories of `substitute.stores` when a
    current nightly is there to judge (only then is a store asked); a store's problem is a line
    in `problems`."""
    if not any(inst.nightly_current for inst in res.installs):
        return known_bad.find
    from rocforge_build import config
    from rocforge_build.substitute import advisories

    return advisories.known_bad_finder(config.effective().get("substitute") or {},
                                       lambda line: problems.append(f"nightly advisories: {line}"))

def _findings(rootfs: Root, res: resolver.Resolution) -> tuple[list, list[str], list[str]]:
    """(host checks, warnings, blockers) from every source doctor asks: the resolver, the system
    checks, the host checks and the known-bad list; the JSON and the text report the same."""
    sys_warnings, sys_blockers = system_checks(rootfs, res)
    host_found = host_checks.checks(rootfs, res.gpus)  # a host check at "fail" blocks; "warn" does not
    # the resolver's own blockers: e.g. the main GPU not served by this ROCm
    # known-bad host states, less those the host section above already reports (with their fix)
    reported = {c.id for c in host_found if c.status != "ok"}
    bad_host = [m for m in known_bad.host_matches(host_fingerprint(rootfs, res))
                if m.doctor_check not in reported]
    blockers = [*stack_blockers(res), *res.blockers, *sys_blockers, *host_checks.blockers(host_found),
                *(m.text for m in bad_host if m.severity == "blocker")]
    store_lines: list[str] = []
    warnings = [*res.warnings, *sys_warnings, *known_bad.doctor_warnings(res, _nightly_finder(res, store_lines)),
                *store_lines,
                *(m.text for m in bad_host if m.severity == "warning")]
    return host_found, warnings, blockers


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

    cov = coverage_rows(res)
    if cov:
        show_table(console, "Library coverage per target",
                   ("install", "target", "rocBLAS", "hipBLASLt", "bitcode", "dist_info", "kernels"),
                   [[esc(r["install"]), esc(r["target"]),
                     *(yes if r[k] else no for k in ("rocblas", "hipblaslt", "bitcode", "dist_info", "kernels"))]
                    for r in cov])

    show_table(console, "Decisions", ("key", "value", "reason"),
               [[esc(d.key), "[dim]unset[/]" if d.value is None else esc(d.text()), esc(d.reason)]
                for d in res.decisions])
