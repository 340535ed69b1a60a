#!/bin/sh
# Regenerate the kernel-directory file lists of Debian sid's rocBLAS and hipBLASLt packages
# (the names and sizes the bundle trimming is tested with).  Runs apt with a temporary config
# directory: the host's /etc/apt is never touched, only the .deb files are downloaded.
#   tests/data/kernel-dirs/fetch.sh [PACKAGE...]   (default: librocblas4 libhipblaslt1)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=${*:-librocblas4 libhipblaslt1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/etc/sources.list.d" "$tmp/etc/preferences.d" "$tmp/state/lists/partial" \
         "$tmp/cache/archives/partial" "$tmp/debs"
cat > "$tmp/etc/sources.list.d/sid.sources" <<SRC
Types: deb
URIs: $mirror
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
: > "$tmp/status"
set -- -o Dir::Etc="$tmp/etc" -o Dir::Etc::sourcelist=/dev/null -o Dir::State="$tmp/state" \
       -o Dir::State::status="$tmp/status" -o Dir::Cache="$tmp/cache" \
       -o Acquire::Check-Valid-Until=false -o APT::Architecture=amd64 -o APT::Sandbox::User=root
apt-get "$@" -q update >/dev/null
cd "$tmp/debs"
for p in $pkgs; do
    apt-get "$@" -q download "$p" >/dev/null
    deb=$(ls "$tmp"/debs/"${p}"_*.deb)
    out="$here/$p.txt"
    {
        echo "# $(basename "$deb"): dpkg-deb -c (size path) of Debian sid, made by fetch.sh on $(date -u +%Y-%m-%d)"
        dpkg-deb -c "$deb" | awk '$1 ~ /^-/ {sub(/^\.\//, "", $6); print $3, $6}'
    } > "$out"
    echo "$out: $(($(wc -l < "$out") - 1)) files"
done
