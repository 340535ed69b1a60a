"""rocforge's own overhead on a real tree: `rocforge build` vs the hand build it wraps.

    python benchmarks/bench_overhead_llama.py [--rounds 4] [--cmake-target ggml] [--backend cpu]
        [-j 2] [--source TREE] [--json OUT]

What it compares, each round in alternating order (rocforge first in odd rounds):
  rocforge: `python -m rocforge_build build llama-cpp --backend B --source TREE --cmake-target T
            --no-cache --force -j J` with its work dir removed first, so the tree is copied,
            configured and built from nothing, installed, and the manifest written;
  by hand:  `cmake -S TREE -B <empty dir> -G Ninja <every -D flag of rocforge's plan>` and
            `ninja -C <dir> -j J T` on the same source (TREE, or a copy with the plan's patches
            applied once before the rounds) — the same CMake options (taken from `--dry-run --json`, so
            the tree's own ccache switch GGML_CCACHE=OFF too), generator, targets and -j, with the
            same environment plus what rocforge's plan adds to it.
No compiler cache on either side.  TREE defaults to the May 2025 llama.cpp tree (llama-cpp-python
0.3.9 sdist, tests/llama_trees.py).  Prints each run (wall, configure, ninja, CPU seconds of all
child processes, the sum of ninja's per-edge times from .ninja_log), the median ratios, and where
rocforge's seconds outside configure + ninja went (the manifest's step timings; `process` = wall
minus the manifest's total: interpreter start, imports, manifest, swap).

Measured (2 shared cores, load average 2.0-2.3 from other jobs, Nov 2026, `--rounds 6`, ggml,
-j 2): median wall rocforge 20.91 s vs by hand 21.32 s (0.980x; per-round ratios 1.013, 1.070,
0.981, 0.924, 1.071, 1.009, median 1.011); CPU seconds 37.22 vs 37.37 (0.996x); rocforge's own
steps: process 0.24 s, plan 0.06 s, work copy 0.37 s, configure and ninja as by hand, install
0.01 s — about 0.7 s.  The 16-core Vulkan run (benchmarks/gpu/vulkan_build_overhead.sh, H100
machine, 12 rounds in three calls, Nov 2026): median wall 59.5 vs 58.4 s (1.019x; per-round median
1.026, rounds 0.89-1.20 on a loaded host), ninja 0.996x; rocforge's fixed cost ~1.27 s + 0.17 s of
configure (the CMake file-API reply).
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


def _cpu() -> float:
    """User + system seconds of every finished child process (compilers included)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _edges(build_dir: Path) -> float:
    """The sum of ninja's per-edge wall times (.ninja_log, v5: start and end in ms)."""
    total = 0
    for line in (build_dir / ".ninja_log").read_text().splitlines():
        if not line.startswith("#"):
            start, end = line.split("\t")[:2]
            total += int(end) - int(start)
    return total / 1000


def _patched_once(src: Path, plan: dict, where: Path) -> Path:
    """The source the hand build compiles: the tree itself, or — when rocforge's plan applies
    patches to it (the Vulkan coopmat guard on the May 2025 tree) — a copy with those patches
    applied once, before any round, as someone building by hand would: both sides then compile
    the same source.  rocforge's own copy and patch stay inside its timed build."""
    wanted = [p["name"] for p in plan["patches"] if p["status"] == "would apply"]
    if not wanted:
        return src
    shutil.copytree(src, where, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    recipe_patches = Path(plan["recipe_path"]).resolve().parent.parent / "patches" / plan["recipe"]
    for name in wanted:
        subprocess.run(["git", "apply", str(recipe_patches / name)], cwd=where, check=True,
                       env={**os.environ, "GIT_CEILING_DIRECTORIES": str(where.parent)})
    print(f"hand build source: {where} (patched once: {', '.join(wanted)})")
    return where


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cmake-target", "--build-target", action="append", dest="targets")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--source", help="a llama.cpp tree (default: the llama-cpp-python 0.3.9 sdist's)")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    targets = a.targets or ["ggml"]
    missing = [t for t in ("cmake", "ninja", "cc", "c++") if shutil.which(t) is None]
    if missing:
        print(f"bench_overhead_llama: skipped: needs {', '.join(missing)} (not on PATH)")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-overhead-"))
    if a.source:
        src = Path(a.source).resolve()
    else:
        from llama_trees import bench_tree

        src = bench_tree("bench_overhead_llama", tmp / "trees", "; --source TREE uses a tree you have")
        if src is None:
            return 0
    env = {**os.environ, "ROCFORGE_CONFIG_DIR": str(tmp / "config"),
           "ROCFORGE_CACHE_DIR": str(tmp / "cache"), "ROCFORGE_DATA_DIR": str(tmp / "data")}
    argv = [sys.executable, "-m", "rocforge_build", "build", "llama-cpp", "--target", "gfx1100",
            "--backend", a.backend, "--source", str(src), "--no-cache", "-j", str(a.jobs),
            "--prefix", str(tmp / "prefix"), *[x for t in targets for x in ("--cmake-target", t)]]
    plan = json.loads(subprocess.run([*argv, "--dry-run", "--json"], env=env, check=True, cwd=REPO,
                                     capture_output=True, text=True).stdout)
    flags = [f for f in plan["configure"] if f.startswith("-D")]
    assert plan["compiler_launcher"] is None, plan["compiler_launcher"]
    hand_env = {**env, **plan["env"]}
    work = Path(plan["work_dir"])
    hand_src = _patched_once(src, plan, tmp / "hand-src")
    print(f"tree {src}\nflags {' '.join(flags)}\nenv added {plan['env']}\n"
          f"load average at start {os.getloadavg()}", flush=True)

    def rocforge() -> dict:
        shutil.rmtree(work, ignore_errors=True)
        t, c = time.perf_counter(), _cpu()
        p = subprocess.run([*argv, "--force"], env=env, cwd=REPO, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t, _cpu() - c
        if p.returncode:
            sys.exit(f"rocforge build failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        steps = tomllib.loads((tmp / "prefix" / "rocforge-manifest.toml").read_text())["timings"]
        steps["process"] = wall - steps["total"]
        return {"wall": wall, "cpu": cpu, "configure": steps["configure"], "ninja": steps["build"],
                "edges": _edges(work / "build"), "steps": steps}

    def by_hand() -> dict:
        b = tmp / "hand-build"
        shutil.rmtree(b, ignore_errors=True)
        t, c = time.perf_counter(), _cpu()
        subprocess.run(["cmake", "-S", str(hand_src), "-B", str(b), "-G", "Ninja", *flags], check=True,
                       capture_output=True, env=hand_env)
        t1 = time.perf_counter()
        subprocess.run(["ninja", "-C", str(b), "-j", str(a.jobs), *targets], check=True,
                       capture_output=True, env=hand_env)
        t2 = time.perf_counter()
        return {"wall": t2 - t, "cpu": _cpu() - c, "configure": t1 - t, "ninja": t2 - t1,
                "edges": _edges(b)}

    runs: dict[str, list[dict]] = {"rocforge": [], "hand": []}
    print(f"{'round':5s} {'who':8s} {'wall':>7s} {'config':>7s} {'ninja':>7s} {'CPU':>7s} {'edges':>7s}")
    for i in range(a.rounds):
        order = [("rocforge", rocforge), ("hand", by_hand)]
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            r = fn()
            runs[name].append(r)
            print(f"{i + 1:5d} {name:8s} {r['wall']:7.2f} {r['configure']:7.2f} {r['ninja']:7.2f} "
                  f"{r['cpu']:7.2f} {r['edges']:7.2f}", flush=True)
    print(f"load average at end {os.getloadavg()}")

    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[who])

    for key, what in (("wall", "wall seconds"), ("cpu", "CPU seconds of all child processes"),
                      ("ninja", "ninja wall seconds"), ("edges", "sum of ninja edge seconds")):
        r, h = med("rocforge", key), med("hand", key)
        print(f"median {what}: rocforge {r:.2f}, by hand {h:.2f}: {r / h:.3f}x")
    ratios = [r["wall"] / h["wall"] for r, h in zip(runs["rocforge"], runs["hand"], strict=True)]
    print("per-round wall ratio: " + ", ".join(f"{x:.3f}" for x in ratios)
          + f" (median {statistics.median(ratios):.3f})")
    keys = sorted({k for r in runs["rocforge"] for k in r["steps"]})
    print("rocforge steps (median s): " + ", ".join(
        f"{k} {statistics.median(r['steps'].get(k, 0) for r in runs['rocforge']):.2f}" for k in keys))
    if a.json:
        Path(a.json).write_text(json.dumps({"flags": flags, "targets": targets, "jobs": a.jobs,
                                            "backend": a.backend, "runs": runs}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
