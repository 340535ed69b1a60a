"""Real llama.cpp trees of several eras, from the llama-cpp-python sdists on PyPI (it vendors
llama.cpp under vendor/llama.cpp; older releases carry older trees).

Downloaded at test time with `pip download --no-deps --no-binary llama-cpp-python` into a cache
outside the repository (ROCFORGE_TEST_SDISTS, default ~/.cache/rocforge-test/sdists); nothing
fetched is committed.  For plan tests only the files that decide a plan are extracted (CMake
files, the few sources the recipe's conditions read, PKG-INFO); builds extract everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

# version -> era, verified by reading each sdist's CMake files
ERAS = {
    "0.1.85": "LLAMA_HIPBLAS",  # Aug 2023: no ggml/ dir, no Vulkan
    "0.2.70": "LLAMA_HIPBLAS",  # May 2024: LLAMA_VULKAN, LLAMA_CURL
    "0.3.0": "GGML_HIPBLAS",  # Sep 2024: ggml/ split out
    "0.3.9": "GGML_HIP",  # May 2025: GGML_HIP_ROCWMMA_FATTN, fattn-wmma-f16.cu
    "0.3.36": "GGML_HIP",  # Oct 2026: GPU_TARGETS, rocWMMA FA removed, vk::LayerSettingEXT
}
_PLAN_FILES = (
    "ggml/src/ggml-cuda/fattn-wmma-f16.cu",
    "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
    "ggml/src/ggml-hip/CMakeLists.txt",
    "ggml/src/ggml-cpu/amx/mmq.cpp",  # the AMX kernels (the recipe's -mno-amx-int8 rule)
    "ggml/src/ggml-amx/mmq.cpp",
)


def cache_dir() -> Path:
    return Path(os.environ.get("ROCFORGE_TEST_SDISTS", Path.home() / ".cache" / "rocforge-test" / "sdists"))


def sdist(version: str) -> Path:
    d = cache_dir()
    path = d / f"llama_cpp_python-{version}.tar.gz"
    if not path.is_file():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", "llama-cpp-python", "-d", str(d),
                        f"llama-cpp-python=={version}"], check=True)
    return path


def _wanted(name: str, full: bool) -> bool:
    if full:
        return True
    parts = name.split("/", 1)
    rel = parts[1] if len(parts) > 1 else ""
    if rel == "PKG-INFO":
        return True
    if not rel.startswith("vendor/llama.cpp/"):
        return False
    inner = rel[len("vendor/llama.cpp/"):]
    return (inner.endswith(("CMakeLists.txt", ".cmake")) or inner in _PLAN_FILES)


def tree(version: str, dest: Path, *, full: bool = False) -> Path:
    """Extract the sdist (plan files only unless `full`); returns the sdist's top directory."""
    top = dest / f"llama_cpp_python-{version}{'' if full else '-plan'}"
    if (top / ".complete").is_file():
        return top
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist(version)) as tf:
        members = [m for m in tf.getmembers() if _wanted(m.name, full)]
        for m in members:
            m.name = m.name.split("/", 1)[1] if "/" in m.name else ""
        members = [m for m in members if m.name]
        # the stdlib filter where this Python has it (Debian's 3.11.2 does not; the sdists are
        # PyPI's own files, cached by sha256)
        tf.extractall(top, members=members,
                      **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (top / ".complete").write_text("")
    return top


def bench_tree(script: str, where: Path, hint: str = "") -> Path | None:
    """The May 2025 llama.cpp tree for a benchmark (`benchmarks/`), or None after its one
    'skipped' line when the sdist cannot be downloaded (`nox -s bench` on a machine offline)."""
    try:
        return tree("0.3.9", where, full=True) / "vendor" / "llama.cpp"
    except subprocess.CalledProcessError:
        print(f"{script}: skipped: the llama-cpp-python 0.3.9 sdist could not be downloaded "
              f"(pip download; no network?){hint}")
        return None
