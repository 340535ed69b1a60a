"""How much a target-trimmed bundle saves: Debian sid's rocBLAS and hipBLASLt packages, measured on
their real file names and sizes (tests/data/kernel-dirs/*.txt, `dpkg-deb -c` of librocblas4 6.4.4
and libhipblaslt1 7.1.1, made by fetch.sh there), trimmed by `rocforge bundle`'s own rule.

    python benchmarks/bench_bundle_sizes.py [--target gfx1151 ...]

For each target: the kernel directories as shipped (every target) vs as bundled (the target's files,
its override fallback's where a library lacks them, and the files naming no target), and the same
with the shared libraries themselves (they cannot be trimmed by file: librocblas.so carries its own
device code for every target).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LISTS = REPO / "tests" / "data" / "kernel-dirs"
PACKAGES = {"librocblas4": "rocblas", "libhipblaslt1": "hipblaslt"}


def read(package: str) -> tuple[dict[str, int], int]:
    """({kernel file name: size}, bytes of everything else in the package's lib dir)."""
    kernels, other = {}, 0
    for line in (LISTS / f"{package}.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        size, path = line.split(" ", 1)
        if "/library/" in path:
            kernels[path.rsplit("/", 1)[1]] = int(size)
        elif path.startswith("usr/lib/") and ".so" in path.rsplit("/", 1)[1]:
            other += int(size)
    return kernels, other


def main() -> int:
    from rocforge_build.ship import bundle_rules

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", action="append", default=[])
    args = ap.parse_args()
    data = {p: read(p) for p in PACKAGES}
    dirs = {PACKAGES[p]: list(k) for p, (k, _) in data.items()}
    all_k = sum(sum(k.values()) for k, _ in data.values())
    libs = sum(o for _, o in data.values())
    print(f"{'target':<9} {'kernel dirs':>24} {'ratio':>7}   {'with the .so files':>26} {'ratio':>7}  kept targets")
    for target in args.target or ["gfx1151", "gfx1100", "gfx90a"]:
        keep_targets, _ = bundle_rules.kernel_targets(target, dirs)
        kept = 0
        for k, _ in data.values():
            names, _ = bundle_rules.trim_names(list(k), keep_targets)
            kept += sum(k[n] for n in names)
        print(f"{target:<9} {kept / 2**20:9.1f} / {all_k / 2**20:7.1f} MiB {kept / all_k:7.1%}   "
              f"{(kept + libs) / 2**20:9.1f} / {(all_k + libs) / 2**20:7.1f} MiB {(kept + libs) / (all_k + libs):7.1%}"
              f"  {', '.join(keep_targets)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
