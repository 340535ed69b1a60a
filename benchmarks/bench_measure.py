"""The harness's own cost: `rocforge bench --no-gate` against the same llama-bench command lines run
by hand in a shell loop, side by side in one process, alternating which goes first each round.

    PYTHONPATH=. python benchmarks/bench_measure.py [--prefix BUILD] [--model MODEL.gguf] \\
        [--depth 0,512] [--ubatch 256,512] [--fa on,off] [-p 256] [-n 16] [--reps 3] \\
        [--rounds 5] [--fit-rounds 3] [--lock /tmp/rocforge-heavy.lock] [--json FILE]

With no --prefix: the first llama.cpp build rocforge made (`<data dir>/builds/llama-cpp-*` with
bin/llama-bench); none there: skipped with one line, exit 0 (`nox -s bench` on a fresh clone).  With
no --model: a tiny random-weight GGUF (tests/tiny_gguf.py), which measures the harness, not a model.

1. A warm-up `rocforge bench` call (the model's sha256 is computed and cached, the page cache and a
   GPU's shader cache are filled; not counted).  The command lines it ran are read back from its
   results database and written, with the build's runtime environment, into a bash script: the
   "by hand" side is exactly those commands, in that order, output to files.
2. `--rounds` rounds, each `rocforge bench` (a fresh process, as a user runs it) and the script,
   the order alternating.  The figure is the median over rounds of rocforge's wall time / the
   script's wall time (the issue's bound: 1.02).  Each call also reports the time it spent inside
   llama-bench processes, so wall - inside is the harness's own time in that same call, free of
   load that changes between calls.
3. The fixed costs: `--fit-rounds` rounds of `rocforge bench` on a trivial workload (-p 16 -n 1
   -r 1) with 1 and with `--fit-runs` llama-bench runs; the harness time per call and per run is the
   line through the two (medians).

`--no-warmup`: bench's discarded warm-up run (on by default for GPU builds, whose first processes pay
the driver's pipeline compiles) is an extra llama-bench run by choice, not the harness's cost; step 1
warms both sides instead.

The rocforge side runs with Python's bytecode cache on (PYTHONPYCACHEPREFIX in a temporary folder,
PYTHONDONTWRITEBYTECODE dropped) as an installed rocforge has its .pyc files; results go to a
temporary database (ROCFORGE_RESULTS_DB), the model digest to the data dir as in normal use.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rocforge_build import paths  # noqa: E402
from rocforge_build.measure.llama_tools import LlamaBuild  # noqa: E402
from rocforge_build.measure.store import Store  # noqa: E402


@contextmanager
def held(lock: str | None):
    """The shared lock for one measurement (other jobs run between rounds, not inside one)."""
    if not lock:
        yield
        return
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def default_prefix() -> str | None:
    """The first llama.cpp build rocforge made that has llama-bench, or None."""
    base = paths.builds_prefix()
    for d in sorted(base.glob("llama-cpp-*")) if base.is_dir() else ():
        if (d / "rocforge-manifest.toml").is_file() and (d / "bin" / "llama-bench").is_file():
            return str(d)
    return None


def rocforge_argv(a, prefix: str, *, depth: str, ubatch: str, fa: str, p: int, n: int, reps: int) -> list[str]:
    argv = shlex.split(a.rocforge) + ["bench", prefix, "--model", a.model, "--no-gate", "--no-warmup", "--json",
                                      "--depth", depth, "-p", str(p), "-n", str(n), "--reps", str(reps)]
    argv += ["--ubatch", ubatch] if ubatch else []
    argv += ["--fa", fa] if fa else []
    argv += ["--threads", str(a.threads)] if a.threads else []
    return argv


class Rocforge:
    """`rocforge bench` calls into one temporary results database."""

    def __init__(self, env: dict[str, str], db: Path):
        self.env, self.db = env, db

    def call(self, argv: list[str]) -> dict:
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=self.env)
        wall = time.perf_counter() - t
        with Store(self.db) as store:
            run = store.runs()[-1]
            inside = store.run_info(run["id"])["info"]["llama_bench_s"]
            rows = [r.data for r in store.rows(run_id=run["id"])]
        if any(r["status"] != "ok" for r in rows):
            raise SystemExit(f"rocforge bench run {run['id']} has failed rows: {rows}")
        return {"wall": wall, "inside": inside, "harness": wall - inside, "run": run["id"], "rows": rows}


def script_from(rows: list[dict], runtime_env: dict[str, str], out: Path) -> tuple[str, list[str]]:
    """The bash loop of the command lines rocforge ran (one per llama-bench run, its order)."""
    argvs: list[str] = []
    for r in rows:
        env = "".join(f"{k}={shlex.quote(str(v))} " for k, v in (r.get("env") or {}).items())
        line = (f"env {env}" if env else "") + r["argv"]
        if line not in argvs:
            argvs.append(line)
    lines = ["#!/bin/bash", "# the llama-bench command lines `rocforge bench` ran, in its order, with the build's "
             "runtime environment"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in runtime_env.items()]
    lines += [f"{c} > {out}/run{i}.jsonl 2> {out}/run{i}.err || exit 1" for i, c in enumerate(argvs)]
    return "\n".join(lines) + "\n", argvs


def by_hand(script: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(["bash", str(script)], check=True, env=env)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", help="the llama.cpp build (a rocforge install prefix; default: the "
                    "first llama-cpp build in rocforge's builds dir, else skipped)")
    ap.add_argument("--model", help="the GGUF model (default: a tiny random-weight one)")
    ap.add_argument("--depth", default="0,512")
    ap.add_argument("--ubatch", default="256,512")
    ap.add_argument("--fa", default="on,off")
    ap.add_argument("-p", type=int, default=256)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fit-rounds", type=int, default=3, help="rounds of the fixed-cost fit (0: none)")
    ap.add_argument("--fit-runs", type=int, default=8, help="llama-bench runs in the fit's larger call")
    ap.add_argument("--lock", help="flock this file around each round (e.g. /tmp/rocforge-heavy.lock)")
    ap.add_argument("--rocforge", default=f"{shlex.quote(sys.executable)} -m rocforge_build",
                    help="how to start rocforge (default: this Python, -m rocforge_build)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    a = ap.parse_args()
    if a.prefix is None:
        a.prefix = default_prefix()
        if a.prefix is None:
            print(f"bench_measure: skipped: no llama.cpp build in {paths.builds_prefix()} (give "
                  "--prefix BUILD; `rocforge build llama-cpp --backend cpu` makes one)")
            return 0
        print(f"bench_measure: the llama.cpp build {a.prefix} (no --prefix given)")
    prefix = str(Path(a.prefix).resolve())
    build = LlamaBuild.open(prefix)

    with tempfile.TemporaryDirectory(prefix="bench-measure-") as tmp_name:
        tmp = Path(tmp_name)
        if a.model is None:
            sys.path.insert(0, str(REPO / "tests"))
            import tiny_gguf

            a.model = str(tiny_gguf.write(tmp / "tiny.gguf"))
            print(f"bench_measure: a tiny random-weight model {a.model} (no --model given)")
        a.model = str(Path(a.model).resolve())
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ROCFORGE_RESULTS_DB=str(tmp / "results.sqlite3"), PYTHONPYCACHEPREFIX=str(tmp / "pyc"))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        rf = Rocforge(env, tmp / "results.sqlite3")
        (tmp / "out").mkdir()
        matrix = rocforge_argv(a, prefix, depth=a.depth, ubatch=a.ubatch, fa=a.fa, p=a.p, n=a.n, reps=a.reps)
        load = {"start": os.getloadavg()}
        print(f"load average at start: {load['start']}; rocforge: {shlex.join(matrix)}", flush=True)
        with held(a.lock):
            warm = rf.call(matrix)  # the model digest is computed here once, and cached
        text, argvs = script_from(warm["rows"], build.runtime_env, tmp / "out")
        script = tmp / "by-hand.sh"
        script.write_text(text)
        print(f"warm-up (first call: hashes the model, compiles bytecode): {warm['wall']:.2f} s\n"
              f"by hand, {len(argvs)} llama-bench runs:\n{text}", flush=True)

        rounds = []
        for i in range(a.rounds):
            first_rf = i % 2 == 0
            with held(a.lock):
                la = os.getloadavg()[0]
                if first_rf:
                    r, h = rf.call(matrix), by_hand(script, env)
                else:
                    h = by_hand(script, env)
                    r = rf.call(matrix)
            rounds.append({"rocforge": r["wall"], "inside": r["inside"], "harness": r["harness"],
                           "by_hand": h, "ratio": r["wall"] / h, "first": "rocforge" if first_rf else "by hand",
                           "load1": la})
            print(f"round {i + 1} ({rounds[-1]['first']} first, load {la:.2f}): rocforge bench "
                  f"{r['wall']:.3f} s (inside llama-bench {r['inside']:.3f} s), by hand {h:.3f} s, "
                  f"ratio {r['wall'] / h:.4f}", flush=True)

        fit = []
        fit_ub = ",".join(str(32 * (k + 1)) for k in range(a.fit_runs))
        one = rocforge_argv(a, prefix, depth="0", ubatch="32", fa="", p=16, n=1, reps=1)
        many = rocforge_argv(a, prefix, depth="0", ubatch=fit_ub, fa="", p=16, n=1, reps=1)
        for i in range(a.fit_rounds):
            with held(a.lock):
                pair = (rf.call(one), rf.call(many)) if i % 2 == 0 else tuple(reversed((rf.call(many), rf.call(one))))
            fit.append({"one": pair[0]["harness"], "many": pair[1]["harness"]})
            print(f"fit round {i + 1}: harness time with 1 run {pair[0]['harness'] * 1000:.1f} ms, "
                  f"with {a.fit_runs} runs {pair[1]['harness'] * 1000:.1f} ms", flush=True)
    load["end"] = os.getloadavg()

    med = statistics.median(r["ratio"] for r in rounds)
    total = sum(r["rocforge"] for r in rounds) / sum(r["by_hand"] for r in rounds)
    harness = statistics.median(r["harness"] for r in rounds)
    print(f"\n{len(argvs)} llama-bench runs per call; median ratio rocforge / by hand over {len(rounds)} "
          f"rounds: {med:.4f} (total {total:.4f}; the bound is 1.02)")
    print(f"harness time per call (wall - time inside llama-bench), median: {harness * 1000:.1f} ms "
          f"of {statistics.median(r['rocforge'] for r in rounds):.2f} s")
    out = {"argv": matrix, "by_hand": argvs, "runs_per_call": len(argvs), "rounds": rounds,
           "median_ratio": med, "total_ratio": total, "harness_per_call_s": harness, "load": load,
           "warm_up_s": warm["wall"]}
    if fit:
        h1 = statistics.median(f["one"] for f in fit)
        hk = statistics.median(f["many"] for f in fit)
        per_run = (hk - h1) / (a.fit_runs - 1)
        out["fit"] = {"rounds": fit, "per_run_s": per_run, "per_call_s": h1 - per_run, "runs": a.fit_runs}
        print(f"fixed cost: {(h1 - per_run) * 1000:.1f} ms per call + {per_run * 1000:.2f} ms per "
              f"llama-bench run (medians of {len(fit)} fit rounds)")
    print(f"load average at end: {load['end']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
