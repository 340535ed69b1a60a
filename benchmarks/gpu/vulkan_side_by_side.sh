#!/bin/bash
# Run on the GPU machine (device tool), from a checkout whose .dev/build/ holds:
#   rocforge/   git archive of rocforge_build, recipes, patches
#   llama/      vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist, without models/ media/ docs/ tests/
#   debs/       apt-get -oAPT::Architecture=amd64 download glslc libshaderc1 libvulkan-dev libvulkan1
#               spirv-headers vulkan-tools libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
#               libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8
#   whl/        pip download --no-deps tomlkit platformdirs
#   make_tiny_gguf.py   (random-weight llama GGUF writer; tests/tiny_gguf.py is the same idea)
# and call it with carry [".dev/build"]:  bash .dev/build/gpu_run.sh
# Vulkan llama.cpp (llama-cpp-python 0.3.9 tree) built through rocforge AND by hand with the
# same flags, then llama-bench -o json pp512/tg128 on a random 1b llama (Q4_0), side by side.
D=$PWD/.dev/build
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/vulkan_env.sh"
vulkan_unpack $D/debs; vulkan_use_sdk
python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
export PYTHONPATH=$D/rocforge:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
nproc; nvidia-smi -L; cmake --version | head -1; ninja --version; c++ --version | head -1; which ccache sccache
ARGS="llama-cpp --target gfx1151 --backend vulkan --source $D/llama --cmake-target llama-bench --cmake-target llama-quantize -j16 --prefix /tmp/rf-prefix"
python3 -m rocforge_build build $ARGS --dry-run --json > $OUT/plan.json || exit 1
t0=$(date +%s.%N)
python3 -m rocforge_build build $ARGS 2>&1 | tail -20 || exit 1
t1=$(date +%s.%N)
python3 -m rocforge_build build $ARGS 2>&1 | tail -3
t2=$(date +%s.%N)
cp /tmp/rf-prefix/rocforge-manifest.toml $OUT/
# by hand: the same -D flags rocforge passed (see plan.json "configure")
cmake -S $D/llama -B /tmp/hand -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR=lib '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DGGML_RPC=ON -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=/tmp/vk/usr/include -DVulkan_LIBRARY=/tmp/vk/usr/lib/x86_64-linux-gnu/libvulkan.so -DVulkan_GLSLC_EXECUTABLE=/tmp/vk/usr/bin/glslc -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON > /tmp/hand-configure.log 2>&1 || { tail -30 /tmp/hand-configure.log; exit 1; }
ninja -C /tmp/hand -j16 llama-bench llama-quantize > /tmp/hand-build.log 2>&1 || { tail -30 /tmp/hand-build.log; exit 1; }
t3=$(date +%s.%N)
python3 -c "import sys; a=list(map(float, sys.argv[1:])); print(f'rocforge build: {a[1]-a[0]:.1f} s; no-op rebuild (new process): {a[2]-a[1]:.2f} s; hand configure+build: {a[3]-a[2]:.1f} s')" $t0 $t1 $t2 $t3 | tee $OUT/build-times.txt
python3 $D/make_tiny_gguf.py /tmp/m-f16.gguf $D/llama --size 1b || exit 1
/tmp/rf-prefix/bin/llama-quantize /tmp/m-f16.gguf /tmp/m-q4_0.gguf Q4_0 > /tmp/q.log 2>&1 || { tail /tmp/q.log; exit 1; }
mkdir -p /tmp/res
HAND="env LD_LIBRARY_PATH=/tmp/hand/bin:$LD_LIBRARY_PATH /tmp/hand/bin/llama-bench"
for round in 1 2 3 4 5 6; do
  /tmp/rf-prefix/bin/llama-bench -m /tmp/m-q4_0.gguf -p 512 -n 128 -r 5 -ngl 99 -o json > /tmp/res/rocforge-$round.json 2> /tmp/rf-$round.err
  $HAND -m /tmp/m-q4_0.gguf -p 512 -n 128 -r 5 -ngl 99 -o json > /tmp/res/hand-$round.json 2> /tmp/hand-$round.err
done
grep -h "ggml_vulkan" /tmp/rf-1.err /tmp/hand-1.err
python3 - <<'PY'
import json, os, statistics
out = "/tmp/res"
rows = {}
allres = {}
for who in ("rocforge", "hand"):
    for r in range(1, 7):
        data = json.load(open(f"{out}/{who}-{r}.json"))
        allres[f"{who}-{r}"] = data
        for t in data:
            key = "pp512" if t["n_prompt"] else "tg128"
            rows.setdefault((who, key), []).append((t["avg_ts"], t["stddev_ts"], t["backends"]))
for key in ("pp512", "tg128"):
    a = [x[0] for x in rows[("rocforge", key)]]; b = [x[0] for x in rows[("hand", key)]]
    print(key, "rocforge", [f"{v:.1f}" for v in a], "hand", [f"{v:.1f}" for v in b],
          "median rocforge %.1f hand %.1f ratio %.3f" % (statistics.median(a), statistics.median(b), statistics.median(a) / statistics.median(b)),
          "mean ratio %.3f" % ((sum(a) / len(a)) / (sum(b) / len(b))), rows[("rocforge", key)][0][2])
json.dump(allres, open(os.environ["OUT"] + "/bench-all.json", "w"), indent=1)
PY
