"""Host roots for `rocforge doctor` (host section) and `rocforge host plan`, in the real formats.

Formats and where they come from:
- `/proc/meminfo`: the kernel's `meminfo_proc_show()` layout (`%-16s%8lu kB` style lines), the
  same keys and order as this Debian 12 machine's own /proc/meminfo.
- `/proc/cmdline`, `/proc/sys/kernel/osrelease`, `/proc/version`: one line each, as the kernel
  writes them (BOOT_IMAGE first when GRUB booted the kernel).
- sysfs: `/sys/class/drm/card1 -> ../../devices/pci.../drm/card1`, `card1/device -> ../../../<bdf>`,
  amdgpu's `mem_info_{gtt,vram}_{total,used}` as `%llu\\n` bytes, `vendor` as `0x1002\\n`;
  `/sys/module/{ttm,amdttm}/parameters/pages_limit` as `%lu\\n`.  The 128 GB pair
  (MemTotal 131752264 kB, default pages_limit 16469033 = 62.82 GB) is the one AMD's RDNA3.5
  system-optimization page prints for `amd-ttm` ("Total system memory: 125.65 GB").
- debugfs `amdgpu_firmware_info`: lines as posted from a Strix Halo (VBIOS 113-STRXLGEN-001) in
  ROCm/legacy-rocm-build #5724.
- dpkg status: the Debian Packages entry of firmware-amd-graphics 20250410-2 (trixie, fetched with
  apt-cache from deb.debian.org) turned into a status stanza; Ubuntu's linux-firmware stanza
  written by hand in the same layout (Ubuntu's archive is not reachable from here).
- pacman: `/var/lib/pacman/local/<name>-<version>/desc` (`%NAME%` / `%VERSION%` blocks).
- sysfs firmware: amdgpu_ucode.c's `device/fw_version/<name>_fw_version` files (mode 0444,
  `0x%08x\n`) and `device/vbios_version` (`%s\n`); `/sys/class/iommu/ivhd0`, the AMD IOMMU
  unit's link into its PCI device (amd_iommu registers `ivhd%d`).
- `/etc/tuned/active_profile`: the profile name and a newline, as tuned-adm writes it.
- `/etc/os-release`, `/etc/default/grub`: the distributions' stock files (Debian 12's is copied
  from this machine; the others written from the distributions' defaults).
"""

from __future__ import annotations

from pathlib import Path

import fixtures_roots as fr

GIB = 1 << 30
MIB = 1 << 20
BDF = "0000:c5:00.0"
PCI = f"devices/pci0000:00/0000:00:08.1/{BDF}"

OS_RELEASE = {
    "ubuntu": """PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
""",
    "fedora": """NAME="Fedora Linux"
VERSION="43 (Workstation Edition)"
RELEASE_TYPE=stable
ID=fedora
VERSION_ID=43
VERSION_CODENAME=""
PLATFORM_ID="platform:f43"
PRETTY_NAME="Fedora Linux 43 (Workstation Edition)"
ANSI_COLOR="0;38;2;60;110;180"
LOGO=fedora-logo-icon
CPE_NAME="cpe:/o:fedoraproject:fedora:43"
DEFAULT_HOSTNAME="fedora"
HOME_URL="https://fedoraproject.org/"
DOCUMENTATION_URL="https://docs.fedoraproject.org/en-US/fedora/f43/"
SUPPORT_URL="https://ask.fedoraproject.org/"
BUG_REPORT_URL="https://bugzilla.redhat.com/"
REDHAT_BUGZILLA_PRODUCT="Fedora"
REDHAT_BUGZILLA_PRODUCT_VERSION=43
REDHAT_SUPPORT_PRODUCT="Fedora"
REDHAT_SUPPORT_PRODUCT_VERSION=43
SUPPORT_END=2026-12-02
VARIANT="Workstation Edition"
VARIANT_ID=workstation
""",
    "debian12": """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
""",
    "debian13": """PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.1
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
""",
    "pop": """NAME="Pop!_OS"
VERSION="22.04 LTS"
ID=pop
ID_LIKE="ubuntu debian"
PRETTY_NAME="Pop!_OS 22.04 LTS"
VERSION_ID="22.04"
HOME_URL="https://pop.system76.com"
SUPPORT_URL="https://support.system76.com"
BUG_REPORT_URL="https://github.com/pop-os/pop/issues"
PRIVACY_POLICY_URL="https://system76.com/privacy"
VERSION_CODENAME=jammy
UBUNTU_CODENAME=jammy
LOGO=distributor-logo-pop-os
""",
    "arch": """NAME="Arch Linux"
PRETTY_NAME="Arch Linux"
ID=arch
BUILD_ID=rolling
ANSI_COLOR="38;2;23;147;209"
HOME_URL="https://archlinux.org/"
DOCUMENTATION_URL="https://wiki.archlinux.org/"
SUPPORT_URL="https://bbs.archlinux.org/"
BUG_REPORT_URL="https://gitlab.archlinux.org/groups/archlinux/-/issues"
PRIVACY_POLICY_URL="https://terms.archlinux.org/docs/privacy-policy/"
LOGO=archlinux-logo
""",
}

GRUB_UBUNTU = """# If you change this file or any /etc/default/grub.d/*.cfg file,
# run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in these files, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT_STYLE=hidden
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${{NAME:-Ubuntu}} ) 2>/dev/null || echo Ubuntu`
GRUB_CMDLINE_LINUX_DEFAULT="{default}"
GRUB_CMDLINE_LINUX=""

# If your computer has multiple operating systems installed, then you
# probably want to run os-prober. However, if your computer is a host
# for guest OSes installed via LVM or raw disk devices, running
# os-prober can cause damage to those guest OSes as it mounts
# filesystems to look for things.
#GRUB_DISABLE_OS_PROBER=false
"""

GRUB_DEBIAN = """# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="{default}"
GRUB_CMDLINE_LINUX=""
"""

GRUB_FEDORA = """GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR="$(sed 's, release .*$,,g' /etc/system-release)"
GRUB_DEFAULT=saved
GRUB_DISABLE_SUBMENU=true
GRUB_TERMINAL_OUTPUT="console"
GRUB_CMDLINE_LINUX="rhgb quiet"
GRUB_DISABLE_RECOVERY="true"
GRUB_ENABLE_BLSCFG=true
"""

FIRMWARE_INFO = """VCE feature version: 0, firmware version: 0x00000000
UVD feature version: 0, firmware version: 0x00000000
MC feature version: 0, firmware version: 0x00000000
ME feature version: 35, firmware version: 0x0000001f
PFP feature version: 35, firmware version: 0x0000002c
CE feature version: 0, firmware version: 0x00000000
RLC feature version: 1, firmware version: 0x11530505
MEC feature version: 35, firmware version: 0x0000001f
IMU feature version: 0, firmware version: 0x0b352300
SOS feature version: 0, firmware version: 0x00000000
ASD feature version: 553648388, firmware version: 0x21000104
TA XGMI feature version: 0x00000000, firmware version: 0x00000000
TA RAS feature version: 0x00000000, firmware version: 0x00000000
TA HDCP feature version: 0x00000000, firmware version: 0x1700004a
TA DTM feature version: 0x00000000, firmware version: 0x1200001a
TA RAP feature version: 0x00000000, firmware version: 0x00000000
TA SECUREDISPLAY feature version: 0x00000000, firmware version: 0x00000000
SMC feature version: 0, program: 10, firmware version: 0x0a640200 (100.2.0)
SDMA0 feature version: 60, firmware version: 0x00000011
VCN feature version: 0, firmware version: 0x0911801b
DMCU feature version: 0, firmware version: 0x00000000
DMCUB feature version: 0, firmware version: 0x09003500
TOC feature version: 0, firmware version: 0x0000000b
MES_KIQ feature version: 6, firmware version: 0x0000006f
MES feature version: 1, firmware version: 0x{mes:08x}
VPE feature version: 60, firmware version: 0x00000017
VBIOS version: 113-STRXLGEN-001
"""

DPKG_FIRMWARE = {
    # Debian trixie's Packages entry (deb.debian.org, non-free-firmware) as a status stanza.
    "firmware-amd-graphics": """Package: firmware-amd-graphics
Status: install ok installed
Priority: optional
Section: non-free-firmware/kernel
Installed-Size: 91908
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: all
Multi-Arch: foreign
Source: firmware-nonfree
Version: {version}
Suggests: initramfs-tools
Description: Binary firmware for AMD/ATI graphics and NPU chips
Homepage: https://gitlab.com/kernel-firmware/linux-firmware

""",
    "linux-firmware": """Package: linux-firmware
Status: install ok installed
Priority: optional
Section: misc
Installed-Size: 1221304
Maintainer: Ubuntu Kernel Team <kernel-team@lists.ubuntu.com>
Architecture: all
Version: {version}
Provides: atmel-firmware, wireless-regdb
Recommends: amd64-microcode, intel-microcode
Breaks: linux-firmware-raspi2 (<< 1.20200420-0ubuntu1)
Description: Firmware for Linux kernel drivers
 This package provides firmware used by Linux kernel drivers.

""",
}


def _w(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def meminfo(mem_total_kib: int) -> str:
    free = mem_total_kib * 9 // 10
    rows = [
        ("MemTotal", mem_total_kib), ("MemFree", free), ("MemAvailable", free + 1_200_000),
        ("Buffers", 52100), ("Cached", 1228292), ("SwapCached", 0), ("Active", 889012),
        ("Inactive", 760464), ("Active(anon)", 371812), ("Inactive(anon)", 0),
        ("Active(file)", 517200), ("Inactive(file)", 760464), ("Unevictable", 0), ("Mlocked", 0),
        ("SwapTotal", 8388604), ("SwapFree", 8388604), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 180), ("Writeback", 0), ("AnonPages", 369144), ("Mapped", 245600),
        ("Shmem", 2668), ("KReclaimable", 60240), ("Slab", 118212), ("SReclaimable", 60240),
        ("SUnreclaim", 57972), ("KernelStack", 5040), ("PageTables", 7220),
        ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0), ("WritebackTmp", 0),
        ("CommitLimit", mem_total_kib // 2 + 8388604), ("Committed_AS", 1914216),
        ("VmallocTotal", 34359738367), ("VmallocUsed", 25676), ("VmallocChunk", 0),
        ("Percpu", 2496), ("HardwareCorrupted", 0), ("AnonHugePages", 0), ("ShmemHugePages", 0),
        ("ShmemPmdMapped", 0), ("FileHugePages", 0), ("FilePmdMapped", 0),
    ]
    lines = [f"{k + ':':<16}{v:>8} kB" for k, v in rows]
    lines += ["HugePages_Total:       0", "HugePages_Free:        0", "HugePages_Rsvd:        0",
              "HugePages_Surp:        0", "Hugepagesize:       2048 kB", "Hugetlb:               0 kB",
              f"{'DirectMap4k:':<16}{415604:>8} kB", f"{'DirectMap2M:':<16}{mem_total_kib // 2:>8} kB"]
    return "\n".join(lines) + "\n"


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def make_card(root: Path, *, card: int = 1, render: int = 128, device: int = 0x1586,
              gtt: int | None, vram: int, gtt_used: int = 45 * MIB, vram_used: int = 180 * MIB) -> None:
    dev = root / "sys" / PCI
    _w(dev / "vendor", "0x1002\n")
    _w(dev / "device", f"0x{device:04x}\n")
    _w(dev / "class", "0x030000\n")
    if gtt is not None:
        _w(dev / "mem_info_gtt_total", f"{gtt}\n")
    _w(dev / "mem_info_gtt_used", f"{gtt_used}\n")
    _w(dev / "mem_info_vram_total", f"{vram}\n")
    _w(dev / "mem_info_vram_used", f"{vram_used}\n")
    _w(dev / "mem_info_vis_vram_total", f"{vram}\n")
    _w(dev / f"drm/card{card}/dev", f"226:{card}\n")
    _w(dev / f"drm/card{card}/card{card}-eDP-1/status", "connected\n")
    _w(dev / f"drm/renderD{render}/dev", f"226:{render}\n")
    _link(dev / f"drm/card{card}/device", "../../../" + BDF)
    _link(dev / f"drm/renderD{render}/device", "../../../" + BDF)
    cls = root / "sys/class/drm"
    _link(cls / f"card{card}", f"../../{PCI}/drm/card{card}")
    _link(cls / f"card{card}-eDP-1", f"../../{PCI}/drm/card{card}/card{card}-eDP-1")
    _link(cls / f"renderD{render}", f"../../{PCI}/drm/renderD{render}")
    _w(cls / "version", "drm 1.1.0 20060810\n")


def make_host(root: Path, *, os: str = "ubuntu", kernel: str = "6.17.0-19-generic",
              mem_total_kib: int = 131752264, pages_limit: int | None = None,
              gtt: int | None = None, vram: int = 512 * MIB, cmdline: str | None = None,
              modules: tuple[str, ...] = ("ttm",), apu: bool = True, mes: int | None = None,
              dpkg: dict[str, str] | None = None, pacman: dict[str, str] | None = None,
              grub: str | None = None, tuned: str | None = None, icds: tuple[str, ...] = (),
              loader_entries: dict[str, str] | None = None, fw_sysfs: dict[str, int] | None = None,
              vbios: str | None = None, iommu_units: tuple[str, ...] | None = None) -> Path:
    """One machine: GPUs (KFD), /proc, sysfs, /etc.  `pages_limit` defaults to the kernel's own
    default, MemTotal pages / 2; the GTT follows it (`pages_limit x 4096`) unless given."""
    if apu:
        fr.make_gpus(root, fr.STRIX_HALO)
    else:
        fr.make_gpus(root, fr.RX7900XTX, cpu_cores=16)
    fr.make_system(root, kernel=kernel)
    p = root / "proc"
    _w(p / "meminfo", meminfo(mem_total_kib))
    _w(p / "sys/kernel/osrelease", kernel + "\n")
    if cmdline is None:
        cmdline = f"BOOT_IMAGE=/boot/vmlinuz-{kernel} root=UUID=0b6bd1f0-5f8a-4f6e-9d1c-3e1c2a7d9e41 ro quiet splash"
    _w(p / "cmdline", cmdline + "\n")
    limit = mem_total_kib // 4 // 2 if pages_limit is None else pages_limit
    for mod in modules:
        _w(root / f"sys/module/{mod}/parameters/pages_limit", f"{limit}\n")
        _w(root / f"sys/module/{mod}/parameters/page_pool_size", "0\n")
    if apu:
        make_card(root, gtt=limit * 4096 if gtt is None else gtt, vram=vram)
    else:
        make_card(root, card=0, render=128, device=0x744C, gtt=(mem_total_kib // 2) * 1024,
                  vram=24 * GIB)
    for name, version in (fw_sysfs or {}).items():
        _w(root / "sys" / PCI / "fw_version" / f"{name}_fw_version", f"0x{version:08x}\n", 0o444)
    if vbios is not None:
        _w(root / "sys" / PCI / "vbios_version", vbios + "\n", 0o444)
    if iommu_units is not None:
        (root / "sys/class/iommu").mkdir(parents=True, exist_ok=True)
        for unit in iommu_units:
            _link(root / "sys/class/iommu" / unit, f"../../devices/pci0000:00/0000:00:00.2/iommu/{unit}")
    if mes is not None:
        _w(root / "sys/kernel/debug/dri/1/amdgpu_firmware_info", FIRMWARE_INFO.format(mes=mes))
        _w(root / "sys/kernel/debug/dri/1/name", f"amdgpu dev={BDF} unique={BDF}\n")
    _w(root / "etc/os-release", OS_RELEASE[os])
    if dpkg:
        status = root / "var/lib/dpkg/status"
        old = status.read_text() if status.exists() else ""
        _w(status, old + "".join(DPKG_FIRMWARE[n].format(version=v) for n, v in dpkg.items()))
    for name, version in (pacman or {}).items():
        _w(root / f"var/lib/pacman/local/{name}-{version}/desc",
           f"%NAME%\n{name}\n\n%VERSION%\n{version}\n\n%BASE%\nlinux-firmware\n\n%DESC%\n"
           "Firmware files for Linux - Firmware for AMD Radeon GPUs\n\n%URL%\n"
           "https://gitlab.com/kernel-firmware/linux-firmware\n\n%ARCH%\nany\n\n"
           "%BUILDDATE%\n1764089914\n\n%INSTALLDATE%\n1764172107\n\n%VALIDATION%\npgp\n\n")
        _w(root / "var/lib/pacman/local/ALPM_DB_VERSION", "9\n")
    if grub is not None:
        _w(root / "etc/default/grub", grub)
    if tuned is not None:
        _w(root / "etc/tuned/active_profile", tuned + "\n")
        _w(root / "etc/tuned/profile_mode", "manual\n")
    for icd in icds:
        _w(root / "usr/share/vulkan/icd.d" / icd,
           '{\n    "ICD": {\n        "api_version": "1.4.318",\n        "library_path": "libvulkan_radeon.so"\n'
           '    },\n    "file_format_version": "1.0.1"\n}\n')
    for name, text in (loader_entries or {}).items():
        _w(root / "boot/loader/entries" / name, text)
    return root


# -- the machines of the issue ------------------------------------------------------------------
STRIX_128_KIB = 131752264  # amd-ttm: "Total system memory: 125.65 GB", default limit 16469033
STRIX_64_KIB = 65382624    # 62.35 GiB: 64 GB minus the 512 MB carve-out and kernel reservations


def strix_defaults(root: Path) -> Path:
    """128 GB Strix Halo, Ubuntu 24.04 HWE kernel, everything at its default."""
    return make_host(root, grub=GRUB_UBUNTU.format(default="quiet splash"),
                     dpkg={"linux-firmware": "20240318.git3b128b60-0ubuntu2.21"},
                     icds=("radeon_icd.x86_64.json",))


def strix_tuned(root: Path) -> Path:
    """128 GB Strix Halo, Fedora 43, pages_limit raised to 121 GiB, TuneD, MES 0x80."""
    pages = 121 * 262144
    return make_host(root, os="fedora", kernel="6.18.4-200.fc43.x86_64", pages_limit=pages,
                     cmdline="BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.18.4-200.fc43.x86_64 "
                             "root=UUID=4f1c2d3e-aaaa-bbbb-cccc-0123456789ab ro rootflags=subvol=root "
                             f"rhgb quiet ttm.pages_limit={pages}",
                     grub=GRUB_FEDORA, tuned="accelerator-performance", mes=0x80,
                     icds=("radeon_icd.x86_64.json",))


def strix_64(root: Path) -> Path:
    """64 GB Strix Halo, Arch with systemd-boot, linux-firmware-amdgpu 20251111."""
    entry = ("title   Arch Linux\nlinux   /vmlinuz-linux\ninitrd  /initramfs-linux.img\n"
             "options root=PARTUUID=6f0f6c6e-1f7a-4b6e-9d5e-2f1f0a9b8c7d rw quiet\n")
    return make_host(root, os="arch", kernel="6.18.9-arch1-2", mem_total_kib=STRIX_64_KIB,
                     cmdline="initrd=\\initramfs-linux.img root=PARTUUID=6f0f6c6e-1f7a-4b6e-9d5e-2f1f0a9b8c7d rw quiet",
                     pacman={"linux-firmware-amdgpu": "20251111-1"},
                     loader_entries={"arch.conf": entry})


def strix_amdttm(root: Path) -> Path:
    """128 GB Strix Halo, Ubuntu 24.04 OEM kernel with amdgpu-dkms (amdttm loaded next to ttm):
    a `ttm.pages_limit` that amdgpu ignores and a deprecated `amdgpu.gttsize`."""
    default = "quiet splash amdgpu.gttsize=126976 ttm.pages_limit=32505856"
    return make_host(root, kernel="6.14.0-1018-oem", modules=("amdttm", "ttm"),
                     cmdline=f"BOOT_IMAGE=/boot/vmlinuz-6.14.0-1018-oem root=UUID=0b6bd1f0 ro {default} vt.handoff=7",
                     grub=GRUB_UBUNTU.format(default=default), gtt=126976 * MIB,
                     dpkg={"linux-firmware": "20240318.git3b128b60-0ubuntu2.21"})


def strix_old_kernel(root: Path) -> Path:
    """128 GB Strix Halo, Debian 13 with its 6.12 kernel, a command line edited twice."""
    default = 'quiet ttm.pages_limit=27648000 "ttm.pages_limit=31457280"'
    return make_host(root, os="debian13", kernel="6.12.48+deb13-amd64",
                     cmdline=f"BOOT_IMAGE=/boot/vmlinuz-6.12.48+deb13-amd64 root=UUID=77e1 ro {default}",
                     pages_limit=31457280, grub=GRUB_DEBIAN.format(default=default.replace('"', '\\"')),
                     dpkg={"firmware-amd-graphics": "20250410-2"})


def strix_bad_firmware(root: Path) -> Path:
    """128 GB Strix Halo, Fedora 43, read as root: debugfs shows MES 0x83."""
    return make_host(root, os="fedora", kernel="6.18.4-200.fc43.x86_64", grub=GRUB_FEDORA, mes=0x83)


def strix_bad_firmware_arch(root: Path) -> Path:
    """Arch, read as a user (no debugfs): linux-firmware-amdgpu 20251125-2 installed."""
    return make_host(root, os="arch", kernel="6.18.4-arch1-1",
                     pacman={"linux-firmware-amdgpu": "20251125-2"},
                     loader_entries={"arch.conf": "title Arch Linux\nlinux /vmlinuz-linux\noptions rw quiet\n"})


def dgpu_desktop(root: Path) -> Path:
    """RX 7900 XTX desktop, Ubuntu 24.04, RADV and AMDVLK both installed."""
    return make_host(root, apu=False, kernel="6.8.0-45-generic", mem_total_kib=65_785_644,
                     grub=GRUB_UBUNTU.format(default="quiet splash"),
                     icds=("radeon_icd.x86_64.json", "amd_icd64.json"))
