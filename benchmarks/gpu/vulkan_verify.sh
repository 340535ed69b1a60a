#!/bin/bash
# verify -> bench -> tune -> preset for llama.cpp's Vulkan backend on the GPU machine (device tool:
# an NVIDIA H100, driver 580, no ROCm), in two calls on one warm machine:
#   PHASE=build   bash benchmarks/gpu/vulkan_verify.sh   (carry [.dev-h100])
#   PHASE=measure bash benchmarks/gpu/vulkan_verify.sh   (right after; the builds stay in /tmp)
# The carried folder D (default .dev-h100) holds:
#   llama.tar.xz  vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist (May 2025), without .git docs
#                 models benches media
#   debs/         Debian 12 (bookworm): apt-get -oAPT::Architecture=amd64 download glslc libshaderc1
#                 libvulkan-dev libvulkan1 spirv-headers vulkan-tools libegl1 libglvnd0 libopengl0
#                 libgl1 libglx0 libgles2 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0
#                 libwayland-client0 libffi8
#   debsid/       Debian sid: glslc libshaderc1 (2026.4) libvulkan-dev libvulkan1 (1.4.363)
#                 spirv-headers, through a temporary apt config
#   whl/          pip download --no-deps tomlkit platformdirs rich gguf
# Builds (all through rocforge, same tree): cpu (the reference), vulkan with Debian 12's glslc 2023.2
# (no coopmat shaders; the recipe's coopmat-guard patch, llama.cpp #13696, is what makes it right on
# this driver: llama.cpp #13044) and vulkan with sid's glslc 2026.4 (coopmat, coopmat2, int dot).
D=${D:-$PWD/.dev-h100}
START=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/log-${PHASE:-build}.txt) 2>&1
export PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONPATH=$PWD:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"
OLD="env VULKAN_SDK=/tmp/vk/usr LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu PATH=/tmp/vk/usr/bin:$PATH"
NEW="env VULKAN_SDK=/tmp/vksid/usr LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu PATH=/tmp/vksid/usr/bin:$PATH"
T=/tmp/llama/llama.cpp
B="llama-cpp --target gfx1100 --source $T --cmake-target llama-bench --cmake-target llama-perplexity --cmake-target llama-cli"
VKNEW=/tmp/builds/llama-vulkan-glslc2026
M=${M:-/tmp/m-f16.gguf}

if [ "${PHASE:-build}" = build ]; then
  mkdir -p /tmp/vk /tmp/vksid /tmp/llama /tmp/builds
  . "$(dirname "$0")/vulkan_env.sh"; vulkan_unpack $D/debs
  for f in $D/debsid/*.deb; do dpkg -x $f /tmp/vksid; done
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
  tar -C /tmp/llama -xJf $D/llama.tar.xz
  echo "== host"; nproc; nvidia-smi -L; date -u
  /tmp/vk/usr/bin/glslc --version 2>/dev/null | head -1; $NEW glslc --version | head -1
  t0=$(date +%s)
  $RF build $B --backend cpu -j4 > /tmp/b-cpu.log 2>&1 & P1=$!
  $OLD $RF build $B --backend vulkan -j6 > /tmp/b-vk.log 2>&1 & P2=$!
  $NEW $RF build $B --backend vulkan -j6 --prefix $VKNEW > /tmp/b-vknew.log 2>&1 & P3=$!
  wait $P1; r1=$?; wait $P2; r2=$?; wait $P3; r3=$?
  echo "builds: cpu rc=$r1 vulkan(glslc 2023.2) rc=$r2 vulkan(glslc 2026.4) rc=$r3, $(( $(date +%s) - t0 )) s"
  for f in /tmp/b-cpu.log /tmp/b-vk.log /tmp/b-vknew.log; do echo "-- $f"; grep -iE "patch|coopmat|glslc|error|built|fail" $f | head -12; tail -n 2 $f; done
  CPU=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','cpu'))")
  VK=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','vulkan'))")
  W=$(python3 -c "from pathlib import Path; from rocforge_build.forge.plan import work_dir; print(work_dir(Path('$CPU')))")/build
  echo "CPU=$CPU VK=$VK VKNEW=$VKNEW" | tee /tmp/prefixes
  ninja -C $W -j16 llama-quantize > /tmp/q-build.log 2>&1 || tail -5 /tmp/q-build.log
  Q="env LD_LIBRARY_PATH=$W/bin:$CPU/lib $W/bin/llama-quantize"
  echo "== models"
  python3 tests/tiny_gguf.py /tmp/m-f16.gguf medium --byte-tokens --ctx 32768 || exit 1
  for q in Q8_0 Q4_0; do $Q /tmp/m-f16.gguf /tmp/m-${q,,}.gguf $q 16 > /tmp/q-$q.log 2>&1 || tail -5 /tmp/q-$q.log; done
  ls -la /tmp/*.gguf; echo "left $(left) s"
  TXT=$(python3 -c "from rocforge_build.measure.verify import text_file; print(text_file())")  # the shipped text, unpacked
  ppl() { # label prefix model extra...
    local lab=$1 pre=$2 m=$3; shift 3
    $pre/bin/llama-perplexity -m $m -f $TXT -c 512 --chunks 4 -ngl 99 "$@" > /tmp/ppl.out 2> /tmp/ppl.err; local rc=$?
    echo "PPL $lab $(basename $m) $*: rc=$rc $(grep -ho 'Final estimate: PPL = .*' /tmp/ppl.out /tmp/ppl.err)"
    grep -h "ggml_vulkan: 0" /tmp/ppl.err | head -1
  }
  echo "== llama-perplexity -c 512 --chunks 4"
  for m in /tmp/m-f16.gguf /tmp/m-q4_0.gguf; do ppl cpu $CPU $m; ppl vk-glslc2023 $VK $m; ppl vk-glslc2026 $VKNEW $m; done
  echo "== verify (F16, then Q4_0)"
  for m in ${VERIFY_MODELS:-f16 q4_0}; do for v in "vk-glslc2023 $VK" "vk-glslc2026 $VKNEW"; do set -- $v
    t0=$(date +%s)
    $RF verify $2 --model /tmp/m-$m.gguf --reference $CPU --json > /tmp/verify-$1-$m.json; echo "verify $1 $m rc=$? $(( $(date +%s) - t0 )) s"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['passed'], [{k: c.get(k) for k in ('ctx','kld_mean','top1','ppl','ppl_ref','passed')} for c in d['checks']])" /tmp/verify-$1-$m.json
  done; done
  echo "done; left $(left) s"
  exit 0
fi

# PHASE=measure
. <(sed 's/ /\n/g' /tmp/prefixes)
echo "== bench (gated), both Vulkan builds: depths 0/4096/16384, ubatch 512/2048, fa on/off"
t0=$(date +%s)
$RF bench $VK $VKNEW --model $M --reference $CPU --depth 0,4096,16384 --ubatch 512,2048 --fa on,off --reps 3 --timeout 25 --json > $OUT/bench.json; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - $OUT/bench.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for r in (rows if isinstance(rows, list) else []):
    print(r.get("prefix", "")[-24:], r.get("ubatch"), r.get("fa"), r.get("test"), r.get("n_prompt"), r.get("n_gen"), r.get("depth"), r.get("t_s"), r.get("stddev"), r.get("gate"), r.get("status"))
PY
echo "== the same pp512/tg128 at depth 0, -ub in the other order (is the first variant slower?)"
$RF bench $VKNEW --model $M --no-gate --ubatch 2048,512 --fa off --reps 3 --json | python3 -c "import json,sys; [print(r['ubatch'], r['test'], round(r['t_s']), round(r['stddev'])) for r in json.load(sys.stdin) if r.get('t_s')]"
echo "left $(left) s"
echo "== tune (both Vulkan builds are candidates)"
t0=$(date +%s)
timeout $(( $(left) - 150 )) $OLD $RF tune llama-cpp --target gfx1100 --model $M --backends vulkan --build $VKNEW --source $T --reps 3 --timeout 15 --json > $OUT/tune.json; echo "tune rc=$? $(( $(date +%s) - t0 )) s"
$RF preset show $M --shell > $OUT/preset.sh; echo "preset rc=$?"; cat $OUT/preset.sh
$RF preset show $M
$RF results plot -o $OUT/depth.html > /dev/null 2>&1; ls -la $OUT
echo "left $(left) s"
echo "== harness overhead (benchmarks/bench_measure.py: rocforge bench --no-gate against the same llama-bench argv by hand)"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_measure.py --prefix $VKNEW --model $M --rounds ${ROUNDS:-3} --fit-rounds ${FIT_ROUNDS:-0} \
  --depth 0,4096 --ubatch 512,2048 --fa on,off -p 512 -n 128 --reps 3 --json $OUT/overhead.json
$RF results export --json > $OUT/export.json 2>/dev/null
echo "done; left $(left) s"
