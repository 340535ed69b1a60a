#!/bin/bash
# distcc scaling on the 16-core device machine: llama.cpp (May 2025 tree) CPU backend,
# `ninja llama-bench`, local -j4 (pinned to 4 cores) vs 1, 2, 4 distccd on 127.0.0.1 pinned to
# 4 cores each. Configure is not timed; every build starts from an empty build dir.
#
# Beside this script (a folder carried to the 16-core machine): debs/ from
#   apt-get download distcc libpopt0 libavahi-client3 libavahi-common3 libavahi-common-data \
#     libdbus-1-3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1
# (unpacked into /tmp/dc, run through wrappers that set LD_LIBRARY_PATH for distcc only), and
# llama.tar.gz: vendor/llama.cpp of the llama-cpp-python 0.3.9 sdist as llama/ (without .git
# docs models tests benches media).  Writes $OUT/scale.txt.
set -u
D=$(cd "$(dirname "$0")" && pwd)
R=/tmp/dc
mkdir -p $R /tmp/src
for f in $D/debs/*.deb; do dpkg -x $f $R; done
mkdir -p /tmp/dcbin
for t in bin/distcc bin/distccd; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu" "$R/usr/$t" > /tmp/dcbin/$(basename $t)
  chmod +x /tmp/dcbin/$(basename $t)
done
export PATH=/tmp/dcbin:$PATH
distcc --version || { LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu ldd $R/usr/bin/distcc; exit 1; }
tar xzf $D/llama.tar.gz -C /tmp/src
S=/tmp/src/llama
OUTF=${OUT:-/tmp}/scale.txt
{ nproc; gcc --version | head -1; cmake --version | head -1; distcc --version | head -1; } > $OUTF 2>&1
id nobody >/dev/null 2>&1 || useradd -r nobody
conf() { rm -rf /tmp/b; cmake -S $S -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON "$@" >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log >> $OUTF; exit 1; }; }
timed() { local t0=$(date +%s%N); "$@" > /tmp/build.log 2>&1; local rc=$?; local t1=$(date +%s%N); echo "$(( (t1 - t0) / 1000000 )) ms rc=$rc"; [ $rc = 0 ] || tail -5 /tmp/build.log >&2; }
conf
echo "local -j4 (taskset 0-3): $(timed taskset -c 0-3 ninja -C /tmp/b -j4 llama-bench)" >> $OUTF
for n in 1 2 4; do
  hosts=""; pids=""
  for i in $(seq 0 $((n-1))); do
    port=$((3700+i))
    taskset -c $((4*i))-$((4*i+3)) distccd --no-detach --daemon --listen 127.0.0.1 --port $port --allow 127.0.0.1 --jobs 4 --enable-tcp-insecure --user nobody --log-file /tmp/distccd-$port.log --log-level info &
    pids="$pids $!"; hosts="$hosts 127.0.0.1:$port/4"
  done
  sleep 1; for i in $(seq 0 $((n-1))); do (echo > /dev/tcp/127.0.0.1/$((3700+i))) 2>/dev/null || { echo "distccd $i not listening" >> $OUTF; cat $OUTF; exit 1; }; done
  export DISTCC_HOSTS="$hosts" DISTCC_FALLBACK=1
  conf -DCMAKE_C_COMPILER_LAUNCHER=/tmp/dcbin/distcc -DCMAKE_CXX_COMPILER_LAUNCHER=/tmp/dcbin/distcc
  r=$(timed ninja -C /tmp/b -j $((4*n)) llama-bench)
  remote=$(cat /tmp/distccd-*.log 2>/dev/null | grep -c COMPILE_OK)
  echo "distcc $n daemon(s) x 4 cores, ninja -j $((4*n)): $r remote_compiles=$remote" >> $OUTF
  kill $pids; wait $pids 2>/dev/null; rm -f /tmp/distccd-*.log
done
cat $OUTF
