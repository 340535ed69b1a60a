"""Library closure: what closure.py does vs two slower ways to the same answer, side by side.

A prefix of N copies of this machine's own programs (real ELF files, real dependencies) goes
through `closure.compute` (ldd in batches, each file once: ldd already lists the transitive
closure), through it with one ldd per file, and through a naive fixpoint that runs ldd again on
every library found. All three must find the same libraries (which also checks that ldd's list
is transitive). Prints the seconds of each and the ratios.

    python benchmarks/bench_closure.py [--files N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocforge_build.ship import closure  # noqa: E402


def make_prefix(top: Path, count: int) -> int:
    bindir = top / "bin"
    bindir.mkdir(parents=True)
    n = 0
    for name in sorted(os.listdir("/usr/bin")):
        src = Path("/usr/bin", name)
        if n >= count or src.is_symlink() or not src.is_file() or closure.elf_type(src) is None:
            continue
        shutil.copy2(src, bindir / name)
        n += 1
    return n


def timed(prefix: Path, batch: int, repeat: int) -> tuple[float, set[str]]:
    saved = closure._LDD_BATCH
    closure._LDD_BATCH = batch
    try:
        best, libs = float("inf"), set()
        for _ in range(repeat):
            t = time.perf_counter()
            libs = set(closure.compute([prefix]).libraries)
            best = min(best, time.perf_counter() - t)
        return best, libs
    finally:
        closure._LDD_BATCH = saved


def naive(prefix: Path, repeat: int) -> tuple[float, set[str]]:
    """ldd on the prefix's files, then on every library found, until nothing new appears."""
    best, libs = float("inf"), set()
    for _ in range(repeat):
        t = time.perf_counter()
        found: set[str] = set()
        queue = [str(p) for p in closure.scan_elf(prefix)]
        done: set[str] = set()
        while queue:
            batch = [q for q in dict.fromkeys(queue) if q not in done]
            done.update(batch)
            queue = []
            for _file, (paths, _missing) in closure.ldd([Path(b) for b in batch]).items():
                for lib in paths:
                    if lib not in found:
                        found.add(lib)
                        queue.append(lib)
        libs = found
        best = min(best, time.perf_counter() - t)
    return best, libs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "prefix"
        n = make_prefix(prefix, args.files)
        batched, libs_a = timed(prefix, closure._LDD_BATCH, args.repeat)
        single, libs_b = timed(prefix, 1, args.repeat)
        fixpoint, libs_c = naive(prefix, args.repeat)
        assert libs_a == libs_b == libs_c, "the three ways disagree"
        print(f"closure of {n} ELF files ({len(libs_a)} libraries), best of {args.repeat}:")
        print(f"  closure.compute (ldd batches of {closure._LDD_BATCH}, each file once): {batched:.3f} s")
        print(f"  one ldd per file:                                 {single:.3f} s  "
              f"({single / batched:.2f}x)")
        print(f"  naive fixpoint (ldd again on every library):      {fixpoint:.3f} s  "
              f"({fixpoint / batched:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
