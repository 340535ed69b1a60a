"""Per-job memory of llama.cpp builds: peak RSS of the heaviest translation units, the figure
behind the llama-cpp recipe's `[[jobs]] memory_mb` (default -j = min(cores, MemAvailable / it)).

    python benchmarks/bench_jobs_memory.py [--vulkan]
    python benchmarks/bench_jobs_memory.py --hip      # as root: Debian sid chroot, clang 21

Configures the May 2025 tree (llama-cpp-python 0.3.9 sdist, tests/llama_trees.py) with the
recipe's release flags, then compiles the named translation units one at a time, each under
`/usr/bin/time -v`, with the exact command of compile_commands.json (no compiler cache), and
prints peak RSS and wall time.  `--vulkan` also generates the shaders header and measures
ggml-vulkan.cpp (several minutes on 2 cores).  Needs GNU time at /usr/bin/time, cmake, ninja, a C
and C++ compiler (and glslc for --vulkan) and the sdist (`pip download`, tests/llama_trees.py);
without them it says which is missing in one line and exits 0 (`nox -s bench` on a fresh clone).

Measured on the 2-core Debian 12 host (GCC 12.2, -O3 Release), Nov 2026:
    473 MB  src/llama-model.cpp      465 MB  common/arg.cpp      319 MB  src/llama-sampling.cpp
    318 MB  common/common.cpp        255 MB  ggml-cpu/ops.cpp    248 MB  src/llama-vocab.cpp
    243 MB  llamafile/sgemm.cpp      224 MB  ggml-quants.c       144 MB  src/llama.cpp

`--vulkan`, same host and tree, Debian 12's glslc 2023.2 (the shader header it generates):
    1001 MB  ggml-vulkan.cpp  57 s   (the CPU units as above, within 2 MB)

`--hip`, Nov 2026, same host, Debian sid chroot (clang 21, HIP 6.4.3), Oct 2026 tree, gfx1151,
no compiler cache; 53 of the HIP backend's 144 translation units (every mmq and fattn-tile
instance and the largest others), peak RSS / wall on a loaded 2-core machine:
    274 MB  mmq-instance-nvfp4.cu  25 s      273 MB  mmq-instance-mxfp4.cu  26 s
    259 MB  mmvq.cu                27 s      250 MB  binbcast.cu            21 s
    249 MB  fattn-tile-instance-dkq128-dv128.cu  28 s    248 MB  mmvf.cu    17 s
    242 MB  mmq-instance-iq2_s.cu (and the other i-quant mmq instances)    15 s
    214 MB  ggml-cuda.cu            6 s      206 MB  fattn-mma-f16-instance-ncols1_64-ncols2_1.cu
Cross-checked from the host with `/usr/bin/time -f %M` around the whole chroot run:
mmq-instance-q4_k.cu 247 MB (241 MB inside), ggml-cuda.cu 220 MB (214 MB inside).

`--tensile --tensile-src DIR --logic DIR`: rocBLAS's kernel generator, TensileCreateLibrary, on one
architecture's logic files with --jobs N, its process tree sampled from /proc (each process's
VmHWM, and the peak of their summed VmRSS).  Inputs: a ROCm/Tensile checkout (its develop head of
March 2025, ROCm 6.5 staging; rocBLAS 6.4.4's tensile_tag commit is not in that snapshot) and the
logic files of Debian sid's rocblas_6.4.4.orig.tar.gz (library/src/blas3/Tensile/Logic/asm_full/),
fetched through a temporary apt config; a Python with pyyaml, msgpack and joblib (--python).
Debian 12's clang 15 stands in for amdclang (it has gfx1100, not gfx1151).  Measured Nov 2026 on
the 2-core host, navi31 (gfx1100, 40 logic files, 46 MB, 6,699 kernels), --jobs 2,
--generate-sources-and-exit (the kernel generation; the assembler runs seen were ~70 MB each):
    637 MB  the main process        398 MB  worker 1        382 MB  worker 2
    1,353 MB  peak of the tree's sum; 644 s
so a Tensile job is ~400 MB on top of a ~640 MB main process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

# --hip: the HIP backend's template instances for gfx1151 (Oct 2026 tree, llama-cpp-python 0.3.36)
HIP_HEAVY = ("mmq-instance-", "fattn-tile-instance-", "fattn.cu", "fattn-tile.cu", "mmf.cu",
             "mmvq.cu", "mmvf.cu", "mmq.cu", "convert.cu", "getrows.cu", "cpy.cu", "binbcast.cu",
             "softmax.cu", "rope.cu", "unary.cu", "mmid.cu", "topk-moe.cu", "set-rows.cu",
             "ggml-cuda.cu", "fattn-mma-f16-instance-ncols1_64-ncols2_1.cu",
             "fattn-vec-instance-q8_0-q8_0.cu")  # a name ending in "-": every file it starts
# run inside the chroot: each compile_commands.json entry alone, its peak RSS as /usr/bin/time's
# %M reports it (the largest waited-for descendant's ru_maxrss; the sid chroot has no `time`)
_MEASURE = r"""
import json, os, resource, subprocess, sys, time
cmds = json.load(open("/work/build/compile_commands.json"))
names = [c["file"].rsplit("/", 1)[-1] for c in cmds if "/ggml-cuda/" in c["file"]]
for name in [n for w in sys.argv[1:] for n in names if n == w or (w.endswith("-") and n.startswith(w))]:
    e = next(c for c in cmds if c["file"].endswith("/" + name))
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.chdir(e["directory"])
        r = subprocess.run(e["command"], shell=True, capture_output=True, text=True)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(json.dumps({"file": name, "peak_rss_mb": rss // 1024, "rc": r.returncode,
                          "wall_s": round(time.monotonic() - t, 1)}), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def hip(tmp: Path) -> int:
    """The Oct 2026 tree configured as `rocforge build llama-cpp --target gfx1151 --backend hip`
    plans it (its configure flags and toolchain env from --dry-run --json, no compiler cache),
    inside the Debian sid chroot (tests/sid_chroot.py: clang 21, HIP 6.4); then HIP_HEAVY."""
    import sid_chroot
    from llama_trees import tree

    root = sid_chroot.ensure()
    work = tmp / "work"
    top = tree("0.3.36", work, full=True)
    src = f"{sid_chroot.WORK}/{top.name}/vendor/llama.cpp"
    plan = json.loads(sid_chroot.rocforge(root, "build", "llama-cpp", "--target", "gfx1151",
                                          "--backend", "hip", "--source", src, "--dry-run",
                                          "--json", "--no-cache", work=work).stdout)
    argv = list(plan["configure"])
    argv[argv.index("-S") + 1] = src
    argv[argv.index("-B") + 1] = f"{sid_chroot.WORK}/build"
    argv += ["-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DGGML_CCACHE=OFF"]
    r = sid_chroot.run(root, argv, work=work, env=plan["env"])
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-3000:])
        return 1
    (work / "measure.py").write_text(_MEASURE)
    r = sid_chroot.run(root, ["python3", f"{sid_chroot.WORK}/measure.py", *HIP_HEAVY], work=work,
                       env=plan["env"])
    for line in r.stdout.splitlines():
        m = json.loads(line)
        print(f"{m['peak_rss_mb']:6d} MB  {m['wall_s']:7.1f} s  {m['file']}  rc={m['rc']}", flush=True)
    return r.returncode


HEAVY = ("llama-model.cpp", "arg.cpp", "llama-sampling.cpp", "common.cpp", "ops.cpp",
         "llama-vocab.cpp", "sgemm.cpp", "ggml-quants.c", "llama.cpp", "ggml-cpu.c")


def peak(cmd: str, cwd: str) -> tuple[int, str, int]:
    r = subprocess.run(["/usr/bin/time", "-v", "sh", "-c", cmd], cwd=cwd, capture_output=True,
                       text=True)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", r.stderr).group(1)
    return rss // 1024, wall, r.returncode


def _tree_rss(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (VmRSS kB, VmHWM kB)} of `root` and every process below it, from /proc."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, pp in parent.items() if pp == pid and c not in tree]
    out = {}
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        rss = re.search(r"VmRSS:\s+(\d+)", status)
        hwm = re.search(r"VmHWM:\s+(\d+)", status)
        if rss and hwm:
            out[pid] = (int(rss.group(1)), int(hwm.group(1)))
    return out


def tensile(a) -> int:
    """TensileCreateLibrary (rocBLAS's kernel generator) on one architecture's logic files with
    --jobs N, its process tree sampled from /proc every 0.25 s: each process's peak RSS (VmHWM)
    and the peak of their sum.  The joblib workers' peaks are the per-job figure."""
    import threading

    tc = Path(tempfile.mkdtemp(prefix="rocforge-tensile-tc-"))
    for name, target in (("amdclang++", a.clangxx), ("amdclang", a.clang),  # the names
                         ("clang-offload-bundler", a.bundler)):  # Tensile accepts on Linux
        (tc / name).symlink_to(target)
    out = Path(tempfile.mkdtemp(prefix="rocforge-tensile-out-"))
    argv = [a.python, str(Path(a.tensile_src) / "Tensile" / "bin" / "TensileCreateLibrary"),
            f"--cxx-compiler={tc / 'amdclang++'}", f"--c-compiler={tc / 'amdclang'}",
            f"--assembler={tc / 'amdclang++'}", f"--offload-bundler={tc / 'clang-offload-bundler'}",
            f"--architecture={a.arch}", "--code-object-version=V5", "--library-format=msgpack",
            "--merge-files", "--separate-architectures", "--lazy-library-loading",
            *(["--generate-sources-and-exit"] if a.sources_only else []),
            f"--jobs={a.jobs}", a.logic, str(out), "HIP"]
    env = {**os.environ, "PYTHONPATH": a.tensile_src, "PATH": f"{tc}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, tuple[int, str]] = {}
    total = [0]

    def sample() -> None:
        while proc.poll() is None:
            now = _tree_rss(proc.pid)
            total[0] = max(total[0], sum(r for r, _ in now.values()))
            for pid, (_, hwm) in now.items():
                if hwm > peaks.get(pid, (0, ""))[0]:
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                    except OSError:
                        cmd = "?"
                    peaks[pid] = (hwm, cmd)
            time.sleep(0.25)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    log = proc.communicate()[0]
    t.join()
    wall = time.monotonic() - t0
    print(log[-1500:])
    print(f"TensileCreateLibrary --architecture={a.arch} --jobs={a.jobs} on {a.logic}: rc={proc.returncode}, "
          f"{wall:.0f} s; peak of the tree's summed RSS {total[0] // 1024} MB")
    for pid, (kb, cmd) in sorted(peaks.items(), key=lambda x: -x[1][0])[:8]:
        role = "the main process" if pid == proc.pid else Path(cmd).name
        print(f"  {kb // 1024:6d} MB  pid {pid}  {role}")
    return proc.returncode


def main() -> int:
    from llama_trees import bench_tree

    ap = argparse.ArgumentParser()
    ap.add_argument("--vulkan", action="store_true")
    ap.add_argument("--hip", action="store_true", help="gfx1151 HIP instances, clang 21 (sid chroot)")
    ap.add_argument("--tensile", action="store_true", help="TensileCreateLibrary's workers")
    ap.add_argument("--tensile-src", help="a Tensile checkout (ROCm/Tensile)")
    ap.add_argument("--logic", help="one architecture's rocBLAS logic directory")
    ap.add_argument("--arch", default="gfx1100")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="a Python with pyyaml, msgpack, joblib")
    ap.add_argument("--clang", default="/usr/bin/clang-15")
    ap.add_argument("--clangxx", default="/usr/bin/clang++-15")
    ap.add_argument("--bundler", default="/usr/lib/llvm-15/bin/clang-offload-bundler")
    ap.add_argument("--sources-only", action="store_true", help="--generate-sources-and-exit")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-jobmem-"))
    if a.hip:
        return hip(tmp)
    if a.tensile:
        return tensile(a)
    missing = [t for t in ("cmake", "ninja", "cc", "c++", *(("glslc",) if a.vulkan else ()))
               if shutil.which(t) is None]
    if not os.access("/usr/bin/time", os.X_OK):
        missing.insert(0, "/usr/bin/time (GNU time; Debian: apt-get install time)")
    if missing:
        print(f"bench_jobs_memory: skipped: needs {', '.join(missing)}")
        return 0
    src = bench_tree("bench_jobs_memory", tmp / "trees")
    if src is None:
        return 0
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
