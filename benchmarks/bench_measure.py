"""The harness's own cost: `rocforge bench` wall time against running the same llama-bench
commands by hand, side by side in one process, alternating which goes first each round.

    python benchmarks/bench_measure.py --prefix BUILD --model MODEL.gguf [--rounds 4]
        [--depth 0,4096] [--ubatch 256,512] [--fa on,off] [-p 512] [-n 128] [--reps 3]

Prints each round and the ratio sum(rocforge) / sum(by hand); the issue's bound is 1.02.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocforge_build.measure import bench, gguf  # noqa: E402
from rocforge_build.measure.llama_tools import LlamaBuild  # noqa: E402
from rocforge_build.measure.store import Store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--depth", default="0")
    ap.add_argument("--ubatch", default="")
    ap.add_argument("--fa", default="")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    a = ap.parse_args()

    build = LlamaBuild.open(a.prefix)
    model = gguf.check(a.model)
    spec = bench.Spec(model, tuple(bench.int_list(a.depth, "--depth")) or (0,), a.p, a.n, a.reps, a.threads)
    vs = bench.variants(bench.int_list(a.ubatch, "--ubatch"), bench.fa_list(a.fa or None), {})
    depths, _ = bench.depths_for(build, spec.depths)
    by_hand = [bench.argv_for(build, spec, v, depths) for v in vs]
    cli = [sys.executable, "-m", "rocforge_build", "bench", str(build.prefix), "--model", str(model.path),
           "--depth", a.depth, "-p", str(a.p), "-n", str(a.n), "--reps", str(a.reps), "--no-gate", "--json"]
    cli += ["--ubatch", a.ubatch] if a.ubatch else []
    cli += ["--fa", a.fa] if a.fa else []
    cli += ["--threads", str(a.threads)] if a.threads else []
    env = {**os.environ, **build.runtime_env}

    with tempfile.TemporaryDirectory() as tmp:
        env_cli = {**env, "ROCFORGE_RESULTS_DB": str(Path(tmp) / "bench.sqlite3")}

        inside: list[float] = []

        def run_cli() -> float:
            t = time.perf_counter()
            subprocess.run(cli, check=True, stdout=subprocess.DEVNULL, env=env_cli)
            wall = time.perf_counter() - t
            with Store(Path(env_cli["ROCFORGE_RESULTS_DB"])) as store:
                last = store.runs()[-1]["id"]
                inside.append(store.run_info(last)["info"]["llama_bench_s"])
            return wall

        def run_by_hand() -> float:
            t = time.perf_counter()
            for argv in by_hand:
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            return time.perf_counter() - t

        run_cli()  # warm-up: page cache, the model's sha256 cache, the GPU's shader cache
        rounds = []
        for i in range(a.rounds):
            order = (("rocforge", run_cli), ("by hand", run_by_hand))
            if i % 2:
                order = order[::-1]
            r = {name: fn() for name, fn in order}
            r["inside"] = inside[-1]
            rounds.append(r)
            print(f"round {i + 1} ({order[0][0]} first): rocforge bench {r['rocforge']:.2f} s, "
                  f"by hand {r['by hand']:.2f} s, ratio {r['rocforge'] / r['by hand']:.4f}", flush=True)
    # the same invocation's own llama-bench time: immune to load that changes between invocations
    in_run = sum(r["rocforge"] for r in rounds) / sum(r["inside"] for r in rounds)
    print(f"within rocforge's own runs: wall / time inside llama-bench = {in_run:.4f} "
          f"(fixed cost {sum(r['rocforge'] - r['inside'] for r in rounds) / len(rounds):.3f} s per invocation)")
    total_cli = sum(r["rocforge"] for r in rounds)
    total_hand = sum(r["by hand"] for r in rounds)
    ratio = total_cli / total_hand
    print(f"{len(vs)} llama-bench runs per invocation; total rocforge {total_cli:.2f} s, by hand "
          f"{total_hand:.2f} s: ratio {ratio:.4f} (bound 1.02)")
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": rounds, "ratio": ratio, "in_run_ratio": in_run,
                                            "argv": by_hand}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
