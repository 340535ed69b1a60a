"""Two "machines" sharing one remote compile cache: the second build is served by the remote.

    python benchmarks/bench_remote_cache.py [--target llama-bench]

Needs redis-server, ccache, cmake and ninja on PATH, and the sdist (downloaded once with
`pip download`, tests/llama_trees.py); without them it says which is missing in one line and
exits 0 (`nox -s bench` on a fresh clone).

A real redis-server (Debian) on 127.0.0.1; `rocforge build llama-cpp --backend cpu` of the May
2025 tree (llama-cpp-python 0.3.9 sdist, tests/llama_trees.py), each machine with its own
rocforge cache/data dirs (so its own work dir) and its own empty local ccache dir, both with
`cache.remote = redis://127.0.0.1:PORT`.  Machine one builds cold and fills the remote; machine
two builds the same request.  Prints wall times, the ratio and both manifests' [cache] tables.

Measured (2 shared cores, Nov 2026, `--target ggml`): machine one 32.6 s (0 hits, 22 misses),
machine two 3.0 s (22 hits, all 22 from the remote; build step 0.4 s): 10.8x.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    from buildservers import free_port
    from llama_trees import bench_tree

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="llama-bench")
    a = ap.parse_args()
    missing = [t for t in ("redis-server", "ccache", "cmake", "ninja") if shutil.which(t) is None]
    if missing:
        print(f"bench_remote_cache: skipped: needs {', '.join(missing)} (not on PATH)")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-remote-bench-"))
    src = bench_tree("bench_remote_cache", tmp / "trees")
    if src is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
                              "", "--appendonly", "no", "--dir", str(tmp)],
                             stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    results = []
    try:
        for name in ("one", "two"):
            home = tmp / name
            env = {**os.environ, "ROCFORGE_CONFIG_DIR": str(tmp / "config"),
                   "ROCFORGE_CACHE_DIR": str(home / "cache"), "ROCFORGE_DATA_DIR": str(home / "data"),
                   "CCACHE_DIR": str(home / "ccache")}
            subprocess.run([sys.executable, "-m", "rocforge_build", "config", "set", "cache.remote",
                            f"redis://127.0.0.1:{port}"], env=env, check=True, cwd=REPO)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rocforge_build", "build", "llama-cpp", "--target",
                            "gfx1030", "--backend", "cpu", "--source", str(src), "--cmake-target",
                            a.target, "--prefix", str(home / "prefix")], env=env, check=True,
                           cwd=REPO)
            wall = time.perf_counter() - t
            m = tomllib.loads((home / "prefix" / "rocforge-manifest.toml").read_text())
            results.append((name, wall, m["cache"], m["timings"]))
    finally:
        redis.terminate()
        redis.wait()
    for name, wall, c, timings in results:
        print(f"machine {name}: {wall:7.1f} s  hits {c['hits']}  misses {c['misses']}  "
              f"remote_hits {c['remote_hits']}  (build step {timings['build']:.1f} s)")
    print(f"ratio cold / remote-served: {results[0][1] / results[1][1]:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
