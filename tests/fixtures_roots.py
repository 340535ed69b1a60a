"""Builders of fixture filesystem roots in REAL formats, for `--root` tests (any team may import).

Formats copied from upstream, written out by hand here:
- KFD node `properties`: amdkfd `kfd_topology.c` `node_show()` — one `name value` line per
  property (`%s %u` / `%s %llu`), in the order the kernel prints them; GPU-only keys
  (`max_engine_clk_fcompute` ... `num_xcc`) only on GPU nodes; `local_mem_size` is always 0.
- TheRock tarball layout (brief section 3): `lib/llvm/bin`, `llvm -> lib/llvm`, bitcode in
  `lib/llvm/amdgcn/bitcode`, `share/therock/dist_info.json` with `dist_amdgpu_targets`
  (semicolon-separated string), `.info/version`, `bin/amdclang*` links broken before Mar 2026.
- Classic /opt/rocm-X.Y.Z: `.info/version` (`6.4.1-120`), `include/rocm-core/rocm_version.h`,
  `llvm/bin`, `amdgcn/bitcode`, `/opt/rocm -> /opt/rocm-X.Y.Z`.
- Debian: /usr/bin/hipcc (perl), /usr/lib/llvm-N/bin, multiarch libs and
  /usr/lib/x86_64-linux-gnu/amdgcn/bitcode, dpkg status stanzas.
- rocBLAS / hipBLASLt: `TensileLibrary_lazy_<gfx>.dat`, `TensileLibrary_Type_..._<gfx>.co`.

Typical use::

    root = tmp_path
    make_strix_halo(root)                      # sysfs + 2025 TheRock tree at /opt/rocm
    res = resolver.resolve(Root(root), environ={})
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Every ISA the device libraries ship bitcode for (ROCm-Device-Libs oclc_isa_version_*.bc).
DEVICE_LIB_ISAS = (
    "600", "601", "602", "700", "701", "702", "703", "704", "705", "801", "802", "803", "805",
    "810", "900", "902", "904", "906", "908", "909", "90a", "90c", "940", "941", "942", "950",
    "1010", "1011", "1012", "1013", "1030", "1031", "1032", "1033", "1034", "1035", "1036",
    "1100", "1101", "1102", "1103", "1150", "1151", "1152", "1153", "1200", "1201",
)
OLD_DEVICE_LIB_ISAS = tuple(i for i in DEVICE_LIB_ISAS if not i.startswith(("115", "12", "95")))


def _write(path: Path, text: str = "", mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.symlink(target, path)


# -- KFD sysfs -----------------------------------------------------------------------------------
KFD = "sys/class/kfd/kfd/topology"

_COMMON_KEYS = (
    "cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count",
    "p2p_links_count", "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb",
    "gds_size_in_kb", "num_gws", "wave_front_size", "array_count", "simd_arrays_per_engine",
    "cu_per_simd_array", "simd_per_cu", "max_slots_scratch_cu", "gfx_target_version", "vendor_id",
    "device_id", "location_id", "domain", "drm_render_minor", "hive_id", "num_sdma_engines",
    "num_sdma_xgmi_engines", "num_sdma_queues_per_engine", "num_cp_queues",
)
_GPU_KEYS = (
    "max_engine_clk_fcompute", "local_mem_size", "fw_version", "capability", "capability2",
    "debug_prop", "sdma_fw_version", "unique_id", "num_xcc",
)


def kfd_properties_text(props: dict[str, int], gpu: bool) -> str:
    """Render properties exactly as node_show() does (kernel order, GPU-only keys last)."""
    lines = [f"{k} {int(props.get(k, 0))}" for k in _COMMON_KEYS]
    if gpu:
        lines += [f"{k} {int(props.get(k, 0))}" for k in _GPU_KEYS]
    lines.append(f"max_engine_clk_ccompute {int(props.get('max_engine_clk_ccompute', 0))}")
    return "\n".join(lines) + "\n"


def make_kfd_node(root: Path, node: int, props: dict[str, int], *, gpu: bool | None = None,
                  name: str = "", gpu_id: int = 0) -> Path:
    """One `/sys/class/kfd/kfd/topology/nodes/<node>/` directory; returns the properties file."""
    is_gpu = props.get("simd_count", 0) > 0 if gpu is None else gpu
    d = root / KFD / "nodes" / str(node)
    _write(d / "gpu_id", f"{gpu_id}\n")
    _write(d / "name", f"{name}\n")
    for sub in ("mem_banks", "caches", "io_links", "p2p_links"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    _write(root / KFD / "generation_id", "1\n")
    _write(root / KFD / "system_properties", "platform_oem 0\nplatform_id 0\nplatform_rev 0\n")
    return _write(d / "properties", kfd_properties_text(props, is_gpu))


def cpu_node_props(cores: int = 32) -> dict[str, int]:
    return {"cpu_cores_count": cores, "mem_banks_count": 1, "io_links_count": 1,
            "max_engine_clk_ccompute": 5187}


def gpu_node_props(gfx_target_version: int, *, cus: int, simd_per_cu: int = 2,
                   device_id: int, location_id: int = 0xC200, render_minor: int = 128,
                   unique_id: int = 0, wave: int = 32, cpu_cores: int = 0,
                   clock: int = 2900) -> dict[str, int]:
    arrays = 4 if cus <= 48 else 12
    return {
        "cpu_cores_count": cpu_cores, "simd_count": cus * simd_per_cu, "mem_banks_count": 1,
        "caches_count": 3 * cus, "io_links_count": 1, "p2p_links_count": 0,
        "simd_id_base": 2147487744, "max_waves_per_simd": 16, "lds_size_in_kb": 64,
        "num_gws": 64, "wave_front_size": wave, "array_count": arrays,
        "simd_arrays_per_engine": 2, "cu_per_simd_array": max(1, cus // arrays),
        "simd_per_cu": simd_per_cu, "max_slots_scratch_cu": 32,
        "gfx_target_version": gfx_target_version, "vendor_id": 4098, "device_id": device_id,
        "location_id": location_id, "drm_render_minor": render_minor, "num_sdma_engines": 2,
        "num_sdma_queues_per_engine": 6, "num_cp_queues": 8, "max_engine_clk_fcompute": clock,
        "fw_version": 35, "capability": 671588992, "debug_prop": 1495, "sdma_fw_version": 14,
        "unique_id": unique_id, "num_xcc": 1, "max_engine_clk_ccompute": 5187,
    }


# Real parts: Strix Halo 8060S (0x1586, 40 CUs), RX 7900 XTX (0x744c, 96 CUs),
# Raphael iGPU (0x164e, 2 CUs).
STRIX_HALO = dict(gfx_target_version=110501, cus=40, device_id=0x1586, location_id=0xC200)
RX7900XTX = dict(gfx_target_version=110000, cus=96, device_id=0x744C, location_id=0x0300,
                 unique_id=0x1A2B3C4D5E6F7081, clock=2526)
RAPHAEL_IGPU = dict(gfx_target_version=100306, cus=2, device_id=0x164E, location_id=0x7A00,
                    render_minor=129, clock=2200)

# More real parts: Phoenix iGPU Radeon 780M (0x15bf, 12 CUs), RX 6800 XT (0x73bf, 72 CUs),
# Radeon VII (0x66af, 60 CUs, GCN: 4 SIMDs per CU, wave64), RX 9070 XT (0x7550, 64 CUs).
PHOENIX_IGPU = dict(gfx_target_version=110003, cus=12, device_id=0x15BF, location_id=0xC500,
                    clock=2700)
RX6800XT = dict(gfx_target_version=100300, cus=72, device_id=0x73BF, location_id=0x0300,
                clock=2250)
RADEON_VII = dict(gfx_target_version=90006, cus=60, device_id=0x66AF, location_id=0x0300,
                  simd_per_cu=4, wave=64, clock=1801)
RX9070XT = dict(gfx_target_version=120001, cus=64, device_id=0x7550, location_id=0x0300,
                clock=2970)


def make_gpus(root: Path, *gpus: dict, cpu_cores: int = 32) -> None:
    """Node 0 the CPU, then one node per GPU spec (a dict of gpu_node_props arguments)."""
    make_kfd_node(root, 0, cpu_node_props(cpu_cores))
    for i, spec in enumerate(gpus, 1):
        make_kfd_node(root, i, gpu_node_props(**spec), name="ip discovery", gpu_id=1000 + i)


# -- ROCm trees ----------------------------------------------------------------------------------
_SCRIPT = "#!/bin/sh\necho \"{name} (rocforge fixture)\"\n"


def _exe(path: Path, name: str | None = None) -> None:
    _write(path, _SCRIPT.format(name=name or path.name), 0o755)


def _llvm_bin(bin_dir: Path, major: int, extra: tuple[str, ...] = ()) -> None:
    """An LLVM bin/ as installed: clang-N the binary, clang -> clang-N, clang++ -> clang."""
    _exe(bin_dir / f"clang-{major}")
    _link(bin_dir / "clang", f"clang-{major}")
    _link(bin_dir / "clang++", "clang")
    for tool in extra:
        _exe(bin_dir / tool)


def _tensile(lib_dir: Path, gfx: str, kind: str) -> None:
    if kind == "rocblas":
        names = (f"TensileLibrary_lazy_{gfx}.dat",
                 f"TensileLibrary_Type_HH_HPA_Contraction_l_Ailk_Bljk_Cijk_Dijk_{gfx}.co",
                 f"TensileLibrary_Type_HH_HPA_Contraction_l_Ailk_Bljk_Cijk_Dijk_{gfx}.dat",
                 f"Kernels.so-000-{gfx}.hsaco")
    else:
        names = (f"TensileLibrary_lazy_{gfx}.dat",
                 f"TensileLibrary_HH_HH_HA_Bias_SAV_Type_HH_HPA_Contraction_l_Alik_Bljk_Cijk_Dijk_{gfx}.co",
                 f"extop_{gfx}.co")
    for n in names:
        _write(lib_dir / n, "")


def _bitcode(d: Path, isas=DEVICE_LIB_ISAS) -> None:
    for n in ("ocml.bc", "ockl.bc", "hip.bc", "opencl.bc", "oclc_abi_version_500.bc",
              "oclc_daz_opt_off.bc", "oclc_wavefrontsize64_off.bc"):
        _write(d / n, "")
    for isa in isas:
        _write(d / f"oclc_isa_version_{isa}.bc", "")


def _hip_version_h(d: Path, major: int, minor: int, patch: int) -> None:
    _write(d / "include/hip/hip_version.h",
           "// Auto-generated by cmake\n\n#ifndef HIP_VERSION_H\n#define HIP_VERSION_H\n\n"
           f"#define HIP_VERSION_MAJOR {major}\n#define HIP_VERSION_MINOR {minor}\n"
           f"#define HIP_VERSION_PATCH {patch}\n#define HIP_VERSION_GITHASH \"\"\n"
           f"#define HIP_VERSION    (HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 "
           "+ HIP_VERSION_PATCH)\n\n#endif\n")


def make_therock_tree(root: Path, version: str = "7.9.0rc20250812",
                      targets: tuple[str, ...] = ("gfx1151",), *, inner: str = "/opt/rocm",
                      amdgcn_link: bool = False, broken_amdclang: bool = True,
                      rocblas: tuple[str, ...] | None = None,
                      hipblaslt: tuple[str, ...] | None = None,
                      install_toml: dict | None = None) -> Path:
    """A TheRock dist tree at `inner` inside `root` (2025 defaults: no `amdgcn` link, broken
    bin/amdclang* links).  `rocblas`/`hipblaslt` default to `targets`; pass () for none."""
    d = root / inner.lstrip("/")
    rocblas = targets if rocblas is None else rocblas
    hipblaslt = targets if hipblaslt is None else hipblaslt
    llvm = d / "lib/llvm"
    _llvm_bin(llvm / "bin", 20, ("amdclang", "amdclang++", "offload-arch", "ld.lld"))
    _link(d / "llvm", "lib/llvm")
    _bitcode(llvm / "amdgcn/bitcode")
    if amdgcn_link:
        _link(d / "amdgcn", "lib/llvm/amdgcn")
    for tool in ("hipcc", "hipconfig", "rocminfo", "rocm-smi", "amd-smi"):
        _exe(d / "bin" / tool)
    for tool in ("amdclang", "amdclang++"):
        _link(d / "bin" / tool, f"../lib/llvm/bin/{tool}" if not broken_amdclang
              else f"../llvm/bin/{tool}-missing")
    for lib in ("libamdhip64.so.7", "libhsa-runtime64.so.1", "librocblas.so.5", "libhipblaslt.so.1"):
        _write(d / "lib" / lib, "")
    _write(d / "lib/llvm/lib/libLLVM.so", "")
    _write(d / "lib/cmake/hip/hip-config.cmake", "# fixture\n")
    _write(d / "lib/pkgconfig/hip.pc", f"prefix={inner}\nName: hip\nVersion: {version}\n")
    for gfx in rocblas:
        _tensile(d / "lib/rocblas/library", gfx, "rocblas")
    for gfx in hipblaslt:
        _tensile(d / "lib/hipblaslt/library", gfx, "hipblaslt")
    (d / "lib/rocblas/library").mkdir(parents=True, exist_ok=True)
    major, minor, patch = _split_version(version)
    _hip_version_h(d, major, minor, 40000 + patch)
    _write(d / "include/rocm-core/rocm_version.h",
           f"#define ROCM_VERSION_MAJOR {major}\n#define ROCM_VERSION_MINOR {minor}\n"
           f"#define ROCM_VERSION_PATCH {patch}\n")
    _write(d / ".info/version", version + "\n")
    _write(d / "share/therock/dist_info.json",
           json.dumps({"dist_amdgpu_targets": ";".join(targets)}, indent=2) + "\n")
    if install_toml is not None:
        lines = [f"{k} = {json.dumps(v)}" for k, v in install_toml.items()]
        _write(d / "rocforge-install.toml", "\n".join(lines) + "\n")
    return d


def _split_version(version: str) -> tuple[int, int, int]:
    import re

    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def make_classic_rocm(root: Path, version: str = "6.4.1", build: int = 120, *,
                      rocblas: tuple[str, ...] = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942",
                                                  "gfx1030", "gfx1100", "gfx1101", "gfx1102"),
                      hipblaslt: tuple[str, ...] = ("gfx90a", "gfx942", "gfx1100", "gfx1101"),
                      link: bool = True, isas=OLD_DEVICE_LIB_ISAS) -> Path:
    """/opt/rocm-<version> (+ absolute /opt/rocm link) as AMD's packages lay it out."""
    d = root / f"opt/rocm-{version}"
    major, minor, patch = _split_version(version)
    _write(d / ".info/version", f"{version}-{build}\n")
    _write(d / "include/rocm-core/rocm_version.h",
           "#ifndef ROCM_VERSION_H\n#define ROCM_VERSION_H\n\n"
           f"#define ROCM_VERSION_MAJOR   {major}\n#define ROCM_VERSION_MINOR   {minor}\n"
           f"#define ROCM_VERSION_PATCH   {patch}\n\n#endif\n")
    _hip_version_h(d, major, minor, 43483)
    _llvm_bin(d / "llvm/bin", 19, ("amdclang++", "ld.lld"))
    _link(d / "lib/llvm", "../llvm")
    for tool in ("hipcc", "hipconfig", "rocminfo"):
        _exe(d / "bin" / tool)
    _bitcode(d / "amdgcn/bitcode", isas)
    for lib in ("libamdhip64.so.6", "libhsa-runtime64.so.1", "librocblas.so.4"):
        _write(d / "lib" / lib, "")
    _write(d / "lib/cmake/hip/hip-config.cmake", "# fixture\n")
    for gfx in rocblas:
        _tensile(d / "lib/rocblas/library", gfx, "rocblas")
    for gfx in hipblaslt:
        _tensile(d / "lib/hipblaslt/library", gfx, "hipblaslt")
    if link:
        _link(root / "opt/rocm", f"/opt/rocm-{version}")
    return d


_DPKG_STANZA = """Package: {name}
Status: install ok installed
Priority: optional
Section: {section}
Installed-Size: 1234
Maintainer: Debian ROCm Team <debian-ai@lists.debian.org>
Architecture: amd64
Source: {source}
Version: {version}
Description: {desc}

"""


def make_debian_usr(root: Path, *, rocm_version: str = "5.2.3", llvm: int = 15,
                    rocblas: tuple[str, ...] = (), isas=OLD_DEVICE_LIB_ISAS) -> Path:
    """Debian's ROCm packages under /usr (bookworm: hipcc 5.2.3 with clang-15)."""
    u = root / "usr"
    multi = u / "lib/x86_64-linux-gnu"
    _write(u / "bin/hipcc", "#!/usr/bin/perl\n# hipcc (Debian)\n", 0o755)
    _write(u / "bin/hipconfig", "#!/usr/bin/perl\n", 0o755)
    _llvm_bin(u / f"lib/llvm-{llvm}/bin", llvm)
    _link(u / f"bin/clang++-{llvm}", f"../lib/llvm-{llvm}/bin/clang++")
    _link(u / f"bin/clang-{llvm}", f"../lib/llvm-{llvm}/bin/clang")
    major, minor, _ = _split_version(rocm_version)
    _write(multi / f"libamdhip64.so.{major}", "")
    _link(multi / "libamdhip64.so", f"libamdhip64.so.{major}")
    _bitcode(multi / "amdgcn/bitcode", isas)
    _hip_version_h(u, major, minor, 21153)
    for gfx in rocblas:
        _tensile(multi / f"rocblas/{rocm_version}/library", gfx, "rocblas")
    status = root / "var/lib/dpkg/status"
    stanzas = [
        dict(name="libc6", section="libs", source="glibc", version="2.36-9+deb12u4",
             desc="GNU C Library: Shared libraries"),
        dict(name="hipcc", section="devel", source="rocm-hipamd", version=f"{rocm_version}-8",
             desc="C++ Runtime API and Kernel Language for AMD and NVIDIA GPUs"),
        dict(name="libamdhip64-dev", section="libdevel", source="rocm-hipamd",
             version=f"{rocm_version}-8", desc="Header files for the AMD implementation of HIP"),
    ]
    _write(status, "".join(_DPKG_STANZA.format(**s) for s in stanzas))
    return u


def make_system(root: Path, *, kfd: bool = True, groups: dict[str, tuple[str, ...]] | None = None,
                kernel: str = "6.11.0-19-generic") -> None:
    """/etc/group (render, video), /dev/kfd, /proc/version."""
    groups = {"render": ("alice",), "video": ("alice",)} if groups is None else groups
    lines = ["root:x:0:", "adm:x:4:alice"]
    gid = 44
    for name, members in groups.items():
        lines.append(f"{name}:x:{gid}:{','.join(members)}")
        gid += 61
    _write(root / "etc/group", "\n".join(lines) + "\n")
    if kfd:
        _write(root / "dev/kfd", "", 0o666)
        _write(root / "dev/dri/renderD128", "", 0o666)
    _write(root / "proc/version",
           f"Linux version {kernel} (buildd@lcy02-amd64-001) (x86_64-linux-gnu-gcc-13 (Ubuntu "
           f"13.3.0-6ubuntu2~24.04) 13.3.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #19-Ubuntu "
           "SMP PREEMPT_DYNAMIC Thu Feb 13 09:46:36 UTC 2025\n")


# -- whole machines -----------------------------------------------------------------------------
def make_strix_halo(root: Path, *, version: str = "7.9.0rc20250812", **tree) -> Path:
    """Strix Halo (gfx1151 iGPU, 40 CUs) with a 2025 TheRock gfx1151 tree at /opt/rocm."""
    make_gpus(root, STRIX_HALO)
    make_system(root)
    return make_therock_tree(root, version, ("gfx1151",), **tree)


def make_igpu_dgpu(root: Path) -> Path:
    """Raphael iGPU (gfx1036) + RX 7900 XTX (gfx1100), classic ROCm 6.4.1 (gfx1100 kernels)."""
    make_gpus(root, RAPHAEL_IGPU, RX7900XTX, cpu_cores=16)
    make_system(root)
    return make_classic_rocm(root)


def make_future_gpu(root: Path, gfx_target_version: int = 130000) -> None:
    make_gpus(root, dict(gfx_target_version=gfx_target_version, cus=64, device_id=0x7600))
    make_system(root)


ROCMINFO_GFX1151 = """ROCk module version 6.12.12 is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.18
Runtime Ext Version:     1.11
System Timestamp Freq.:  1000.000000MHz
Sig. Max Wait Duration:  18446744073709551615 (0xFFFFFFFFFFFFFFFF) (timestamp count)
Machine Model:           LARGE
System Endianness:       LITTLE
Mwaitx:                  DISABLED
XNACK enabled:           NO
DMAbuf Support:          YES
VMM Support:             YES

==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD RYZEN AI MAX+ 395 w/ Radeon 8060S
  Uuid:                    CPU-XX
  Marketing Name:          AMD RYZEN AI MAX+ 395 w/ Radeon 8060S
  Vendor Name:             CPU
  Feature:                 None specified
  Profile:                 FULL_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        0(0x0)
  Queue Min Size:          0(0x0)
  Queue Max Size:          0(0x0)
  Queue Type:              MULTI
  Node:                    0
  Device Type:             CPU
  Cache Info:
    L1:                      49152(0xc000) KB
  Chip ID:                 0(0x0)
  ASIC Revision:           0(0x0)
  Cacheline Size:          64(0x40)
  Max Clock Freq. (MHz):   5187
  BDFID:                   0
  Internal Node ID:        0
  Compute Unit:            32
  SIMDs per CU:            0
  Shader Engines:          0
  Shader Arrs. per Eng.:   0
  WatchPts on Addr. Ranges:1
  Memory Properties:
  Features:                None
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: FINE GRAINED
      Size:                    131072000(0x7d00000) KB
      Allocatable:             TRUE
      Alloc Granule:           4KB
      Alloc Recommended Granule:4KB
      Alloc Alignment:         4KB
      Accessible by all:       TRUE
  ISA Info:
*******
Agent 2
*******
  Name:                    gfx1151
  Uuid:                    GPU-XX
  Marketing Name:          AMD Radeon Graphics
  Vendor Name:             AMD
  Feature:                 KERNEL_DISPATCH
  Profile:                 BASE_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        128(0x80)
  Queue Min Size:          64(0x40)
  Queue Max Size:          131072(0x20000)
  Queue Type:              MULTI
  Node:                    1
  Device Type:             GPU
  Cache Info:
    L1:                      32(0x20) KB
    L2:                      2048(0x800) KB
    L3:                      32768(0x8000) KB
  Chip ID:                 5510(0x1586)
  ASIC Revision:           0(0x0)
  Cacheline Size:          128(0x80)
  Max Clock Freq. (MHz):   2900
  BDFID:                   49664
  Internal Node ID:        1
  Compute Unit:            40
  SIMDs per CU:            2
  Shader Engines:          2
  Shader Arrs. per Eng.:   2
  WatchPts on Addr. Ranges:4
  Coherent Host Access:    FALSE
  Memory Properties:       APU
  Features:                KERNEL_DISPATCH
  Fast F16 Operation:      TRUE
  Wavefront Size:          32(0x20)
  Workgroup Max Size:      1024(0x400)
  Workgroup Max Size per Dimension:
    x                        1024(0x400)
    y                        1024(0x400)
    z                        1024(0x400)
  Max Waves Per CU:        32(0x20)
  Max Work-item Per CU:    1024(0x400)
  Grid Max Size:           4294967295(0xffffffff)
  Grid Max Size per Dimension:
    x                        4294967295(0xffffffff)
    y                        4294967295(0xffffffff)
    z                        4294967295(0xffffffff)
  Max fbarriers/Workgrp:   32
  Packet Processor uCode:: 35
  SDMA engine uCode::      14
  IOMMU Support::          None
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: COARSE GRAINED
      Size:                    65536000(0x3e80000) KB
      Allocatable:             TRUE
      Alloc Granule:           4KB
      Alloc Recommended Granule:2048KB
      Alloc Alignment:         4KB
      Accessible by all:       FALSE
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1151
      Machine Models:          HSA_MACHINE_MODEL_LARGE
      Profiles:                HSA_PROFILE_BASE
      Default Rounding Mode:   NEAR
      Default Rounding Mode:   NEAR
      Fast f16:                TRUE
      Workgroup Max Size:      1024(0x400)
    ISA 2
      Name:                    amdgcn-amd-amdhsa--gfx11-generic
      Machine Models:          HSA_MACHINE_MODEL_LARGE
      Profiles:                HSA_PROFILE_BASE
*** Done ***
"""


def make_fake_rocminfo(bin_dir: Path, output: str = ROCMINFO_GFX1151) -> Path:
    """An executable `rocminfo` printing real-format output."""
    data = bin_dir / "rocminfo.out"
    _write(data, output)
    return _write(bin_dir / "rocminfo", f"#!/bin/sh\ncat '{data}'\n", 0o755)


# -- TheRock native packages (amdrocm-*, ROCm 7.14+) ---------------------------------------------
# No real package can be downloaded here, so this tree follows the real file lists: the
# install prefix /opt/rocm/core-<major>.<minor> (build_tools/packaging/linux/build_package.py),
# the alternatives links /opt/rocm/core, /opt/rocm/core-<major> and /opt/rocm/{bin,lib,include,
# llvm,amdgcn,libexec,share} (template/scripts/amdrocm-core-postinst.j2), host libraries in
# lib/ (amdrocm-blas-host<X.Y>: lib/librocblas.so) and device code only as kernel packs
# (amdrocm-blas<X.Y>-<gfx>: .kpack/blas_lib_<gfx>.kpack; docs/packaging/
# nativepackage_dependency_tree.md, RELEASES.md `ls install/.kpack/`).  The .kpack files are
# in rocm-kpack's format (kpack.py): "KPAK", uint32 version 1, uint64 TOC offset, blobs
# aligned to 64 bytes, a MessagePack TOC.

def _msgpack(value) -> bytes:
    """MessagePack for the few types a kpack TOC uses (str, int >= 0, list, dict)."""
    import struct

    if isinstance(value, dict):
        n = len(value)
        head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
        return head + b"".join(_msgpack(k) + _msgpack(v) for k, v in value.items())
    if isinstance(value, list):
        n = len(value)
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
        return head + b"".join(_msgpack(v) for v in value)
    if isinstance(value, str):
        raw = value.encode()
        return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xd9" + bytes([len(raw)])) + raw
    if isinstance(value, int):
        return bytes([value]) if value < 128 else b"\xce" + struct.pack(">I", value)
    raise TypeError(type(value))


def write_kpack(path: Path, group: str, family: str, arches: tuple[str, ...],
                binaries: tuple[str, ...] = ("lib/librocblas.so.5",)) -> Path:
    import struct

    blobs, toc, offset = [], {}, 64
    for b in binaries:
        for arch in arches:
            blobs.append({"offset": offset, "size": 64})
            toc.setdefault(b, {})[arch] = {"type": "hsaco", "ordinal": len(blobs) - 1,
                                          "original_size": 64}
            offset += 64
    body = b"\0" * (offset - 64)
    table = _msgpack({"format_version": 1, "group_name": group, "gfx_arch_family": family,
                      "gfx_arches": list(arches), "toc": toc, "compression_scheme": "none",
                      "blobs": blobs})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"KPAK" + struct.pack("<IQ", 1, offset) + b"\0" * 48 + body + table)
    return path


def make_therock_native(root: Path, version: str = "7.14.0",
                        device_targets: tuple[str, ...] = ("gfx1151",)) -> Path:
    """/opt/rocm/core-X.Y from amdrocm-core-sdk<X.Y> + amdrocm-blas<X.Y>-<gfx> packages."""
    major, minor, _ = _split_version(version)
    inner = f"/opt/rocm/core-{major}.{minor}"
    d = make_therock_tree(root, version, (), inner=inner, amdgcn_link=True,
                          broken_amdclang=False, rocblas=(), hipblaslt=())
    import shutil

    (d / "share/therock/dist_info.json").unlink()
    shutil.rmtree(d / "lib/rocblas", ignore_errors=True)
    shutil.rmtree(d / "lib/hipblaslt", ignore_errors=True)
    (d / ".info/version").unlink()
    for gfx in device_targets:
        write_kpack(d / f".kpack/blas_lib_{gfx}.kpack", "blas", gfx, (gfx,))
    _write(d / ".kpack/blas_lib.kpm", "")
    opt = root / "opt/rocm"
    _link(opt / "core", inner)
    _link(opt / f"core-{major}", inner)
    for sub in ("bin", "lib", "include", "llvm", "amdgcn", "libexec", "share"):
        _link(opt / sub, f"{inner}/{sub}")
    return d
