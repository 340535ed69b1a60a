#!/bin/bash
# rocforge serve on the GPU machine (device tool: an NVIDIA H100 or H200, no ROCm): today's llama.cpp built for
# Vulkan, served with -np 4 by `rocforge serve`, canaried against the CPU build, answering the official
# `openai` client, and throughput with and without the front's --canary-every
# (benchmarks/gpu/serve_canary_driver.py does the serving and measuring; docs/measurements/serve-canary.md
# holds the figures).  Run from the checkout's root, in phases, back to back on ONE warm machine (it is
# given back ~30 s after a call), each phase well under the 600 s limit of one command:
#   PHASE=build bash benchmarks/gpu/vulkan_serve_canary.sh
#       carry [.dev/serve-h100/debs, .dev/serve-h100/debsid, .dev/serve-h100/whl,
#              .dev/serve-h100/llama.tar.xz, .dev/serve-h100/model1]
#       unpacks the packages, installs the wheels into /tmp/site, builds CPU (the canary's reference) and
#       Vulkan (sid's glslc) llama-server + llama-perplexity through rocforge, keeps the model's part 1
#   PHASE=part bash benchmarks/gpu/vulkan_serve_canary.sh      carry [.dev/serve-h100/model2]
#       keeps part 2; prints the GPU as nvidia-smi and the Vulkan build's llama-server see it
#   PHASE=serve PARTS=start,openai bash benchmarks/gpu/vulkan_serve_canary.sh
#       carry [.dev/serve-h100/model3]: joins the model in /tmp (sha256 checked), runs the driver
#       (PARTS: any of start, openai, front; verify at the preset's shape first, every time)
#   PHASE=serve PARTS=front WINDOW=30 ROUNDS=3 bash benchmarks/gpu/vulkan_serve_canary.sh
#       (no carry: the model is in /tmp already) the throughput windows, ~7 minutes.  SERVER_ARGS adds
#       words to the preset's llama-server command: SERVER_ARGS="--cache-ram 0" is the run the
#       2026-11-27 page asks for (its server stalled 20-60 s saving slots to the host prompt cache)
# Each call's $OUT gets log-PHASE.txt, serve-canary-PARTS.json and serve-logs-PARTS.tar.xz (every
# serve's stderr: rocforge's lines and llama-server's own).
# The carried folder D (default .dev/serve-h100) holds:
#   llama.tar.xz  llama.cpp/ = vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (Oct 2026), without
#                 .git docs models media tests benches .github and the unused ggml backends
#   debsid/       Debian sid: glslc libshaderc1 (2026.4) libvulkan-dev libvulkan1 (1.4.363) spirv-headers,
#                 downloaded through a temporary apt config (own sources list, lists and cache dirs,
#                 -oAPT::Architecture=amd64); every one unpacked into /tmp/vksid, libvulkan1 also into /
#   debs/         Debian 12: libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 libx11-6 libxcb1 libxau6
#                 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8 (what the NVIDIA ICD loads), unpacked
#                 into /tmp/vkrt; a library / lacks is copied there (never one that / has)
#   whl/          pip download --no-deps --only-binary=:all: --python-version 3.12: tomlkit platformdirs rich
#                 gguf, and openai with what it requires (httpx2 httpcore2 truststore anyio sniffio h11 idna
#                 certifi distro jiter pydantic pydantic-core typing-extensions typing-inspection
#                 annotated-types tqdm; httpx httpcore too)
#   model1/ model2/ model3/  SmolLM2-135M-Instruct Q4_1 (tests/trained_model.py smollm2(), 98 MB) as xz
#                 (90 MB), split in parts of 20.5, 35 and 35 MB (the device tool refused a call of ~55 MiB
#                 by the files' own sizes: leave room under its 64 MiB); each folder has the .gguf's sha256
D=${D:-$PWD/.dev/serve-h100}
PHASE=${PHASE:-build}
START=$(date +%s)
left() { echo $(( 580 - ($(date +%s) - START) )); }
mkdir -p "${OUT:?OUT must name a folder for the results}"
exec > >(tee -a "$OUT/log-$PHASE.txt") 2>&1
export PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONPATH=$PWD:/tmp/site
export ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd ROCFORGE_CONFIG_DIR=/tmp/rfcfg
RF="python3 -m rocforge_build"
SID="env VULKAN_SDK=/tmp/vksid/usr LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu PATH=/tmp/vksid/usr/bin:$PATH"
T=/tmp/llama/llama.cpp
M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/model
for d in "$D"/model*/; do [ -d "$d" ] && cp "$d"* /tmp/model/; done  # the model's parts carried by this call
ls /tmp/model

if [ "$PHASE" = build ]; then
  mkdir -p /tmp/vksid /tmp/vkrt /tmp/llama /tmp/model
  for f in "$D"/debsid/*.deb; do dpkg -x "$f" /tmp/vksid; done
  dpkg -x "$D"/debsid/libvulkan1_*.deb /
  for f in "$D"/debs/*.deb; do dpkg -x "$f" /tmp/vkrt; done
  for f in /tmp/vkrt/usr/lib/x86_64-linux-gnu/*.so*; do
    [ -e "/usr/lib/x86_64-linux-gnu/$(basename "$f")" ] || cp -a "$f" /usr/lib/x86_64-linux-gnu/
  done
  ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl || exit 1
  python3 -m compileall -q rocforge_build /tmp/site > /dev/null
  tar -C /tmp/llama -xJf "$D/llama.tar.xz" || exit 1
  echo "== host"; nproc; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r; grep PRETTY /etc/os-release; python3 --version; date -u
  $SID glslc --version | head -1
  python3 -c "import openai, pydantic, httpx2; print('openai', openai.__version__, 'pydantic', pydantic.VERSION)"
  B="llama-cpp --target gfx1100 --source $T --cmake-target llama-server --cmake-target llama-perplexity"
  t0=$(date +%s)
  $RF build $B --backend cpu -j 5 > /tmp/b-cpu.log 2>&1 & P1=$!
  $SID $RF build $B --backend vulkan -j 11 > /tmp/b-vk.log 2>&1 & P2=$!
  wait $P1; r1=$?; wait $P2; r2=$?
  echo "builds: cpu rc=$r1 vulkan rc=$r2, $(( $(date +%s) - t0 )) s (in parallel, 16 cores)"
  for f in /tmp/b-cpu.log /tmp/b-vk.log; do echo "-- $f"; grep -iE "patch|error|fail" "$f" | head -8; tail -n 3 "$f"; done
  [ $r1 = 0 ] && [ $r2 = 0 ] || exit 1
  echo "done; left $(left) s"
  exit 0
fi

# the prefixes the builds said they installed into
CPU=$(sed -n 's/^installed \(.*\) in [0-9.]*s (manifest.*/\1/p' /tmp/b-cpu.log 2>/dev/null)
VK=$(sed -n 's/^installed \(.*\) in [0-9.]*s (manifest.*/\1/p' /tmp/b-vk.log 2>/dev/null)
[ -d "$CPU" ] && [ -d "$VK" ] || { echo "no builds in /tmp: run PHASE=build on this machine first"; exit 1; }
echo "CPU=$CPU VK=$VK"
if [ "$PHASE" = part ]; then  # a call that only brings a part of the model: the devices, seen by each build
  nvidia-smi; $SID "$VK/bin/llama-server" --version 2>&1 | tail -2
  $SID "$VK/bin/llama-server" --list-devices 2>&1 | tail -4
  exit 0
fi

# PHASE=serve: the model joined, then the driver
if [ ! -f "$M" ]; then
  ls /tmp/model/smollm2.gguf.xz.part1 /tmp/model/smollm2.gguf.xz.part2 /tmp/model/smollm2.gguf.xz.part3 || exit 1
  cat /tmp/model/smollm2.gguf.xz.part[123] | xz -d -T0 > "$M.part" || exit 1
  [ "$(sha256sum < "$M.part" | cut -d' ' -f1)" = "$(cat /tmp/model/sha256)" ] || { echo "model sha256 differs"; exit 1; }
  mv "$M.part" "$M"; rm -f /tmp/model/smollm2.gguf.xz.part*
fi
echo "model $(sha256sum "$M")"
# the Vulkan build's programs find sid's loader (the one in / as well); the CPU build needs nothing
export LD_LIBRARY_PATH=/tmp/vksid/usr/lib/x86_64-linux-gnu
PARTS=${PARTS:-start,openai,front}
NAME=$(echo "$PARTS" | tr ',' '-')
timeout $(( $(left) - 15 )) python3 benchmarks/gpu/serve_canary_driver.py --cpu "$CPU" --vulkan "$VK" --model "$M" \
  --parts "$PARTS" --seconds "${WINDOW:-30}" --rounds "${ROUNDS:-3}" --threads "${THREADS:-8}" \
  $(for w in ${SERVER_ARGS:-}; do echo "--server-arg=$w"; done) \
  --logs /tmp/serve-logs-$NAME --json "$OUT/serve-canary-$NAME.json"
echo "driver rc=$?; left $(left) s"
tar -C /tmp -cJf "$OUT/serve-logs-$NAME.tar.xz" serve-logs-$NAME
