#!/bin/bash
# Issue 22 item 8: the default `rocforge tune` side by side with `rocforge tune --exhaustive` on the
# GPU machine (device tool: an NVIDIA H100, no ROCm), llama.cpp's Vulkan backend, a 0.5 B random
# llama (tests/tiny_gguf.py medium, training context 8192).  Goal: the default tune's pick per range
# within 2 % of the pooled best, in at most a third of the exhaustive search's wall time.
# Calls on one warm machine (each started within the machine's 30-s warm window of the last):
#   PHASE=build bash benchmarks/gpu/tune_vs_exhaustive.sh       carry .dev-h100/{debs,whl,rf,llama.tar.xz}
#       unpack, build cpu (the verify reference) and vulkan, write the model, then one default tune
#       to warm the caches (the verify gate's row in the results store, the CPU reference bases in
#       the cache): timed and kept, but not one of the pairs
#   PAIRS="1 2" PHASE=pairs bash benchmarks/gpu/tune_vs_exhaustive.sh     (no carry needed)
#   PAIRS="3" PHASE=pairs bash benchmarks/gpu/tune_vs_exhaustive.sh  ... (a pair starts only when
#       the time the last pair took is still left in the call's 10 minutes)
#   PHASE=report bash benchmarks/gpu/tune_vs_exhaustive.sh            export + benchmarks/tune_pairs.py
# Odd pairs run the default tune first, even pairs the exhaustive one.
# Measured 2026-11-26 (RESULTS-tune.md): MODEL_CTX=4096 GATE_CTX=512 on every phase, PAIRS="1 2 3 4"
# in one call (~8 min); the build phase with its cold warm-up tune took ~3 min.
# The carried folder D (default .dev-h100) holds llama.tar.xz (vendor/llama.cpp of the
# llama-cpp-python 0.3.9 sdist, May 2025, trimmed), debs/ (see vulkan_env.sh), whl/ (tomlkit
# platformdirs gguf; numpy is on the machine) and rf/ (the rocforge to run: a copy of
# rocforge_build, recipes, patches, containers).
D=${D:-$PWD/.dev-h100}
HERE=$(cd "$(dirname "$0")" && pwd)
START=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/log-${PHASE:-build}.txt) 2>&1
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/rfcode:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
RF="python3 -m rocforge_build"   # run from /tmp: the carried rocforge, not the checkout's
VKENV="env VULKAN_SDK=/tmp/vk/usr LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu PATH=/tmp/vk/usr/bin:$PATH"
T=/tmp/llama/llama.cpp
B="--target gfx1100 --source $T --cmake-target llama-perplexity --cmake-target llama-bench --cmake-target llama-cli --cmake-target llama-server"
M=/tmp/m.gguf
TB=/tmp/tb   # tune JSONs and times.tsv: survive between calls on a warm machine
# One candidate: --backends vulkan builds (here: reuses) the vulkan build; naming the same prefix
# again with --build would make it a second candidate and measure every variant twice.
# MODEL_CTX: the model's training context (the long range's ctx; its depth is that less -p and -n).
# GATE_CTX: the verify gate's contexts (tune --ctx); the winners are verified at their own shapes
# regardless.  Both only bound what the cold caches cost (the CPU reference runs), not the pairs.
MODEL_CTX=${MODEL_CTX:-8192}
TUNE="tune llama-cpp --target gfx1100 --model $M --backends vulkan --source $T --reps 3 --timeout ${TUNE_TIMEOUT:-15} --json ${GATE_CTX:+--ctx $GATE_CTX}"

one_tune() {  # LABEL EXTRA...: one timed tune, its JSON in $TB/LABEL.json, a line in times.tsv
  local lab=$1; shift
  local t0 t1 rc
  [ $(left) -gt 60 ] || { echo "tune $lab not started: $(left) s left"; return 1; }
  t0=$(date +%s.%N)
  (cd /tmp && timeout $(( $(left) - 20 )) $VKENV $RF $TUNE "$@" > $TB/$lab.json 2> $TB/$lab.err); rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\t%s\n' "$lab" "$rc" "$t0" "$t1" "$(python3 -c "print(round($t1 - $t0, 1))")" >> $TB/times.tsv
  echo "tune $lab $*: rc=$rc $(python3 -c "print(round($t1 - $t0, 1))") s; left $(left) s"
  [ $rc = 0 ] || tail -n 3 $TB/$lab.err
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print('  ', n, r['variant_label'], round(r['score'], 1), r.get('settled')) for n, r in d['preset']['ranges'].items()]" $TB/$lab.json 2>/dev/null
}

if [ "${PHASE:-build}" = build ]; then
  mkdir -p /tmp/llama /tmp/builds $TB
  . "$HERE/vulkan_env.sh"; vulkan_unpack $D/debs
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
  tar -C /tmp/llama -xJf $D/llama.tar.xz
  rm -rf /tmp/rfcode && cp -r $D/rf /tmp/rfcode
  echo "== host"; nproc; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; date -u
  python3 tests/tiny_gguf.py $M medium --byte-tokens --ctx $MODEL_CTX || exit 1
  ls -la $M
  cd /tmp
  t0=$(date +%s)
  $RF build llama-cpp $B --backend cpu -j8 > /tmp/b-cpu.log 2>&1 & P1=$!
  $VKENV $RF build llama-cpp $B --backend vulkan -j8 > /tmp/b-vk.log 2>&1 & P2=$!
  wait $P1; r1=$?; wait $P2; r2=$?
  echo "builds: cpu rc=$r1 vulkan rc=$r2, $(( $(date +%s) - t0 )) s"
  tail -n 2 /tmp/b-cpu.log /tmp/b-vk.log
  [ $r1 = 0 ] && [ $r2 = 0 ] || exit 1
  cd "$OLDPWD"
  echo "== warm-up: one default tune (fills the verify gate's store row and the reference cache)"
  one_tune warm
  exit 0
fi

if [ "$PHASE" = pairs ]; then
  last=0
  for i in ${PAIRS:-1 2 3}; do
    if [ $last -gt 0 ] && [ $(left) -lt $(( last + last / 5 )) ]; then
      echo "pair $i not started: $(left) s left, the last pair took $last s"; break
    fi
    p0=$(date +%s)
    if [ $((i % 2)) = 1 ]; then one_tune p$i-default; one_tune p$i-exhaustive --exhaustive
    else one_tune p$i-exhaustive --exhaustive; one_tune p$i-default; fi
    last=$(( $(date +%s) - p0 ))
  done
  cat $TB/times.tsv
  exit 0
fi

# PHASE=report
(cd /tmp && $RF results export --json > $TB/export.json && $RF results list --json > $TB/runs.json)
python3 $HERE/../tune_pairs.py $TB --json $OUT/pairs.json | tee $OUT/pairs.md
tar -C /tmp -czf $OUT/tb.tar.gz tb
