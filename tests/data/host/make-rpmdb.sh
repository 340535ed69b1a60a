#!/bin/sh
# Rebuild the rpm databases of this folder with the real rpm (Debian package `rpm`, 4.18):
# header-only noarch packages named and versioned as Fedora 43 ships its firmware
# (amd-gpu-firmware and linux-firmware, split in Fedora 43), installed with --justdb into a
# fresh sqlite rpmdb (the format of /usr/lib/sysimage/rpm/rpmdb.sqlite), then vacuumed and gzipped.
# Usage: sh make-rpmdb.sh 20251125   (writes rpmdb-fedora43-firmware-20251125.sqlite.gz)
set -eu
ver=$1
here=$(cd "$(dirname "$0")" && pwd)
top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
mkdir -p "$top/SPECS" "$top/db"
for name in amd-gpu-firmware linux-firmware; do
  cat > "$top/SPECS/$name.spec" <<SPEC
Name: $name
Version: $ver
Release: 1.fc43
Summary: Firmware for AMD GPUs
License: Redistributable, no modification permitted
BuildArch: noarch
URL: https://www.kernel.org/

%description
Firmware for AMD amdgpu and radeon GPUs (rocforge test fixture: header only).

%files
SPEC
  rpmbuild --quiet --define "_topdir $top" --define "_rpmdir $top/RPMS" -bb "$top/SPECS/$name.spec"
done
rpm --define "_db_backend sqlite" --dbpath "$top/db" --initdb
rpm --define "_db_backend sqlite" --dbpath "$top/db" -i --nodeps --justdb "$top"/RPMS/noarch/*.rpm
sqlite3 "$top/db/rpmdb.sqlite" "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE; VACUUM;" >/dev/null
rpm --define "_db_backend sqlite" --dbpath "$top/db" -qa
gzip -9 -c "$top/db/rpmdb.sqlite" > "$here/rpmdb-fedora43-firmware-$ver.sqlite.gz"
