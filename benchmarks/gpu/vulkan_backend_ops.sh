#!/bin/bash
# Run on the GPU machine (device tool) from a rocforge checkout, with a carried folder D (default .dev/h100) holding:
#   llama/  vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist, without .git docs models benches media
#           (keep tests/test-backend-ops.cpp)
#   debs/   apt-get -oAPT::Architecture=amd64 download glslc libshaderc1 libvulkan-dev libvulkan1
#           spirv-headers vulkan-tools libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
#           libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8
#   whl/    pip download --no-deps tomlkit platformdirs gguf (py3-none-any wheels)
# and call it with carry [D]:  bash benchmarks/gpu/vulkan_backend_ops.sh
# llama.cpp's own test-backend-ops against the rocforge-built Vulkan libraries, op by op (Vulkan0 vs CPU),
# then with GGML_VK_* switches on the ops that failed; perplexity and, if a switch fixes them, verify/bench/tune with it.
D=${D:-$PWD/.dev/h100}
T=$D/llama
START=$(date +%s)
left() { echo $(( 590 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/log.txt) 2>&1
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/vulkan_env.sh"
vulkan_unpack $D/debs; vulkan_use_sdk
python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"
echo "== host"; nproc; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uname -r; date -u
B="llama-cpp --target gfx1100 --source $T --cmake-target llama-bench --cmake-target llama-perplexity --cmake-target llama-cli -j6"
t0=$(date +%s)
$RF build $B --backend cpu > /tmp/b-cpu.log 2>&1 & P1=$!
$RF build $B --backend vulkan > /tmp/b-vk.log 2>&1 & P2=$!
g++ -O1 -std=c++17 -I$T/ggml/include -c $T/tests/test-backend-ops.cpp -o /tmp/tbo.o & P3=$!
wait $P1; r1=$?; wait $P2; r2=$?; wait $P3; r3=$?
echo "builds rc $r1 $r2 $r3: $(( $(date +%s) - t0 )) s"
[ $r1 != 0 ] && { tail -20 /tmp/b-cpu.log; exit 1; }
[ $r2 != 0 ] && { tail -20 /tmp/b-vk.log; exit 1; }
CPU=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','cpu'))")
VK=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','vulkan'))")
W=$(python3 -c "from pathlib import Path; from rocforge_build.forge.plan import work_dir; print(work_dir(Path('$CPU')))")/build
g++ /tmp/tbo.o -o /tmp/tbo -L$VK/lib -lggml -lggml-base -Wl,-rpath,$VK/lib -pthread || exit 1
(ninja -C $W -j4 llama-quantize > /tmp/q-build.log 2>&1; python3 tests/tiny_gguf.py /tmp/m-f16.gguf medium --byte-tokens --ctx 32768 && env LD_LIBRARY_PATH=$W/bin:$CPU/lib $W/bin/llama-quantize /tmp/m-f16.gguf /tmp/m-q8_0.gguf Q8_0 8 > /tmp/q.log 2>&1; echo "model rc $?" > /tmp/model.done) & PM=$!
echo "== test-backend-ops -b Vulkan0 (against the CPU backend), ops of a llama forward pass"
tbo() { # env-label then ops
  local lab=$1; shift
  for op in "$@"; do
    local to=$(( $(left) - 200 )); [ $to -gt 40 ] && to=40; [ $to -lt 5 ] && { echo "[$lab] $op skipped: out of time"; continue; }
    env $lab timeout $to /tmp/tbo -b Vulkan0 -o $op > /tmp/tbo-$op.txt 2>&1; local rc=$?
    echo "[$lab] $op rc=$rc $(grep -c 'OK' /tmp/tbo-$op.txt) OK, $(grep -c 'FAIL' /tmp/tbo-$op.txt) FAIL; $(grep 'tests passed' /tmp/tbo-$op.txt | tr -s ' ')"
    grep 'FAIL' /tmp/tbo-$op.txt | grep -v '^Backend\|backends passed' | sed 's/\x1b\[[0-9;]*m//g' | head -4
    cat /tmp/tbo-$op.txt >> $OUT/tbo-all.txt
  done
}
/tmp/tbo -l 2>/dev/null | head -3
env timeout 60 /tmp/tbo -b Vulkan0 -o ADD 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | head -12
OPS="GET_ROWS RMS_NORM MUL ADD MUL_MAT ROPE CPY SOFT_MAX SILU SCALE CONT"
tbo NONE=1 $OPS
FAILED=$(for op in $OPS; do grep -q FAIL /tmp/tbo-$op.txt && echo $op; done | tr '\n' ' ')
echo "failed ops: ${FAILED:-none}; left $(left) s"
GOOD=""
if [ -n "$FAILED" ]; then
  for e in GGML_VK_DISABLE_F16=1 GGML_VK_PREFER_HOST_MEMORY=1 GGML_VK_FORCE_MAX_ALLOCATION_SIZE=268435456; do
    tbo $e $FAILED
    if ! grep -q FAIL $(for op in $FAILED; do echo /tmp/tbo-$op.txt; done); then GOOD=$e; break; fi
  done
fi
echo "env that fixes the failed ops: ${GOOD:-none}; left $(left) s"
wait $PM; cat /tmp/model.done; ls -la /tmp/*.gguf
TXT=$(python3 -c "from rocforge_build.measure.verify import text_file; print(text_file())")  # the shipped text, unpacked
ppl() { local lab=$1 pre=$2 m=$3; shift 3
  env $lab LD_LIBRARY_PATH=$pre/lib:$LD_LIBRARY_PATH $pre/bin/llama-perplexity -m $m -f $TXT -c 512 --chunks 4 -ngl 99 "$@" > /tmp/ppl.out 2> /tmp/ppl.err; local rc=$?
  echo "PPL [$lab] $pre $(basename $m) $*: rc=$rc $(grep -ho 'Final estimate: PPL = .*' /tmp/ppl.out /tmp/ppl.err) $(grep -h '^\[1\]' /tmp/ppl.out /tmp/ppl.err | head -1)"
}
ppl NONE=1 $CPU /tmp/m-q8_0.gguf
ppl NONE=1 $VK /tmp/m-q8_0.gguf
ppl NONE=1 $VK /tmp/m-q8_0.gguf -ngl 0
ppl GGML_VK_PREFER_HOST_MEMORY=1 $VK /tmp/m-q8_0.gguf
[ -n "$GOOD" ] && ppl $GOOD $VK /tmp/m-q8_0.gguf
if [ -n "$GOOD" ]; then
  M=/tmp/m-q8_0.gguf; E="--env $GOOD"
  $RF verify $VK --model $M --reference $CPU $E --json > $OUT/verify.json; echo "verify rc=$?"; cut -c1-600 $OUT/verify.json
  if grep -q '"passed": true' $OUT/verify.json; then
    $RF bench $VK --model $M --reference $CPU --depth 0,4096,16384 --ubatch 512,2048 --fa on,off --env $GOOD --reps 3 --timeout 30 --json > $OUT/bench.json; echo "bench rc=$?"
    timeout $(( $(left) - 20 )) $RF tune llama-cpp --target gfx1100 --model $M --backends vulkan --source $T --fa off --env $GOOD --reps 3 --json > $OUT/tune.json; echo "tune rc=$?"
    $RF preset show $M --shell > $OUT/preset.sh; cat $OUT/preset.sh
  fi
fi
echo "done; left $(left) s"
