#!/bin/bash
# rocforge's own overhead on the lent 16-core machine: the Vulkan backend of the May 2025 llama.cpp
# tree (target llama-bench) built through rocforge and by hand with the same flags, alternating,
# ROUNDS rounds each, a fresh work/build dir every time, no compiler cache (--no-cache, and the
# plan's GGML_CCACHE=OFF on both sides), -j JOBS; a table of wall seconds and the median ratio
# (benchmarks/bench_overhead_llama.py does the measuring and says what it compares).
#
# Run from a rocforge checkout with a carried folder D (default .dev/h100), the layout of
# benchmarks/gpu/vulkan_verify.sh:
#   llama/  vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist (trimmed: no .git docs models ...),
#           or llama.tar.xz holding it as llama/
#   debs/   the Debian Vulkan build/runtime packages listed in vulkan_verify.sh
#   whl/    pip download --no-deps tomlkit platformdirs (gguf may be there too; unused)
# and call it with carry [D]:  D=$PWD/<D> bash benchmarks/gpu/vulkan_build_overhead.sh
# Six builds of ~47-55 s each on 16 cores: about 6 minutes in all; stopped at 500 s whatever
# happens (each finished run is printed as it ends, and goes to $OUT/build-overhead.json at the end).
# Locally, for the script's logic only: BACKEND=cpu JOBS=2 ROUNDS=1 TARGET=ggml OUT=/tmp/x D=DIR
# SITE=/tmp/private-site (where the wheels go; /tmp/site by default).
D=${D:-$PWD/.dev/h100}
BACKEND=${BACKEND:-vulkan} JOBS=${JOBS:-16} ROUNDS=${ROUNDS:-3} TARGET=${TARGET:-llama-bench}
OUT=${OUT:?OUT must name a folder for the results}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/build-overhead.txt") 2>&1
export PYTHONUNBUFFERED=1
LLAMA=$D/llama
if [ ! -d "$LLAMA" ] && [ -f "$D/llama.tar.xz" ]; then  # the tree as a tarball (llama/ inside)
  LLAMA=/tmp/src/llama; mkdir -p /tmp/src; [ -d $LLAMA ] || tar -xJf "$D/llama.tar.xz" -C /tmp/src
fi
[ -d "$LLAMA" ] || { echo "no llama.cpp tree at $D/llama (or $D/llama.tar.xz)"; exit 1; }
if [ "$BACKEND" = vulkan ]; then
  . "$(dirname "$0")/vulkan_env.sh"
  vulkan_unpack "$D/debs"; vulkan_use_sdk
fi
SITE=${SITE:-/tmp/site}
if [ -d "$D/whl" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$D"/whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:$SITE
echo "== host"; nproc; uptime; cmake --version | head -1; echo "ninja $(ninja --version)"
c++ --version | head -1; git log --oneline -1 2>/dev/null; date -u
echo "compiler caches on PATH: $(command -v ccache sccache | tr '\n' ' ')"
# rocforge runs from this checkout: compile its bytecode once, as `pip install` does for an installed
# rocforge (the lent machine sets PYTHONDONTWRITEBYTECODE=1, so every run would compile ~90 modules)
python3 -m compileall -q rocforge_build "$SITE" > /dev/null
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}; imports: $(python3 -X importtime -c 'import rocforge_build.forge.pipeline' 2>&1 | tail -1)"
timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/bench_overhead_llama.py --source "$LLAMA" --backend "$BACKEND" \
  --cmake-target "$TARGET" -j "$JOBS" --rounds "$ROUNDS" --json "$OUT/build-overhead.json"
echo "bench rc=$?; $(uptime)"
