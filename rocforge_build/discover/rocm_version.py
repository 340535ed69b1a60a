"""The version of a ROCm install, from the sources its layout names in `data/layouts.toml`
(`version_from`: the directory name, rocforge-install.toml, .info/version, rocm_version.h,
hip_version.h, a pip dist-info, dpkg's status), and the order of versions.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
import re

from rocforge_build.discover.layouts import Layout
from rocforge_build.discover.watched_reads import glob, read
from rocforge_build.rootfs import Root, inner_join
from rocforge_build.toml_subset import tomllib_loads

_VERSION_RE = re.compile(r"\d+\.\d+(?:\.\d+)?(?:(?:a|rc|\.dev)\d*(?:\+[0-9a-f]+)?)?")


def _v_install_toml(root: Root, base: str) -> str | None:
    text = read(root, inner_join(base, "rocforge-install.toml"))
    if text is None:
        return None
    data = tomllib_loads(text)
    if data is None:
        return None
    value = data.get("version")
    return str(value) if value else None


def _v_info_version(root: Root, base: str) -> str | None:
    text = read(root, inner_join(base, ".info/version"))
    if not text:
        return None
    m = _VERSION_RE.search(text)
    return m.group(0) if m else None


def _v_header(root: Root, base: str, names, prefix: str) -> str | None:
    for name in names:
        text = read(root, inner_join(base, name))
        if not text:
            continue
        parts = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            m = re.search(rf"#define\s+{prefix}_VERSION_{part}\s+(\d+)", text)
            if not m:
                break
            parts.append(m.group(1))
        if len(parts) >= 2:
            if prefix == "HIP" and len(parts) == 3 and len(parts[2]) > 3:
                parts = parts[:2]  # HIP_VERSION_PATCH is a build number, not a ROCm patch level
            return ".".join(parts)
    return None


def _v_rocm_version_h(root: Root, base: str) -> str | None:
    return _v_header(root, base, ("include/rocm-core/rocm_version.h", "include/rocm_version.h"), "ROCM")


def _v_hip_version_h(root: Root, base: str) -> str | None:
    return _v_header(root, base, ("include/hip/hip_version.h",), "HIP")


def _v_dpkg(package: str):
    def reader(root: Root, base: str) -> str | None:
        text = read(root, "/var/lib/dpkg/status", limit=64 << 20)
        if not text:
            return None
        # `package` is a regular expression over package names (libamdhip64-[0-9]+).
        m = re.search(rf"^Package: (?:{package})\n(?:(?!\n\n).)*?^Status: install ok installed\n"
                      rf"(?:(?!\n\n).)*?^Version: (?:\d+:)?(\d[\d.]*)", text, re.M | re.S)
        return m.group(1) if m else None
    return reader


def _v_dist_info_metadata(root: Root, base: str) -> str | None:
    site = os.path.dirname(base)
    for hit in glob(root, site, "rocm_sdk_core-*.dist-info"):
        m = re.match(r"rocm_sdk_core-(.+)\.dist-info$", os.path.basename(hit))
        if m:
            return m.group(1)
    return None


def _v_dir_name(root: Root, base: str) -> str | None:
    """`/opt/rocm/core-7.14` (TheRock native packages: build_package.py installs to
    /opt/rocm/core-<major>.<minor>), `/opt/rocm-6.4.1`: the version in the directory name."""
    m = re.search(r"(?:core|rocm)-(\d+\.\d+(?:\.\d+)?)$", os.path.basename(root.resolve_str(base)))
    return m.group(1) if m else None


_VERSION_READERS = {
    "dir_name": _v_dir_name,
    "install_toml": _v_install_toml,
    "info_version": _v_info_version,
    "rocm_version_h": _v_rocm_version_h,
    "hip_version_h": _v_hip_version_h,
    "dist_info_metadata": _v_dist_info_metadata,
}


def install_version(root: Root, base: str, layout: Layout) -> str | None:
    for source in layout.version_from:
        reader = _v_dpkg(source[5:]) if source.startswith("dpkg:") else _VERSION_READERS[source]
        value = reader(root, base)
        if value:
            return value
    return None


def version_key(version: str | None) -> tuple:
    """Order versions: 7.10.0a20251021 < 7.10.0; unknown sorts first."""
    if not version:
        return (-1,)
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", version)
    if not m:
        return (-1,)
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    rest = m.group(4)
    pre = re.match(r"(a|rc|\.dev)(\d*)", rest)
    if pre:
        return (major, minor, patch, 0, int(pre.group(2) or 0))
    return (major, minor, patch, 1, 0)
