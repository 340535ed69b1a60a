#!/bin/bash
# icecream scaling on the 16-core device machine, the counterpart of benchmarks/distcc/scale.sh:
# llama.cpp (May 2025 tree) CPU backend, `ninja llama-bench` from an empty build dir, local -j4
# pinned to 4 cores vs 1, 2, 4 compile daemons (iceccd 1.4, Debian 12) pinned to 4 cores each,
# all on 127.0.0.1 with their own ports, sockets and env dirs, one icecc-scheduler; the client's
# own daemon takes no jobs (-m 0 --no-remote), so every compile goes to the pinned daemons.
# Configure is not timed.  Before each timed build, 4n parallel compiles of one file (untimed)
# let every daemon receive and unpack this machine's compiler environment (icecc-create-env);
# the table counts the compiles each daemon ran from its log ("remote compile for file").
# Last, `rocforge build llama-cpp --backend cpu --distribute --no-cache` with the 4 daemons:
# the -j rocforge chose from the scheduler and its time, beside the plain launcher's.
#
# Carried folder D (default .dev/h100): llama.tar.xz (vendor/llama.cpp of the llama-cpp-python
# 0.3.9 sdist as llama/, without .git docs models tests benches media), whl/ (tomlkit,
# platformdirs), and icecc/ from Debian 12:
#   apt-get download icecc libarchive13 libcap-ng0 liblzo2-2 libzstd1 libnettle8 libacl1 liblzma5 \
#     liblz4-1 libbz2-1.0 zlib1g libxml2 libicu72 file libmagic1 libmagic-mgc
# unpacked into /tmp/ic and run through wrappers that set LD_LIBRARY_PATH for icecream alone;
# iceccd runs /usr/bin/icecc --build-native, which runs /usr/bin/icecc-create-env: both are put
# there (the wrapper, the script) only if absent; ipr/ (iproute2 and
# its libraries, Debian 12) when the machine has no `ip`.
# Locally, for the logic only (icecc from Debian on PATH, no D/icecc): PY=<venv python> CORES=1 NS="1 2" JOBS_LOCAL=1
# TARGET=ggml-base OUT=/tmp/x D=.dev/h100 bash benchmarks/icecream/scale.sh
# Writes $OUT/icecream-scale.txt.
set -u
D=${D:-$PWD/.dev/h100}
CORES=${CORES:-4} NS=${NS:-1 2 4} TARGET=${TARGET:-llama-bench} PY=${PY:-python3}
OUTF=${OUT:-/tmp}/icecream-scale.txt
START=$(date +%s)
: > "$OUTF"
say() { echo "$*" | tee -a "$OUTF"; }
R=/tmp/ic
if [ -d "$D/icecc" ]; then
  mkdir -p $R /tmp/icbin
  # file + libmagic apart: Debian 12's libmagic on icecream's library path would break the host's
  # own `file` (magic version 544 vs 545), which icecc-create-env runs on every binary it packs
  for f in "$D"/icecc/*.deb; do
    case "$(basename "$f")" in file_*|libmagic*) dpkg -x "$f" /tmp/icfile ;; *) dpkg -x "$f" $R ;; esac
  done
  LIBS=$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu
  for t in usr/bin/icecc usr/sbin/iceccd usr/sbin/icecc-scheduler; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBS" "$R/$t" > /tmp/icbin/$(basename $t)
  done
  if ! command -v file >/dev/null; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s MAGIC=%s exec %s "$@"\n' /tmp/icfile/usr/lib/x86_64-linux-gnu \
      /tmp/icfile/usr/lib/file/magic.mgc /tmp/icfile/usr/bin/file > /tmp/icbin/file
  fi
  chmod +x /tmp/icbin/*
  [ -e /usr/bin/icecc-create-env ] || cp $R/usr/bin/icecc-create-env /usr/bin/
  [ -e /usr/bin/icecc ] || cp /tmp/icbin/icecc /usr/bin/icecc  # iceccd runs `/usr/bin/icecc --build-native`
  export PATH=/tmp/icbin:$PATH
fi
if ! command -v ip >/dev/null && [ -d "$D/ipr" ]; then  # iproute2 from Debian 12, for `ip netns`
  mkdir -p /tmp/ipr /tmp/icbin; for f in "$D"/ipr/*.deb; do dpkg -x "$f" /tmp/ipr; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' \
    "/tmp/ipr/usr/lib/x86_64-linux-gnu:/tmp/ipr/lib/x86_64-linux-gnu" /tmp/ipr/bin/ip > /tmp/icbin/ip
  chmod +x /tmp/icbin/ip; export PATH=/tmp/icbin:$PATH
fi
ICECC=$(command -v icecc) || { say "no icecc"; exit 1; }
id icecc >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin icecc
B=/tmp/icbase; rm -rf $B; mkdir -p $B; chown icecc: $B  # iceccd drops to icecc before it mkdirs
mkdir -p /tmp/src; [ -d /tmp/src/llama ] || tar -xJf "$D/llama.tar.xz" -C /tmp/src
S=/tmp/src/llama
{ nproc; gcc --version | head -1; cmake --version | head -1; iceccd --help 2>&1 | head -1
  echo "icecc $(icecc --version 2>&1 | head -1)"; uptime; } >> "$OUTF" 2>&1
conf() { rm -rf "$1"; cmake -S $S -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON "${@:2}" > /tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log >> "$OUTF"; exit 1; }; }
timed() { local t0=$(date +%s%N); "$@" > /tmp/build.log 2>&1; local rc=$?; local t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000000 )) ms rc=$rc"; [ $rc = 0 ] || tail -15 /tmp/build.log >> "$OUTF"; }
last=$(( ${NS##* } * CORES - 1 ))

conf /tmp/b
[ -n "${SKIP_LOCAL:-}" ] || say "local -j${JOBS_LOCAL:-$CORES} (taskset 0-$((CORES - 1))): $(timed taskset -c 0-$((CORES - 1)) ninja -C /tmp/b -j ${JOBS_LOCAL:-$CORES} $TARGET)"

# each compile daemon is another host: a network namespace joined by a veth pair (10.214.(100+i).2),
# since icecc treats a daemon the scheduler knows as 127.0.0.1 as the client's own machine
for i in $(seq 0 $(( ${NS##* } - 1 ))); do
  ns=rfic$i; ip netns del $ns 2>/dev/null; ip link del rficv$i 2>/dev/null
  ip netns add $ns && ip link add rficv$i type veth peer name rficp$i && ip link set rficp$i netns $ns &&
  ip addr add 10.214.$((100 + i)).1/24 dev rficv$i && ip link set rficv$i up &&
  ip netns exec $ns ip addr add 10.214.$((100 + i)).2/24 dev rficp$i &&
  ip netns exec $ns ip link set rficp$i up && ip netns exec $ns ip link set lo up ||
  { say "network namespace $ns: could not be made"; exit 1; }
done
SPORT=8765
icecc-scheduler -p $SPORT -n rfscale -l $B/scheduler.log -vv & SCHED=$!
listcs() { exec 3<>/dev/tcp/127.0.0.1/$((SPORT + 1)) && printf 'listcs\nquit\n' >&3 && timeout 3 cat <&3; exec 3<&-; }
sleep 1
printf '#include <regex>\n#include <map>\n#include <string>\nint f(const std::string& s){std::map<std::string,int> m; m[s]=1; return std::regex_match(s, std::regex("a+b")) + m.size();}\n' > /tmp/warm.cpp
for n in $NS; do
  pids=""
  for i in $(seq 0 $((n - 1))); do
    taskset -c $((CORES * i))-$((CORES * i + CORES - 1)) env ICECC_TEST_SOCKET=$B/d$i.sock \
      ip netns exec rfic$i iceccd -s 10.214.$((100 + i)).1:$SPORT -n rfscale -m $CORES -N node$i \
      -b $B/env$i -l $B/d$i.log -vvv &
    pids="$pids $!"
  done
  ICECC_TEST_SOCKET=$B/client.sock iceccd -s 127.0.0.1:$SPORT -n rfscale -m 0 --no-remote -N client \
    -b $B/envc -l $B/client.log -vv & pids="$pids $!"
  export ICECC_TEST_SOCKET=$B/client.sock
  for t in $(seq 1 40); do [ "$(listcs | grep -c '^ ')" -ge $((n + 1)) ] && break; sleep 0.5; done
  listcs | grep '^ ' >> "$OUTF"
  warm=""; for k in $(seq 1 $((n * CORES))); do
    ICECC_DEBUG=debug ICECC_LOGFILE=$B/warm$n-$k.log icecc g++ -O2 -c /tmp/warm.cpp -o /tmp/warm$k.o & warm="$warm $!"; done
  for p in $warm; do wait $p; done
  nwarm=0; for i in $(seq 0 $((n - 1))); do nwarm=$((nwarm + $(grep -c "remote compile for file" $B/d$i.log))); done
  if [ $nwarm = 0 ]; then  # nothing went out: say why (the client's debug log of one warm-up compile)
    say "warm-up: no compile reached a daemon; client log of one:"; tail -40 $B/warm$n-1.log | tee -a "$OUTF"
    say "daemon 0 log:"; tail -40 $B/d0.log | tee -a "$OUTF"; say "client daemon log:"; tail -30 $B/client.log | tee -a "$OUTF"
  fi
  for i in $(seq 0 $((n - 1))); do cp $B/d$i.log $B/d$i.warm; done
  conf /tmp/b -DCMAKE_C_COMPILER_LAUNCHER=$ICECC -DCMAKE_CXX_COMPILER_LAUNCHER=$ICECC
  r=$(timed ninja -C /tmp/b -j $((CORES * n)) $TARGET)
  per=""; for i in $(seq 0 $((n - 1))); do
    c=$(( $(grep -c "remote compile for file" $B/d$i.log) - $(grep -c "remote compile for file" $B/d$i.warm) )); per="$per $c"; done
  say "icecream $n daemon(s) x $CORES cores, ninja -j $((CORES * n)): $r compiles per daemon:$per"
  if [ "$n" = "${NS##* }" ]; then
    [ -d "$D/whl" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$D"/whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site ROCFORGE_CONFIG_DIR=/tmp/rfcfg ROCFORGE_CACHE_DIR=/tmp/rfc ROCFORGE_DATA_DIR=/tmp/rfd
    $PY -m rocforge_build config set build.icecc_scheduler 127.0.0.1:$SPORT >/dev/null
    RF="$PY -m rocforge_build build llama-cpp --target gfx1100 --backend cpu --source $S --no-cache --distribute --cmake-target $TARGET --prefix /tmp/rfprefix"
    $RF --dry-run > /tmp/rfplan.txt 2>&1; grep -E "^(jobs|cache|distribute)|icecream|local iceccd" /tmp/rfplan.txt | tee -a "$OUTF"
    for i in $(seq 0 $((n - 1))); do cp $B/d$i.log $B/d$i.warm; done
    say "rocforge --distribute, $n daemon(s): $(timed $RF --force)"
    grep -E "installed|hit|distribut" /tmp/build.log | tail -3 >> "$OUTF"
    per=""; for i in $(seq 0 $((n - 1))); do
      c=$(( $(grep -c "remote compile for file" $B/d$i.log) - $(grep -c "remote compile for file" $B/d$i.warm) )); per="$per $c"; done
    say "  compiles per daemon:$per"
  fi
  unset ICECC_TEST_SOCKET
  kill $pids 2>/dev/null; for p in $pids; do wait $p 2>/dev/null; done; rm -rf $B/env* $B/*.sock
  say "elapsed $(( $(date +%s) - START )) s"
done
kill $SCHED; wait $SCHED 2>/dev/null
for i in $(seq 0 $(( ${NS##* } - 1 ))); do ip netns del rfic$i; done
[ -n "${OUT:-}" ] && tar -czf "$OUT/icecream-logs.tar.gz" -C $B --exclude="./env*" . 2>/dev/null
cat "$OUTF"
