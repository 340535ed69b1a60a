"""Per-job memory of llama.cpp builds: peak RSS of the heaviest translation units, the figure
behind the llama-cpp recipe's `[[jobs]] memory_mb` (default -j = min(cores, MemAvailable / it)).

    python benchmarks/bench_jobs_memory.py [--vulkan]

Configures the May 2025 tree (llama-cpp-python 0.3.9 sdist, tests/llama_trees.py) with the
recipe's release flags, then compiles the named translation units one at a time, each under
`/usr/bin/time -v`, with the exact command of compile_commands.json (no compiler cache), and
prints peak RSS and wall time.  `--vulkan` also generates the shaders header and measures
ggml-vulkan.cpp (several minutes on 2 cores).

Measured on the 2-core Debian 12 host (GCC 12.2, -O3 Release), Nov 2026:
    473 MB  src/llama-model.cpp      465 MB  common/arg.cpp      319 MB  src/llama-sampling.cpp
    318 MB  common/common.cpp        255 MB  ggml-cpu/ops.cpp    248 MB  src/llama-vocab.cpp
    243 MB  llamafile/sgemm.cpp      224 MB  ggml-quants.c       144 MB  src/llama.cpp
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

HEAVY = ("llama-model.cpp", "arg.cpp", "llama-sampling.cpp", "common.cpp", "ops.cpp",
         "llama-vocab.cpp", "sgemm.cpp", "ggml-quants.c", "llama.cpp", "ggml-cpu.c")


def peak(cmd: str, cwd: str) -> tuple[int, str, int]:
    r = subprocess.run(["/usr/bin/time", "-v", "sh", "-c", cmd], cwd=cwd, capture_output=True,
                       text=True)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", r.stderr).group(1)
    return rss // 1024, wall, r.returncode


def main() -> int:
    from llama_trees import tree

    ap = argparse.ArgumentParser()
    ap.add_argument("--vulkan", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-jobmem-"))
    src = tree("0.3.9", tmp / "trees", full=True) / "vendor" / "llama.cpp"
    build = tmp / "build"
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
    if a.vulkan:
        flags.append("-DGGML_VULKAN=ON")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *flags], check=True,
                   capture_output=True)
    want = set(HEAVY)
    if a.vulkan:
        subprocess.run(["ninja", "-C", str(build), "ggml/src/ggml-vulkan/ggml-vulkan-shaders.hpp"],
                       check=True, capture_output=True)
        want.add("ggml-vulkan.cpp")
    for e in json.loads((build / "compile_commands.json").read_text()):
        if Path(e["file"]).name in want:
            mb, wall, rc = peak(e["command"], e["directory"])
            print(f"{mb:6d} MB  {wall:>8}  {e['file'].split('llama.cpp/')[-1]}  rc={rc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
