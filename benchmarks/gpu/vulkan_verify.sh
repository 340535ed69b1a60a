#!/bin/bash
# Run on the GPU machine (device tool) from a rocforge checkout, with a carried folder D (default .dev/h100) holding:
#   llama/  vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist, without .git docs models benches media
#           (tests/ may go too)
#   debs/   apt-get -oAPT::Architecture=amd64 download glslc libshaderc1 libvulkan-dev libvulkan1
#           spirv-headers vulkan-tools libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
#           libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8
#   whl/    pip download --no-deps tomlkit platformdirs gguf (py3-none-any wheels)
# and call it with carry [D]:  bash benchmarks/gpu/vulkan_verify.sh
# ONLY=overhead: the builds, the models, then only the harness overhead (benchmarks/bench_measure.py)
# in full: MATRIX (its options; default below), ROUNDS (5), FIT_ROUNDS (3).
# Vulkan and CPU builds through rocforge; llama-perplexity CPU vs Vulkan on a random 0.5 B llama in F16,
# Q8_0 and Q4_0; rocforge verify on Q8_0 and Q4_0; then gated bench, tune, preset; the harness overhead.
D=${D:-$PWD/.dev/h100}
T=$D/llama
START=$(date +%s)
left() { echo $(( 590 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/log.txt) 2>&1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/vk
for f in $D/debs/*.deb; do dpkg -x $f /tmp/vk; done
for p in libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8; do dpkg -x $D/debs/${p}_*.deb /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu
export VULKAN_SDK=/tmp/vk/usr PATH=$PATH:/tmp/vk/usr/bin
python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"
echo "== host"; nproc; nvidia-smi -L; git log --oneline -1 2>/dev/null; date -u
B="llama-cpp --target gfx1100 --source $T --build-target llama-bench --build-target llama-perplexity --build-target llama-cli -j8"
t0=$(date +%s)
$RF build $B --backend cpu > /tmp/b-cpu.log 2>&1 & P1=$!
$RF build $B --backend vulkan > /tmp/b-vk.log 2>&1 & P2=$!
wait $P1; r1=$?; wait $P2; r2=$?
tail -n 3 /tmp/b-cpu.log /tmp/b-vk.log
if [ $r1 != 0 ]; then echo "cpu build failed ($r1), again alone"; $RF build ${B/-j8/-j16} --backend cpu 2>&1 | tail -20 || exit 1; fi
if [ $r2 != 0 ]; then echo "vulkan build failed ($r2), again alone"; $RF build ${B/-j8/-j16} --backend vulkan 2>&1 | tail -20 || exit 1; fi
echo "builds: $(( $(date +%s) - t0 )) s"
CPU=$(python3 -c "from rocforge_build.build.plan import default_prefix as d; print(d('llama-cpp','gfx1100','cpu'))")
VK=$(python3 -c "from rocforge_build.build.plan import default_prefix as d; print(d('llama-cpp','gfx1100','vulkan'))")
W=$(python3 -c "from pathlib import Path; from rocforge_build.build.plan import work_dir; print(work_dir(Path('$CPU')))")/build
echo "CPU=$CPU VK=$VK W=$W"; ls $CPU/bin $VK/bin
ninja -C $W -j16 llama-quantize > /tmp/q-build.log 2>&1 && Q="env LD_LIBRARY_PATH=$W/bin:$CPU/lib:$LD_LIBRARY_PATH $W/bin/llama-quantize"
if [ -z "$Q" ]; then tail -5 /tmp/q-build.log; $RF build $B --backend cpu --build-target llama-quantize --prefix /tmp/cpuq 2>&1 | tail -3; Q=/tmp/cpuq/bin/llama-quantize; fi
echo "== models"
python3 tests/tiny_gguf.py /tmp/m-f16.gguf medium --byte-tokens --ctx 32768 || exit 1
python3 tests/tiny_gguf.py /tmp/s-f16.gguf small --byte-tokens --ctx 32768
for q in Q8_0 Q4_0; do $Q /tmp/m-f16.gguf /tmp/m-${q,,}.gguf $q 16 > /tmp/q-$q.log 2>&1 || tail -5 /tmp/q-$q.log; done
ls -la /tmp/*.gguf; echo "left $(left) s"
if [ "$ONLY" != overhead ]; then
TXT=rocforge_build/data/verify-text.txt
ppl() { # label prefix model extra...
  local lab=$1 pre=$2 m=$3; shift 3
  env LD_LIBRARY_PATH=$pre/lib:$LD_LIBRARY_PATH $pre/bin/llama-perplexity -m $m -f $TXT -c 512 --chunks 4 -ngl 99 "$@" > /tmp/ppl.out 2> /tmp/ppl.err; local rc=$?
  echo "PPL $lab $(basename $m) $*: rc=$rc $(grep -ho 'Final estimate: PPL = .*' /tmp/ppl.out /tmp/ppl.err)"
}
echo "== llama-perplexity -c 512 --chunks 4 (fa off)"
for m in /tmp/m-f16.gguf /tmp/m-q8_0.gguf /tmp/m-q4_0.gguf /tmp/s-f16.gguf; do ppl cpu $CPU $m; ppl vulkan $VK $m; done
grep -h "ggml_vulkan: 0" /tmp/ppl.err | head -2
ppl vulkan $VK /tmp/m-f16.gguf -ctk f32 -ctv f32
ppl vulkan $VK /tmp/m-q8_0.gguf -ctk f32 -ctv f32
ppl vulkan $VK /tmp/m-f16.gguf -ngl 0
ppl vulkan-fa $VK /tmp/m-q8_0.gguf -fa
echo "left $(left) s"
echo "== verify (fa on, the default) on Q8_0 and Q4_0"
for q in q8_0 q4_0; do
  $RF verify $VK --model /tmp/m-$q.gguf --reference $CPU --json > $OUT/verify-$q.json; echo "verify $q rc=$?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['passed'], [{k: c.get(k) for k in ('ctx','kld_mean','top1','ppl','ppl_ref','passed')} for c in d['checks']])" $OUT/verify-$q.json
done
M=$(for q in q8_0 q4_0; do python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['passed'] else 1)" $OUT/verify-$q.json && { echo /tmp/m-$q.gguf; break; }; done)
echo "model for bench: ${M:-none}; left $(left) s"
[ -z "$M" ] && M=/tmp/m-q4_0.gguf
echo "== bench (gated)"
t0=$(date +%s)
$RF bench $VK --model $M --reference $CPU --depth 0,4096,16384 --ubatch 512,2048 --fa on,off --reps 3 --timeout 30 --json > $OUT/bench.json; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - $OUT/bench.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for r in (rows if isinstance(rows, list) else []):
    print(r.get("ubatch"), r.get("fa"), r.get("test"), r.get("n_prompt"), r.get("n_gen"), r.get("depth"), r.get("t_s"), r.get("stddev"), r.get("gate"), r.get("status"))
PY
echo "left $(left) s"
echo "== tune (fa off: fa on has no GPU kernel here and times out at depth, see bench)"
t0=$(date +%s)
timeout $(( $(left) - 60 )) $RF tune llama-cpp --target gfx1100 --model $M --backends vulkan --source $T --fa off --reps 3 --json > $OUT/tune.json; echo "tune rc=$? $(( $(date +%s) - t0 )) s"
$RF preset show $M --shell > $OUT/preset.sh; echo "preset rc=$?"; cat $OUT/preset.sh
$RF preset show $M
echo "left $(left) s"
fi
echo "== overhead"
# fa off: this tree's Vulkan backend has no flash-attention kernel here (see bench above)
[ "$ONLY" = overhead ] && { M=/tmp/m-q4_0.gguf; [ -f $M ] || M=/tmp/m-f16.gguf; R=${ROUNDS:-5}; F=${FIT_ROUNDS:-3}; } || { R=3; F=0; }
timeout $(( $(left) - 5 )) python3 benchmarks/bench_measure.py --prefix $VK --model $M --rounds $R --fit-rounds $F \
  ${MATRIX:---depth 0,4096 --ubatch 512,2048 --fa off -p 512 -n 128 --reps 3} --json $OUT/overhead.json
$RF results export --json > $OUT/export.json 2>/dev/null
echo "done; left $(left) s"
