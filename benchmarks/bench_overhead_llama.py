"""rocforge's own overhead on a real tree: `rocforge build` vs the hand build it wraps.

    python benchmarks/bench_overhead_llama.py [--rounds 2] [--target ggml]

The May 2025 llama.cpp tree (llama-cpp-python 0.3.9 sdist, tests/llama_trees.py), CPU backend,
one small target.  Each round, in alternating order:
  rocforge: `python -m rocforge_build build llama-cpp --backend cpu --build-target T --no-cache
            --force -j 2` from an empty work dir (so the tree is copied, configured, built);
  by hand:  `cmake -S <tree> -B <empty dir> -G Ninja <the same -D flags>` + `ninja -j 2 T`.
Both without a compiler cache (CCACHE_DISABLE=1: the tree's own GGML_CCACHE would use it).  Prints each run, the median ratio, and where rocforge's extra
seconds went (the manifest's step timings; process start = wall - the manifest's total).

Measured (2 shared cores, Nov 2026, `--rounds 2 --target ggml`): rocforge 24.34 / 21.65 s wall,
by hand 25.22 / 25.74 s (0.90x); CPU seconds 40.2 / 37.0 vs 38.2 / 40.8 (0.98x); rocforge's steps
besides configure + ninja: process 0.20 s, plan 0.04 s, sync + patches 0.52 s, install 0.01 s.
An earlier 3-round run under heavier load: 1.42x wall, the same build varying 25-45 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    from llama_trees import tree

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--target", default="ggml")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-overhead-"))
    src = tree("0.3.9", tmp / "trees", full=True) / "vendor" / "llama.cpp"
    # CCACHE_DISABLE: llama.cpp's own GGML_CCACHE (on by default) would put ccache in front of
    # both builds even with --no-cache; both must compile everything
    env = {**os.environ, "CCACHE_DISABLE": "1", "ROCFORGE_CONFIG_DIR": str(tmp / "config"),
           "ROCFORGE_CACHE_DIR": str(tmp / "cache"), "ROCFORGE_DATA_DIR": str(tmp / "data")}
    argv = [sys.executable, "-m", "rocforge_build", "build", "llama-cpp", "--target", "gfx1030",
            "--backend", "cpu", "--source", str(src), "--build-target", a.target, "--no-cache",
            "-j", "2", "--prefix", str(tmp / "prefix")]
    plan = json.loads(subprocess.run([*argv, "--dry-run", "--json"], env=env, check=True, cwd=REPO,
                                     capture_output=True, text=True).stdout)
    flags = [f for f in plan["configure"] if f.startswith("-D")]

    def cpu() -> float:  # user + system seconds of every child process (compilers included)
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def rocforge() -> float:
        shutil.rmtree(tmp / "cache" / "work", ignore_errors=True)
        t = time.perf_counter()
        subprocess.run([*argv, "--force"], env=env, check=True, cwd=REPO, capture_output=True)
        return time.perf_counter() - t

    def by_hand() -> float:
        b = tmp / "hand-build"
        shutil.rmtree(b, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run(["cmake", "-S", str(src), "-B", str(b), "-G", "Ninja", *flags], check=True,
                       capture_output=True, env=env)
        subprocess.run(["ninja", "-C", str(b), "-j", "2", a.target], check=True, capture_output=True,
                       env=env)
        return time.perf_counter() - t

    runs: dict[str, list[float]] = {"rocforge": [], "hand": []}
    cpus: dict[str, list[float]] = {"rocforge": [], "hand": []}
    steps = []
    for i in range(a.rounds):
        order = [("rocforge", rocforge), ("hand", by_hand)]
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            c = cpu()
            runs[name].append(fn())
            cpus[name].append(cpu() - c)
            print(f"round {i + 1} {name:8s} {runs[name][-1]:7.2f} s wall, {cpus[name][-1]:7.2f} s CPU",
                  flush=True)
            if name == "rocforge":
                m = tomllib.loads((tmp / "prefix" / "rocforge-manifest.toml").read_text())
                steps.append({**m["timings"], "process": runs[name][-1] - m["timings"]["total"]})
    r, h = statistics.median(runs["rocforge"]), statistics.median(runs["hand"])
    print(f"median rocforge {r:.2f} s, by hand {h:.2f} s: {r / h:.3f}x wall")
    rc, hc = statistics.median(cpus["rocforge"]), statistics.median(cpus["hand"])
    print(f"median CPU rocforge {rc:.2f} s, by hand {hc:.2f} s: {rc / hc:.3f}x (less sensitive to "
          "other load on a shared machine than wall time)")
    keys = sorted({k for s in steps for k in s})
    print("rocforge steps (median s): " + ", ".join(
        f"{k} {statistics.median(s.get(k, 0) for s in steps):.2f}" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
