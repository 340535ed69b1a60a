"""`rocforge env --shell bash` start-up cost beside a bare `python -c pass`, measured side by side.

Runs the installed console script (falls back to `python -m rocforge_build` when it is not on
PATH, and says so) against a Strix Halo fixture root (KFD sysfs + 2025 TheRock tree), rotating
four commands so machine load hits all alike: bare python, `rocforge env` answered from its
validated cache (what every shell start-up after the first pays), `rocforge env` with
ROCFORGE_NO_CACHE=1 (full discovery and resolution), and the launcher alone (the console script
or `python -m` starting nothing, to tell its cost from rocforge's).  Prints medians, minimums and
ratios to bare python, and PASS or FAIL for each bar (issue 24: <= 1.5x for the cached path, <= 3x without
the cache), judged on the median ratio.  PYTHONPATH, when set, is passed on (to measure a
checkout other than the installed one); `--module` runs `python -m rocforge_build` even where the
console script is on PATH.  Exits 0 either way: it measures, the figures are the result.

    python benchmarks/bench_env.py [--runs N] [--importtime] [--module]
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


def launcher(tmp: Path, script: str | None, python: str, env: dict) -> tuple | None:
    """The way rocforge is started, doing nothing else: the console script with its
    `from rocforge_build.cli import main` replaced by a no-op (pip's wrappers import `re`), or
    `python -m` of an empty package (runpy).  None when the script is not the usual wrapper."""
    if script:
        text = Path(script).read_text(errors="replace")
        line = "from rocforge_build.cli import main"
        if line not in text:
            return None
        probe = tmp / "launcher"
        probe.write_text(text.replace(line, "main = lambda: 0"))
        return [python, str(probe)], env
    pkg = tmp / "launch" / "rocforge_launch_probe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("")
    where = os.pathsep.join(p for p in (str(pkg.parent), env.get("PYTHONPATH")) if p)
    return [python, "-m", pkg.name], {**env, "PYTHONPATH": where}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--importtime", action="store_true",
                        help="also print the slowest imports of one `rocforge env` run")
    parser.add_argument("--module", action="store_true",
                        help="run `python -m rocforge_build`, not the console script")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rocforge-bench-") as tmp:
        root = Path(tmp) / "root"
        fixtures_roots.make_strix_halo(root)
        home = Path(tmp) / "home"
        home.mkdir()
        # A user's real environment: no ROCFORGE_* overrides, so paths.py asks platformdirs.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LC_ALL": "C.UTF-8"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        script = None if args.module else shutil.which("rocforge")
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
            how = "python -m rocforge_build" + (
                "" if args.module else " (no `rocforge` console script on PATH)")
        env_cmd = [*rocforge, "--root", str(root), "env", "--shell", "bash"]
        bare = [python, "-c", "pass"]
        out = subprocess.run(env_cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0 or "export ROCM_PATH='/opt/rocm'" not in out.stdout:
            print(out.stdout, out.stderr, file=sys.stderr)
            raise SystemExit("rocforge env did not produce the expected script")

        cold_env = {**env, "ROCFORGE_NO_CACHE": "1"}
        runs = {"bare": (bare, env, []), "warm": (env_cmd, env, []), "cold": (env_cmd, cold_env, [])}
        launch = launcher(Path(tmp), script, python, env)
        if launch:
            runs["launcher"] = (*launch, [])
        for _ in range(3):  # warm the page cache and fill rocforge's env cache
            for argv, e, _ in runs.values():
                timed(argv, e)
        order = list(runs)
        for i in range(args.runs):
            n = i % len(order)
            for name in order[n:] + order[:n]:
                argv, e, bucket = runs[name]
                bucket.append(timed(argv, e))

        med = {k: statistics.median(v[2]) for k, v in runs.items()}
        low = {k: min(v[2]) for k, v in runs.items()}
        print(f"bench_env: {args.runs} rotating runs each; rocforge via {how}")
        labels = {"bare": "python -c pass", "launcher": "the launcher alone (no rocforge)",
                  "warm": "rocforge env --shell bash (cached)",
                  "cold": "rocforge env --shell bash (no cache)"}
        for k, label in labels.items():
            if k not in runs:
                continue
            ratio = "" if k == "bare" else (f"   ratio median {med[k] / med['bare']:5.2f}x"
                                            f"  min {low[k] / low['bare']:5.2f}x")
            print(f"  {label:38s} median {med[k] * 1000:7.1f} ms  min {low[k] * 1000:7.1f} ms{ratio}")
        for k, bar, what in (("warm", 1.5, "cached"), ("cold", 3.0, "no cache")):
            ratio = med[k] / med["bare"]
            print(f"  {'PASS' if ratio <= bar else 'FAIL'}: {what} <= {bar:g}x bare python "
                  f"(median ratio {ratio:.2f}x)")
        if "launcher" in runs:
            print(f"  of the cached path's {(med['warm'] - med['bare']) * 1000:.1f} ms over bare "
                  f"python, the launcher's own is {(med['launcher'] - med['bare']) * 1000:.1f} ms "
                  f"and rocforge's {(med['warm'] - med['launcher']) * 1000:.1f} ms (medians)")

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
