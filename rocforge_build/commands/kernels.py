"""`rocforge kernels build|bench`: rocforge's own HIP kernels, built for a target and measured.

    rocforge kernels build --target GFX [--rocm PATH] [--out DIR] [--json]
    rocforge kernels bench [--target GFX | --out DIR] [--iters N] [--quick] [--only K ...] [--json]
"""

from __future__ import annotations

import json

from rocforge_build import argtypes

# timed runs per kernel: the harness reads the count as a C int (atoi) and keeps one time per run;
# the median of 100,000 runs does not move with more
ITERS_MAX = 100_000


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="compile the kernels for one target",
                       description="compile the kernels for one target with the resolved "
                       "ROCm's compiler (sm_XX targets: nvcc, through the portability header)")
    b.add_argument("--target", metavar="GFX", help="gfx target (default: the detected GPU); "
                   "sm_XX builds the same sources for NVIDIA with nvcc")
    b.add_argument("--rocm", metavar="PATH", help="the ROCm installation to compile with")
    b.add_argument("--out", metavar="DIR", help="output directory "
                   "(default: <data dir>/kernels/<target>)")
    b.add_argument("--json", action="store_true", help="machine-readable output")

    r = sub.add_parser("bench", help="run the kernels, check them against NumPy, report speed",
                       description="run every kernel of a build, check each result against a "
                       "NumPy reference and report GB/s and TFLOPS against the target's peak and "
                       "the copy bandwidth measured in the same run")
    r.add_argument("--target", metavar="GFX", help="the build to run (as given to build)")
    r.add_argument("--out", metavar="DIR", help="the build directory (as given to build)")
    r.add_argument("--iters", type=argtypes.whole(1, ITERS_MAX), default=20, metavar="N",
                   help="timed runs per kernel")
    r.add_argument("--quick", action="store_true", help="small sizes: correctness, not speed")
    r.add_argument("--only", nargs="+", metavar="KERNEL",
                   help="run only these kernels (memcpy, the reference, always runs)")
    r.add_argument("--workdir", metavar="DIR", help="where input/output files go (default: tmp)")
    r.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from rocforge_build.kernels import runner

    if args.action == "build":
        result = runner.build(args.rootfs, args.target, rocm=args.rocm, out=args.out)
        if args.json:
            print(json.dumps(result.to_json(), indent=2))
            return 0
        tc = result.toolchain
        print(f"built rocforge kernels for {result.target} ({result.platform})")
        print(f"  compiler:    {tc['version']} ({tc['compiler']})")
        print(f"  toolchain:   {tc['origin']}")
        print(f"  executable:  {result.binary}")
        if result.code_object:
            waves = sorted(set(result.wave_sizes.values()))
            print(f"  code object: {result.code_object}")
            print(f"               target {result.code_object_target}, "
                  f"wave size {'/'.join(map(str, waves))}, {len(result.wave_sizes)} kernels")
        if result.bundles:
            print(f"  bundles:     {', '.join(result.bundles)}")
        print(f"next: rocforge kernels bench --target {result.target}"
              + (f" --out {args.out}" if args.out else ""))
        return 0

    report = runner.bench(args.target, out=args.out, iters=args.iters, quick=args.quick,
                         only=args.only, workdir=args.workdir)
    saved = _remember_copy(report, quick=args.quick)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0 if report.passed else 1
    _print_report(report)
    if saved:
        print(f"memcpy bandwidth saved in {saved}: `rocforge bench` rows for {report.target} show "
              "generation as a share of it")
    return 0 if report.passed else 1


def _remember_copy(report, *, quick: bool):
    """Save the memcpy GB/s for `rocforge bench`'s ceilings (measure/roofline.py); the file, or
    None.  Not from --quick: its small copies measure start-up costs, not the memory's
    bandwidth; nor from a memcpy whose result was wrong."""
    from rocforge_build.measure import roofline

    memcpy = next((r for r in report.results if r.kernel == "memcpy"), None)
    if quick or memcpy is None or not memcpy.passed or not memcpy.gbs:
        return None
    return roofline.record_copy(report.target, memcpy.gbs, device=report.device.get("device"),
                                iters=report.iters)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    d = report.device
    title = (f"rocforge kernels on {d.get('device')} ({d.get('arch')}, {d.get('platform')}, "
             f"wave {d.get('device_wave_size')}) - build for {report.target}")
    table = Table(title=title)
    for col in ("kernel", "shape", "check", "median ms", "GB/s", "TFLOPS",
                "% of peak", "% of memcpy"):
        table.add_column(col, justify="left" if col in ("kernel", "shape", "check") else "right")
    for r in report.results:
        shape = "x".join(str(v) for v in r.shape.values())
        check = "pass" if r.passed else f"FAIL ({r.error:.3g}x tol)"
        table.add_row(r.kernel, shape, check, f"{r.ms_median:.3f}", _fmt(r.gbs, ".1f"),
                      _fmt(r.tflops, ".2f"), _fmt(r.pct_peak, ".1f"), _fmt(r.pct_copy, ".1f"))
    console = Console()
    console.print(table)
    peaks = (f"peaks from the target table: {_fmt(report.peak_bandwidth_gbs, 'g')} GB/s, "
             f"{_fmt(report.peak_fp16_tflops, 'g')} FP16 TFLOPS")
    gemm = {0: "portable fallback", 11: "WMMA (gfx11)", 12: "WMMA (gfx12)"}
    console.print(f"{peaks}; GEMM path: {gemm.get(d.get('gemm_path'), d.get('gemm_path'))}; "
                  f"{report.iters} timed runs per kernel (median)")
    if not report.passed:
        console.print("[red]some results did not match the NumPy reference[/red]")
