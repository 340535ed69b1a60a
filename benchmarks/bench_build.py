"""rocforge's build overhead, measured side by side in one run on the fixture CMake project.

    python benchmarks/bench_build.py [--rounds N]

1. full build: `rocforge build` (fetch/sync, patch, configure, ninja, install, smoke, manifest)
   vs the bare commands it wraps (`cmake -S -B -G Ninja <same -D flags>`, `ninja`,
   `cmake --install`) on the same patched tree; both without a compiler cache, rounds alternating.
2. no-op: a second identical `rocforge build` (in-process and as a new `python -m rocforge_build`
   process) vs a bare `ninja` with nothing to do.
Prints medians and ratios.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RECIPE = REPO / "tests" / "data" / "recipes" / "fixture.toml"
PROJECT = REPO / "tests" / "data" / "fixture-project"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-bench-"))
    os.environ["ROCFORGE_CACHE_DIR"] = str(tmp / "cache")
    os.environ["ROCFORGE_DATA_DIR"] = str(tmp / "data")
    os.environ["ROCFORGE_CONFIG_DIR"] = str(tmp / "config")
    from rocforge_build.forge import pipeline
    from rocforge_build.forge.plan import Request, plan_for
    from rocforge_build.rootfs import Root

    root = Root("/")
    src = tmp / "src"
    shutil.copytree(PROJECT, src)
    req = Request(recipe=str(RECIPE), target="gfx1030", source=str(src), prefix=str(tmp / "prefix"),
                           jobs=2, no_cache=True, force=True)
    plan = plan_for(req, root)
    pipeline.build(req, root, quiet=True)  # warm the page cache, make the patched tree
    patched = plan.src_dir
    bare_build = tmp / "bare-build"
    flags = [x for x in plan.configure if x.startswith("-D") and not x.startswith("-DCMAKE_INSTALL_PREFIX")]

    def bare() -> None:
        shutil.rmtree(bare_build, ignore_errors=True)
        shutil.rmtree(tmp / "bare-prefix", ignore_errors=True)
        q = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        subprocess.run(["cmake", "-S", str(patched), "-B", str(bare_build), "-G", "Ninja",
                        f"-DCMAKE_INSTALL_PREFIX={tmp / 'bare-prefix'}", *flags], **q)
        subprocess.run(["ninja", "-C", str(bare_build), "-j", "2"], **q)
        subprocess.run(["cmake", "--install", str(bare_build), "--prefix", str(tmp / "bare-prefix")], **q)

    def ours() -> None:
        shutil.rmtree(plan.build_dir, ignore_errors=True)  # a full configure + build each time
        pipeline.build(req, root, quiet=True)

    full_ours, full_bare = [], []
    for _ in range(a.rounds):
        full_ours.append(timed(ours))
        full_bare.append(timed(bare))

    noop_req = Request(recipe=str(RECIPE), target="gfx1030", source=str(src), prefix=str(tmp / "prefix"),
                                jobs=2, no_cache=True)
    assert pipeline.build(noop_req, root, quiet=True).status == "up to date"
    noop_inproc = [timed(lambda: pipeline.build(noop_req, root, quiet=True)) for _ in range(a.rounds)]
    cmd = [sys.executable, "-m", "rocforge_build", "build", str(RECIPE), "--target", "gfx1030",
           "--source", str(src), "--prefix", str(tmp / "prefix"), "-j", "2", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    noop_proc = [timed(lambda: subprocess.run(cmd, env=env, check=True, capture_output=True))
                 for _ in range(a.rounds)]
    ninja_noop = [timed(lambda: subprocess.run(["ninja", "-C", str(bare_build)], check=True,
                                               capture_output=True)) for _ in range(a.rounds)]
    shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    print(f"fixture project, {a.rounds} rounds each (medians)")
    print(f"  full build   rocforge {med(full_ours):.3f} s   bare cmake+ninja+install {med(full_bare):.3f} s"
          f"   ratio {med(full_ours) / med(full_bare):.2f}")
    print(f"  no-op        rocforge in-process {med(noop_inproc) * 1000:.1f} ms   new process "
          f"{med(noop_proc) * 1000:.0f} ms   bare ninja no-op {med(ninja_noop) * 1000:.1f} ms")
    print(f"  ratios       no-op(process)/full build {med(noop_proc) / med(full_ours):.3f}   "
          f"no-op(in-process)/bare ninja no-op {med(noop_inproc) / med(ninja_noop):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
