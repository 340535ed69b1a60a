"""`rocforge env --shell bash` start-up cost beside a bare `python -c pass`, measured side by side.

Runs the installed console script (falls back to `python -m rocforge_build` when it is not on
PATH, and says so) against a Strix Halo fixture root (KFD sysfs + 2025 TheRock tree), rotating
three commands so machine load hits all alike: bare python, `rocforge env` answered from its
validated cache (what every shell start-up after the first pays), and `rocforge env` with
ROCFORGE_NO_CACHE=1 (full discovery and resolution).  Prints medians, minimums and ratios to
bare python; the bars (issue 24) are <= 1.5x for the cached path and <= 3x without the cache.

    python benchmarks/bench_env.py [--runs N] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import fixtures_roots  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--importtime", action="store_true",
                        help="also print the slowest imports of one `rocforge env` run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rocforge-bench-") as tmp:
        root = Path(tmp) / "root"
        fixtures_roots.make_strix_halo(root)
        home = Path(tmp) / "home"
        home.mkdir()
        # A user's real environment: no ROCFORGE_* overrides, so paths.py asks platformdirs.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LC_ALL": "C.UTF-8"}
        script = shutil.which("rocforge")
        python = sys.executable
        if script:
            rocforge = [script]
            how = f"console script {script}"
            with open(script, "rb") as fh:
                first = fh.readline().decode(errors="replace").strip()
            if first.startswith("#!"):
                python = first[2:].split()[0]  # compare with the interpreter the script uses
        else:
            rocforge = [sys.executable, "-m", "rocforge_build"]
            how = "python -m rocforge_build (no `rocforge` console script on PATH)"
        env_cmd = [*rocforge, "--root", str(root), "env", "--shell", "bash"]
        bare = [python, "-c", "pass"]
        out = subprocess.run(env_cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0 or "export ROCM_PATH='/opt/rocm'" not in out.stdout:
            print(out.stdout, out.stderr, file=sys.stderr)
            raise SystemExit("rocforge env did not produce the expected script")

        cold_env = {**env, "ROCFORGE_NO_CACHE": "1"}
        runs = {"bare": (bare, env, []), "warm": (env_cmd, env, []), "cold": (env_cmd, cold_env, [])}
        for _ in range(3):  # warm the page cache and fill rocforge's env cache
            for argv, e, _ in runs.values():
                timed(argv, e)
        order = list(runs)
        for i in range(args.runs):
            for name in order[i % 3:] + order[:i % 3]:
                argv, e, bucket = runs[name]
                bucket.append(timed(argv, e))

        med = {k: statistics.median(v[2]) for k, v in runs.items()}
        low = {k: min(v[2]) for k, v in runs.items()}
        print(f"bench_env: {args.runs} rotating runs each; rocforge via {how}")
        labels = {"bare": "python -c pass", "warm": "rocforge env --shell bash (cached)",
                  "cold": "rocforge env --shell bash (no cache)"}
        for k, label in labels.items():
            ratio = "" if k == "bare" else (f"   ratio median {med[k] / med['bare']:5.2f}x"
                                            f"  min {low[k] / low['bare']:5.2f}x")
            print(f"  {label:38s} median {med[k] * 1000:7.1f} ms  min {low[k] * 1000:7.1f} ms{ratio}")
        print("  bars: cached path <= 1.5x bare python, no cache <= 3x")

        if args.importtime:
            out = subprocess.run([python, "-X", "importtime", *(
                rocforge[1:] if not script else ["-c", "from rocforge_build.cli import main; "
                                                  "raise SystemExit(main())"]),
                "--root", str(root), "env", "--shell", "bash"],
                env=cold_env, capture_output=True, text=True)
            rows = []
            for line in out.stderr.splitlines():
                parts = line.split("|")
                if len(parts) == 3 and parts[1].strip().isdigit():
                    rows.append((int(parts[1]), parts[2].rstrip()))
            print("  slowest imports of an uncached run (cumulative us):")
            for us, name in sorted(rows, reverse=True)[:12]:
                print(f"    {us:8d}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
