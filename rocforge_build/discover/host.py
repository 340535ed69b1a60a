"""Host readiness: what the kernel, its command line, the firmware and the memory settings of
this machine (or `--root`) mean for ROCm, and the exact change that fixes each finding.

Facts live in `data/host.toml`, each with its public source.  Everything is read from files in
the formats the kernel and the distributions write them (`/proc/meminfo`, `/proc/cmdline`,
`/sys/class/drm/card*/device/mem_info_*`, `/sys/module/{ttm,amdttm}/parameters/pages_limit`,
debugfs `amdgpu_firmware_info`, dpkg status, the rpm sqlite database, pacman's local database,
`/etc/default/grub`, systemd-boot entries, `/etc/tuned/active_profile`, `/etc/os-release`).
A file that is missing, unreadable or garbage makes its check `unknown`; nothing is guessed.
rocforge never changes the host: `plan()` returns commands for a person to review.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import struct
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath

from rocforge_build.errors import DetectionError, UsageError
from rocforge_build.resources import load_toml, package_data
from rocforge_build.rootfs import Root
from rocforge_build.shellsafe import comment

GIB = 1 << 30
MIB = 1 << 20
STATUSES = ("ok", "warn", "fail", "unknown")
_MAX_READ = 1 << 20


@cache
def facts() -> dict:
    return load_toml(package_data("host.toml"), "host facts")


# -- reading ---------------------------------------------------------------------------------------
def read(root: Root, inner: str | PurePosixPath) -> str | None:
    """A small text file of the root, or None when missing or unreadable (no root for debugfs)."""
    try:
        with open(root.host(inner), "rb") as f:
            return f.read(_MAX_READ).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def read_int(root: Root, inner: str | PurePosixPath) -> int | None:
    text = read(root, inner)
    if text is None:
        return None
    text = text.strip()
    return int(text) if re.fullmatch(r"\d{1,20}", text) else None


def parse_meminfo(text: str | None, key: str = "MemTotal") -> int | None:
    """`key` (MemTotal, MemAvailable, ...) in KiB (`MemTotal:       24684096 kB`), None when
    absent or garbage."""
    m = re.search(rf"^{re.escape(key)}:\s+(\d+) kB\s*$", text or "", re.M)
    return int(m.group(1)) if m else None


def parse_cmdline(text: str) -> list[str]:
    """Kernel command-line words as the kernel splits them (`next_arg`): spaces separate, double
    quotes group (`a="b c"`), and everything after a lone `--` goes to init, not the kernel."""
    words: list[str] = []
    cur: list[str] = []
    quoted = False
    started = False
    for ch in text.strip():
        if ch == '"':
            quoted = not quoted
            started = True
            continue
        if ch.isspace() and not quoted:
            if started:
                words.append("".join(cur))
            cur, started = [], False
            continue
        cur.append(ch)
        started = True
    if started:
        words.append("".join(cur))
    if "--" in words:
        words = words[: words.index("--")]
    return words


def param_key(word: str) -> str:
    """`amdgpu.gttsize=1` -> `amdgpu.gttsize`; `-` and `_` are the same in parameter names."""
    return word.split("=", 1)[0].replace("-", "_")


def param_values(words: list[str], key: str) -> list[str]:
    key = key.replace("-", "_")
    return [w.split("=", 1)[1] if "=" in w else "" for w in words if param_key(w) == key]


def parse_os_release(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        m = re.match(r"^([A-Z0-9_]+)=(.*)$", line.strip())
        if not m:
            continue
        try:
            parts = shlex.split(m.group(2))
        except ValueError:
            continue
        out[m.group(1)] = parts[0] if parts else ""
    return out


# -- kernel versions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    release: str  # uname -r
    where: str

    @property
    def version(self) -> tuple[int, int, int]:
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", self.release)
        return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else (0, 0, 0)

    @property
    def flavour(self) -> str | None:
        """Ubuntu's kernel flavour and ABI: `6.14.0-1018-oem` -> ('oem', 1018)."""
        m = re.match(r"\d+\.\d+\.\d+-(\d+)-([a-z][a-z0-9-]*)$", self.release)
        return m.group(2) if m else None

    @property
    def abi(self) -> int | None:
        m = re.match(r"\d+\.\d+\.\d+-(\d+)-[a-z]", self.release)
        return int(m.group(1)) if m else None


def _vtuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def read_kernel(root: Root) -> Kernel | None:
    text = read(root, "/proc/sys/kernel/osrelease")
    if text and re.match(r"\d+\.\d+", text.strip()):
        return Kernel(text.strip(), "/proc/sys/kernel/osrelease")
    text = read(root, "/proc/version")
    m = re.match(r"Linux version (\d+\.\d+\S*)", text or "")
    if m:
        return Kernel(m.group(1), "/proc/version")
    if root.is_host:
        return Kernel(os.uname().release, "uname")
    return None


def meets_floor(kernel: Kernel, rule: dict) -> tuple[bool, str]:
    """(ok, evidence) for a kernel floor with Ubuntu's backport floors (HWE, OEM)."""
    v = kernel.version
    if v >= _vtuple(rule["min"])[:3]:
        return True, f"{kernel.release} >= {rule['min']}"
    flavour, abi = kernel.flavour, kernel.abi
    for name, fl in (("ubuntu_oem", ("oem",)), ("ubuntu_hwe", ("generic", "lowlatency"))):
        floor = rule.get(name)
        if not floor or flavour not in fl:
            continue
        fv = _vtuple(floor)
        if v[:2] == tuple(fv[:2]) and abi is not None and abi >= fv[3]:
            kind = "OEM" if name == "ubuntu_oem" else "HWE"
            return True, f"{kernel.release}: Ubuntu {kind} kernel with the fixes backported (>= {floor})"
    return False, f"{kernel.release} < {rule['min']}"


# -- GPU memory ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CardMemory:
    card: str  # /sys/class/drm/card1
    gtt_total: int | None
    vram_total: int | None
    gtt_used: int | None
    vram_used: int | None
    render_minor: int | None


def drm_cards(root: Root) -> list[CardMemory]:
    out = []
    for name in root.listdir("/sys/class/drm"):
        if not re.fullmatch(r"card\d+", name):
            continue
        dev = PurePosixPath("/sys/class/drm", name, "device")
        if (read(root, dev / "vendor") or "").strip() != "0x1002":
            continue
        minors = [int(n[7:]) for n in root.listdir(dev / "drm") if re.fullmatch(r"renderD\d+", n)]
        out.append(CardMemory(
            str(PurePosixPath("/sys/class/drm", name)),
            read_int(root, dev / "mem_info_gtt_total"), read_int(root, dev / "mem_info_vram_total"),
            read_int(root, dev / "mem_info_gtt_used"), read_int(root, dev / "mem_info_vram_used"),
            minors[0] if minors else None))
    return out


def apu_card(root: Root, gpus) -> CardMemory | None:
    """The DRM card of the first iGPU: by render minor, else the only AMD card."""
    igpus = [g for g in gpus if g.is_igpu and g.source != "--target"]
    if not igpus:
        return None
    cards = drm_cards(root)
    for g in igpus:
        for c in cards:
            if g.drm_render_minor is not None and c.render_minor == g.drm_render_minor:
                return c
    return cards[0] if len(cards) == 1 else None


def ttm_module(root: Root) -> str | None:
    """`amdttm` on amdgpu-dkms kernels, `ttm` on in-tree ones, None when sysfs tells nothing."""
    if root.is_dir("/sys/module/amdttm"):
        return "amdttm"
    if root.is_dir("/sys/module/ttm"):
        return "ttm"
    return None


def modprobe_pages_limits(root: Root) -> list[tuple[str, str, int]]:
    """(file, module, pages) for every `options ttm|amdttm pages_limit=N` in modprobe.d."""
    out = []
    for d in ("/etc/modprobe.d", "/usr/lib/modprobe.d", "/run/modprobe.d"):
        for name in root.listdir(d):
            if not name.endswith(".conf"):
                continue
            for line in (read(root, f"{d}/{name}") or "").splitlines():
                words = line.split("#", 1)[0].split()
                if len(words) >= 3 and words[0] == "options" and words[1] in ("ttm", "amdttm"):
                    for w in words[2:]:
                        m = re.fullmatch(r"pages_limit=(\d+)", w)
                        if m:
                            out.append((f"{d}/{name}", words[1], int(m.group(1))))
    return out


# -- firmware ---------------------------------------------------------------------------------------
# one line of debugfs `amdgpu_firmware_info` (amdgpu_debugfs_firmware_info):
# `MES feature version: 1, firmware version: 0x00000083`, `TA XGMI feature version: 0x00000000, ...`,
# `SMC feature version: 0, program: 10, firmware version: 0x0a640200 (100.2.0)`
_FW_LINE = re.compile(r"^\s*([A-Z][A-Z0-9_ ]*?) feature version: [^,\n]+,(?: program: \d+,)?"
                      r" firmware version: 0x([0-9a-fA-F]{1,8})\b", re.M)


def _fw_versions(pairs) -> dict[str, str]:
    """`{name: "0x83"}` for (name, version) pairs; 0 means "not loaded" and is left out.  The
    SMU version is derived from SMC's word as the kernel prints it (program.major.minor.debug
    bytes: 0x0a640200 -> 100.2.0)."""
    out: dict[str, str] = {}
    for name, value in pairs:
        if value:
            out[name] = f"0x{value:02x}"
    if "smc" in out:
        v = int(out["smc"], 16)
        out["smu"] = f"{(v >> 16) & 0xff}.{(v >> 8) & 0xff}.{v & 0xff}"
    return out


def parse_firmware_versions(text: str) -> dict[str, str]:
    """Every loaded firmware of debugfs `amdgpu_firmware_info` by lower-case name (`mes`,
    `mes_kiq`, `smc`, `ta_xgmi`, ...), plus `smu` and `vbios`."""
    out = _fw_versions((m.group(1).strip().lower().replace(" ", "_"), int(m.group(2), 16))
                       for m in _FW_LINE.finditer(text))
    m = re.search(r"^\s*VBIOS version: (\S+)", text, re.M)
    if m:
        out["vbios"] = m.group(1)
    return out


def parse_firmware_info(text: str) -> int | None:
    """MES firmware version from debugfs `amdgpu_firmware_info`
    (`MES feature version: 1, firmware version: 0x00000083`)."""
    mes = parse_firmware_versions(text).get("mes")
    return int(mes, 16) if mes else None


def debugfs_firmware(root: Root) -> tuple[list[tuple[str, dict[str, str]]], str | None]:
    """([(dri minor, versions)] of every readable `amdgpu_firmware_info`, None) or ([], why not)
    when debugfs cannot be listed (it needs root)."""
    base = facts()["firmware"]["debugfs"]
    try:
        names = sorted(os.listdir(root.host(base)))
    except PermissionError:
        return [], f"{base} is not readable (debugfs needs root)"
    except OSError:
        return [], f"{base} is not there (debugfs not mounted, or no root)"
    found = []
    for n in names:
        text = read(root, f"{base}/{n}/amdgpu_firmware_info")
        if text is not None:
            found.append((n, parse_firmware_versions(text)))
    return found, None


def sysfs_firmware(root: Root, card: CardMemory) -> dict[str, str]:
    """The card's `device/fw_version/<name>_fw_version` files (amdgpu_ucode.c, mode 0444, so
    readable without root; `0x%08x`) and `device/vbios_version`."""
    dev = PurePosixPath(card.card, "device")
    pairs = []
    for name in root.listdir(dev / "fw_version"):
        m = re.fullmatch(r"([a-z0-9_]+)_fw_version", name)
        text = (read(root, dev / "fw_version" / name) or "").strip() if m else ""
        if m and re.fullmatch(r"0x[0-9a-fA-F]{1,8}", text):
            pairs.append((m.group(1), int(text, 16)))
    out = _fw_versions(pairs)
    vbios = (read(root, dev / "vbios_version") or "").strip()
    if vbios and vbios.isprintable():
        out["vbios"] = vbios
    return out


def card_firmware(root: Root, card: CardMemory | None) -> dict[str, str] | None:
    """Firmware versions of one card: sysfs (any user) completed by debugfs (root); None when
    neither is readable."""
    out = sysfs_firmware(root, card) if card else {}
    found, _ = debugfs_firmware(root)
    wanted = card.card.rsplit("card", 1)[1] if card else None
    pick = [v for n, v in found if n == wanted] or ([found[0][1]] if len(found) == 1 else [])
    for key, value in (pick[0] if pick else {}).items():
        out.setdefault(key, value)
    return out or None


def read_mes(root: Root, card: CardMemory | None) -> tuple[int | None, str]:
    """(MES version, evidence); None with the reason when debugfs cannot be read."""
    base = facts()["firmware"]["debugfs"]
    listed, why = debugfs_firmware(root)
    if why:
        return None, why
    wanted = card.card.rsplit("card", 1)[1] if card else None
    found = [(n, int(v["mes"], 16)) for n, v in listed if "mes" in v]
    pick = [f for f in found if f[0] == wanted] or (found if len({m for _, m in found}) == 1 else [])
    if not pick:
        return None, (f"no MES line in {base}/*/amdgpu_firmware_info" if not found else
                      f"several GPUs in {base} and none matches the APU")
    n, mes = pick[0]
    return mes, f"{base}/{n}/amdgpu_firmware_info: MES 0x{mes:02x}"


def _dpkg_versions(root: Root, names: list[str]) -> list[tuple[str, str]]:
    text = read(root, "/var/lib/dpkg/status")
    out = []
    for stanza in (text or "").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields.get("Package") in names and fields.get("Status", "").endswith(" installed"):
            out.append((fields["Package"], fields.get("Version", "")))
    return out


def _pacman_versions(root: Root, names: list[str]) -> list[tuple[str, str]]:
    out = []
    for d in root.listdir("/var/lib/pacman/local"):
        text = read(root, f"/var/lib/pacman/local/{d}/desc") or ""
        m = re.search(r"^%NAME%\n(.+)\n\n%VERSION%\n(.+)$", text, re.M)
        if m and m.group(1) in names:
            out.append((m.group(1), m.group(2)))
    return out


def _rpm_header_strings(blob: bytes, tags: tuple[int, ...]) -> dict[int, str]:
    """String tags of an rpm header blob as stored in rpmdb.sqlite (no lead, no magic:
    be32 index count, be32 data size, 16-byte index entries (tag, type, offset, count), data)."""
    il, dl = struct.unpack(">ii", blob[:8])
    if il < 0 or dl < 0 or 8 + il * 16 + dl > len(blob):
        return {}
    data = blob[8 + il * 16: 8 + il * 16 + dl]
    out = {}
    for i in range(il):
        tag, typ, off, _count = struct.unpack(">iiii", blob[8 + i * 16: 24 + i * 16])
        if tag in tags and typ == 6 and 0 <= off < len(data):  # RPM_STRING_TYPE
            out[tag] = data[off: data.index(b"\0", off)].decode("utf-8", "replace")
    return out


def _rpm_versions(root: Root, names: list[str]) -> list[tuple[str, str]] | None:
    """From /usr/lib/sysimage/rpm/rpmdb.sqlite (rpm >= 4.16); None when there is none."""
    import sqlite3

    host = root.host("/usr/lib/sysimage/rpm/rpmdb.sqlite")
    if not host.is_file():
        return None
    out = []
    try:
        con = sqlite3.connect(host.as_uri() + "?mode=ro&immutable=1", uri=True)
        try:
            for (blob,) in con.execute("SELECT blob FROM Packages"):
                h = _rpm_header_strings(bytes(blob), (1000, 1001, 1002))
                if h.get(1000) in names:
                    out.append((h[1000], f"{h.get(1001, '?')}-{h.get(1002, '?')}"))
        finally:
            con.close()
    except (sqlite3.Error, ValueError, IndexError, struct.error):  # a damaged db: unknown
        return None
    return out


def firmware_packages(root: Root, osr: dict[str, str]) -> tuple[str, list[tuple[str, str]]] | None:
    """(package manager, [(name, version)]) of the firmware packages, None when unreadable."""
    fw = facts()["firmware"]
    if root.is_file("/var/lib/dpkg/status"):
        return "dpkg", _dpkg_versions(root, fw["dpkg"])
    if root.is_dir("/var/lib/pacman/local"):
        return "pacman", _pacman_versions(root, fw["pacman"])
    got = _rpm_versions(root, fw["rpm"])
    return ("rpm", got) if got is not None else None


def snapshot_of(version: str) -> str | None:
    """linux-firmware snapshot date of a package version: `20251125-1.fc43`, `20251125-2`,
    `20250410-2`, `20240318.git3b128b60-0ubuntu2.10` -> the leading YYYYMMDD."""
    m = re.match(r"(?:\d+:)?(20\d{6})", version)
    return m.group(1) if m else None


# -- distribution and boot loader ------------------------------------------------------------------
def os_release(root: Root) -> dict[str, str]:
    return parse_os_release(read(root, "/etc/os-release") or read(root, "/usr/lib/os-release"))


def family(osr: dict[str, str]) -> str:
    ids = {osr.get("ID", "")} | set(osr.get("ID_LIKE", "").split())
    for fam in ("pop", "fedora", "rhel", "debian", "ubuntu", "arch"):
        if fam in ids:
            return {"rhel": "fedora", "ubuntu": "debian"}.get(fam, fam)
    return "unknown"


SYSTEMD_BOOT_DIRS = ("/boot/loader/entries", "/efi/loader/entries", "/boot/efi/loader/entries")


def bootloader(root: Root, osr: dict[str, str]) -> str:
    fam = family(osr)
    if fam == "pop" and not root.is_file("/etc/default/grub"):
        return "kernelstub"
    if fam == "fedora":
        return "grubby"
    if root.is_file("/etc/default/grub"):
        return "grub"
    if any(root.is_dir(d) and any(n.endswith(".conf") for n in root.listdir(d))
           for d in SYSTEMD_BOOT_DIRS):
        return "systemd-boot"
    return "unknown"


# -- the whole picture -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Host:
    kernel: Kernel | None
    cmdline: list[str] | None
    mem_total_kib: int | None
    module: str | None
    pages_limit: int | None
    card: CardMemory | None
    os: dict[str, str]
    gpus: tuple = ()

    @property
    def gfx(self) -> set[str]:
        return {g.gfx for g in self.gpus if g.source != "--target"}

    @property
    def has_apu(self) -> bool:
        return any(g.is_igpu for g in self.gpus if g.source != "--target")


def gather(root: Root, gpus) -> Host:
    cmd = read(root, "/proc/cmdline")
    module = ttm_module(root)
    return Host(
        kernel=read_kernel(root),
        cmdline=parse_cmdline(cmd) if cmd is not None else None,
        mem_total_kib=parse_meminfo(read(root, "/proc/meminfo")),
        module=module,
        pages_limit=read_int(root, f"/sys/module/{module}/parameters/pages_limit") if module else None,
        card=apu_card(root, gpus),
        os=os_release(root),
        gpus=tuple(gpus),
    )


def tuned_profile(root: Root) -> str | None:
    """TuneD's active profile (`/etc/tuned/active_profile`, '' when none is active), None when
    the file cannot be read."""
    text = read(root, "/etc/tuned/active_profile")
    return None if text is None else text.strip()


def iommu_mode(root: Root, words: list[str] | None) -> str | None:
    """'off' (amd_iommu=off or iommu=off), 'pt' (iommu=pt: passthrough), else 'on' when an
    IOMMU unit is registered in /sys/class/iommu and 'off' when that class lists none; None
    when neither the command line nor sysfs tells."""
    for key, value in ((param_key(w), w.split("=", 1)[1] if "=" in w else "") for w in reversed(words or [])):
        if (key, value) in (("amd_iommu", "off"), ("iommu", "off"), ("iommu", "0")):
            return "off"
        if (key, value) == ("iommu", "pt"):
            return "pt"
    if not root.is_dir("/sys/class/iommu"):
        return None
    return "on" if root.listdir("/sys/class/iommu") else "off"


def fingerprint(root: Root, gpus) -> dict:
    """What a measurement's host adds beside kernel, CPU, RAM, GPUs and ROCm: the kernel command
    line, the loaded firmware, the TuneD profile, the IOMMU mode and the GPU memory (GTT, the
    VRAM carve-out).  Every field unreadable is None: this never fails a measurement."""
    cmd = read(root, "/proc/cmdline")
    words = parse_cmdline(cmd) if cmd is not None else None
    cards = drm_cards(root)
    card = apu_card(root, gpus) or (cards[0] if cards else None)
    firmware = card_firmware(root, card)
    packages = None
    if not (firmware or {}).get("mes"):  # the loaded MES tells; the package is the fallback evidence
        pk = firmware_packages(root, os_release(root))
        packages = {name: version for name, version in pk[1]} if pk and pk[1] else None
    return {"cmdline": cmd.strip() if cmd is not None else None,
            "firmware": firmware, "firmware_packages": packages,
            "tuned_profile": tuned_profile(root), "iommu": iommu_mode(root, words),
            "gtt_bytes": card.gtt_total if card else None,
            "vram_bytes": card.vram_total if card else None}


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


# -- checks ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    id: str
    status: str  # ok | warn | fail | unknown
    found: str
    message: str
    fix: str | None = None

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "found": self.found,
                "message": self.message, "fix": self.fix}


def _kernel_checks(h: Host) -> list[Check]:
    out: list[Check] = []
    f = facts()
    for gfx, rule in f["kernel"].items():
        if gfx not in h.gfx:
            continue
        if h.kernel is None:
            out.append(Check("kernel.floor", "unknown", "no /proc/sys/kernel/osrelease or /proc/version",
                             f"{gfx} needs kernel {rule['min']} or later ({rule['source']})"))
            continue
        ok, evidence = meets_floor(h.kernel, rule)
        fix = None if ok else (
            f"install kernel {rule['min']} or later (Ubuntu 24.04: the OEM kernel >= {rule['ubuntu_oem']} "
            f"or HWE >= {rule['ubuntu_hwe']}); until then amdgpu.cwsr_enable=0 is the known workaround "
            f"({f['cwsr']['source']})")
        # a warning, not a blocker: the missing fixes make compute *may* fail (AMD's words), the
        # cwsr workaround exists, and ROCm runs on such kernels for many; "fail" is for what
        # cannot work (firmware.mes)
        out.append(Check("kernel.floor", "ok" if ok else "warn", evidence,
                         f"{gfx}: {rule['why']} ({rule['source']})", fix))
    cw = f["cwsr"]
    values = param_values(h.cmdline or [], cw["param"])
    if values and h.gfx & set(cw["targets"]) and h.kernel is not None:
        # dropped only on a kernel that meets the floor, as the plan does
        fixed = all(meets_floor(h.kernel, r)[0] for g, r in f["kernel"].items() if g in h.gfx)
        found = f"{cw['param']}={values[-1]} on kernel {h.kernel.release}"
        if not fixed:
            out.append(Check("kernel.cwsr", "ok", found,
                             f"the MES-hang workaround for kernels before 6.18-rc6 is set ({cw['source']})"))
        elif values[-1] == "0":
            out.append(Check("kernel.cwsr", "warn", found,
                             f"only needed on kernels before 6.18-rc6 ({cw['source']}); it turns off "
                             "compute wave save/restore (preemption)",
                             f"remove {cw['param']}=0 (`rocforge host plan` does)"))
    return out


def _firmware_check(root: Root, h: Host) -> list[Check]:
    fw = facts()["firmware"]
    if not h.gfx & set(fw["targets"]):
        return []
    bad = set(fw["bad_mes"])
    mes, evidence = read_mes(root, h.card)
    why = (f"MES 0x{min(bad):02x} (linux-firmware {fw['bad_snapshots'][0]}) hangs or page-faults ROCm "
           f"on Strix Halo; MES 0x{fw['good_mes']:02x} works ({fw['source']})")
    fix = f"go back to linux-firmware {fw['good_snapshot']} (`rocforge host plan` prints the steps)"
    if mes is not None:
        return [Check("firmware.mes", "fail" if mes in bad else "ok", evidence, why,
                      fix if mes in bad else None)]
    pk = firmware_packages(root, h.os)
    if pk is None or not pk[1]:
        return [Check("firmware.mes", "unknown", evidence + "; no firmware package version readable",
                      why, "run `sudo grep MES /sys/kernel/debug/dri/*/amdgpu_firmware_info`")]
    manager, pkgs = pk
    listed = ", ".join(f"{n} {v}" for n, v in pkgs)
    if any(snapshot_of(v) in fw["bad_snapshots"] for _, v in pkgs):
        return [Check("firmware.mes", "fail", f"{manager}: {listed}", why, fix)]
    return [Check("firmware.mes", "unknown", f"{evidence}; {manager}: {listed}",
                  why + "; the package is not the known-bad snapshot, but distributions patch "
                  "firmware, so only the loaded MES version tells",
                  "run `sudo grep MES /sys/kernel/debug/dri/*/amdgpu_firmware_info` "
                  "(or `sudo rocforge doctor`)")]


def uma_freed(card: CardMemory | None) -> int:
    """Bytes the OS gets back once the BIOS UMA carve-out is lowered to its minimum (0 when it is
    already small or unreadable).  The carve-out is not in MemTotal, so a GTT sized from today's
    MemTotal would leave that RAM unused after the firmware-setup step the plan asks for."""
    u = facts()["uma"]
    vram = card.vram_total if card else None
    if vram is None or vram <= u["warn_above_gib"] * GIB:
        return 0
    return max(0, vram - u["recommended_mib"] * MIB)


def ram_basis(mem_total_kib: int, freed: int) -> tuple[float, str]:
    """(GiB of RAM the GTT is sized from, where that figure comes from): MemTotal, plus what the
    UMA step frees when the plan has one."""
    total = mem_total_kib / (1 << 20) + freed / GIB
    if not freed:
        return total, f"{total:.1f} GiB of RAM (MemTotal in /proc/meminfo)"
    u = facts()["uma"]
    return total, (f"{total:.1f} GiB of RAM once the UMA carve-out is at its "
                   f"{u['recommended_mib']} MB minimum (MemTotal in /proc/meminfo "
                   f"{mem_total_kib / (1 << 20):.1f} GiB + {freed / GIB:.1f} GiB freed from "
                   "mem_info_vram_total)")


def check_reserve(reserve_gib: float, mem_total_kib: int | None, freed: int = 0) -> None:
    """`--reserve` must be a finite size >= 0 and leave at least 1 GiB of the RAM for the GPU:
    nan, inf or a negative number would turn into a nonsense pages_limit."""
    if mem_total_kib is None:
        where, total = "this machine's RAM (MemTotal in /proc/meminfo is unreadable)", None
    else:
        total, where = ram_basis(mem_total_kib, freed)
    if not math.isfinite(reserve_gib) or reserve_gib < 0:
        raise UsageError(f"--reserve {reserve_gib:g} is not a size in GiB: give a finite number "
                         f"from 0 to below {where}", "give the GiB to keep for the CPU, e.g. 4")
    if total is not None and total - reserve_gib < 1:
        raise UsageError(f"--reserve {reserve_gib:g} GiB leaves no GPU memory: this machine has "
                         f"{where}", "give a smaller --reserve")


def target_gib(mem_total_kib: int, reserve_gib: float, freed: int = 0) -> int:
    """Whole GiB of GTT: the RAM (after the UMA step, see `uma_freed`) minus the reserve, rounded
    down."""
    check_reserve(reserve_gib, mem_total_kib, freed)
    return int(ram_basis(mem_total_kib, freed)[0] - reserve_gib)


def _memory_checks(root: Root, h: Host) -> list[Check]:
    if not h.has_apu:
        return []
    m = facts()["memory"]
    out: list[Check] = []
    card = h.card
    gtt = card.gtt_total if card else None
    ram = h.mem_total_kib * 1024 if h.mem_total_kib else None
    if gtt is None or ram is None:
        missing = [p for p, v in (("/proc/meminfo MemTotal", ram),
                                  ((card.card if card else "/sys/class/drm/card*")
                                   + "/device/mem_info_gtt_total", gtt)) if v is None]
        out.append(Check("memory.gtt", "unknown", "unreadable: " + ", ".join(missing),
                         f"GTT (the GPU's share of RAM) defaults to ~50 % of RAM ({m['source']})"))
    else:
        limit = f"{h.module}.pages_limit {h.pages_limit}" if h.pages_limit else "pages_limit unreadable"
        found = f"GTT {gib(gtt)} of {gib(ram)} RAM ({gtt / ram:.0%}; {limit})"
        if h.pages_limit and h.pages_limit * 4096 < gtt:  # amdgpu.gttsize above the TTM limit
            gtt = h.pages_limit * 4096
            found += f", but TTM caps GPU allocations at {gib(gtt)}"
        share = gtt / ram
        try:
            want = target_gib(h.mem_total_kib, m["default_reserve_gib"], uma_freed(card))
        except UsageError:
            want = None
        if share < m["low_fraction"] and want:
            out.append(Check(
                "memory.gtt", "warn", found,
                f"the GPU can use only {gib(gtt)}: GTT is at the kernel default of ~50 % of RAM "
                f"({m['source']})",
                f"{h.module or 'ttm'}.pages_limit={want * m['pages_per_gib']} ({want} GiB x "
                f"{m['pages_per_gib']}"
                + ("; sized for the RAM after the UMA carve-out is lowered, see memory.uma"
                   if uma_freed(card) else "")
                + "); `rocforge host plan` prints the change for this boot loader"))
        else:
            out.append(Check("memory.gtt", "ok", found, "GTT is raised above the kernel default"))
    words = h.cmdline or []
    gtts = param_values(words, m["gttsize_param"])
    if h.cmdline is None:
        out.append(Check("memory.gttsize", "unknown", "/proc/cmdline unreadable",
                         f"{m['gttsize_param']} is deprecated ({m['gttsize_source']})"))
    elif gtts:
        out.append(Check("memory.gttsize", "warn", f"{m['gttsize_param']}={gtts[-1]} on the command line",
                         f"deprecated, and the GTT ceiling follows ttm.pages_limit alone "
                         f"({m['gttsize_source']})", f"remove {m['gttsize_param']} (`rocforge host plan` does)"))
    configured = [("/proc/cmdline", k.split(".")[0], v) for k in ("ttm.pages_limit", "amdttm.pages_limit")
                  for v in param_values(words, k)] + modprobe_pages_limits(root)
    if configured and h.module:
        wrong = sorted({f"{mod}.pages_limit ({where})" for where, mod, _ in configured if mod != h.module})
        if wrong:
            out.append(Check("memory.ttm_module", "warn", ", ".join(wrong) + f"; loaded: {h.module}",
                             f"amdgpu uses the {h.module} module here, so a {', '.join(wrong)} setting "
                             f"is ignored ({m['amdttm_source']})",
                             f"set {h.module}.pages_limit instead (`rocforge host plan` does)"))
    u = facts()["uma"]
    vram = card.vram_total if card else None
    if vram is None:
        out.append(Check("memory.uma", "unknown", "mem_info_vram_total unreadable",
                         f"a BIOS UMA carve-out of {u['recommended_mib']} MB is recommended ({u['source']})"))
    elif vram > u["warn_above_gib"] * GIB:
        out.append(Check("memory.uma", "warn", f"VRAM carve-out {gib(vram)}",
                         f"RAM reserved as VRAM in the BIOS is RAM the GTT cannot use ({u['source']})",
                         f"set the BIOS UMA frame buffer size to {u['recommended_mib']} MB and raise "
                         "the GTT instead"))
    else:
        out.append(Check("memory.uma", "ok", f"VRAM carve-out {gib(vram)}", "small carve-out: RAM stays with the GTT"))
    for key, vals in _duplicates(words).items():
        out.append(Check("cmdline.duplicates", "warn", f"{key} given {len(vals)} times: {', '.join(vals)}",
                         "the kernel uses the last one; the others mislead whoever reads the command line",
                         f"keep one {key} (`rocforge host plan` rewrites it)"))
    return out


def _duplicates(words: list[str]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for w in words:
        if "." in param_key(w):  # module parameters (the ones rocforge cares about)
            seen.setdefault(param_key(w), []).append(w.split("=", 1)[1] if "=" in w else "")
    return {k: v for k, v in seen.items() if len(v) > 1 and len(set(v)) > 1}


def _tuned_check(root: Root, h: Host) -> list[Check]:
    if not h.has_apu:
        return []
    t = facts()["tuned"]
    active = tuned_profile(root)
    if active is None:
        if root.is_dir("/etc/tuned"):
            return [Check("tuned.profile", "unknown", "/etc/tuned/active_profile unreadable",
                          f"TuneD {t['profile']}: {t['gain']} ({t['source']})")]
        return [Check("tuned.profile", "warn", "TuneD not installed (no /etc/tuned)",
                      f"TuneD {t['profile']}: {t['gain']} ({t['source']})",
                      f"install tuned, then `sudo tuned-adm profile {t['profile']}`")]
    name = active or "(none)"
    if t["profile"] in name.split():
        return [Check("tuned.profile", "ok", f"TuneD profile {name}", f"{t['gain']} ({t['source']})")]
    return [Check("tuned.profile", "warn", f"TuneD profile {name}",
                  f"{t['profile']}: {t['gain']} ({t['source']})", f"sudo tuned-adm profile {t['profile']}")]


def _vulkan_check(root: Root, h: Host) -> list[Check]:
    if not h.gfx:
        return []
    v = facts()["vulkan"]
    names = {n for d in v["icd_dirs"] for n in root.listdir(d)}
    radv = sorted(names & set(v["radv"]))
    amdvlk = sorted(names & set(v["amdvlk"]))
    if amdvlk:
        return [Check("vulkan.icd", "warn", "AMDVLK: " + ", ".join(amdvlk) + ("; RADV too" if radv else ""),
                      v["why"], "remove AMDVLK (amdvlk package) and use RADV (Mesa)")]
    if radv:
        return [Check("vulkan.icd", "ok", "RADV: " + ", ".join(radv), "Mesa's RADV is the Vulkan driver to use")]
    return []


def checks(root: Root, gpus) -> list[Check]:
    """Only the checks that apply: APU checks on an APU, per-target floors on that target."""
    h = gather(root, gpus)
    return [*_kernel_checks(h), *_firmware_check(root, h), *_memory_checks(root, h),
            *_tuned_check(root, h), *_vulkan_check(root, h)]


_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "dim"}


def blockers(found: list[Check]) -> list[str]:
    """The checks at "fail", as `rocforge doctor` problems: "fail" means ROCm is not usable here
    (a kernel without the KFD fixes, MES firmware that hangs); what only costs speed or memory is
    a "warn" and never blocks."""
    return [f"{c.id}: {c.found}: {c.message}" + (f"; fix: {c.fix}" if c.fix else "")
            for c in found if c.status == "fail"]


def text_lines(found: list[Check]) -> list[str]:
    """`rocforge doctor`'s host section as rich-markup lines (doctor prints them)."""
    from rich.markup import escape as esc  # found/message/fix are data: a `[` is not markup

    out = ["[bold]Host[/]" if found else "[bold]Host[/]: no host checks apply (no AMD GPU found)"]
    for c in found:
        out.append(f"[{_STYLE[c.status]}]{c.status:>7}[/] {c.id}: {esc(c.found)}")
        if c.status != "ok":
            out.append(f"          {esc(c.message)}")
            if c.fix:
                out.append(f"          fix: {esc(c.fix)}")
    return out


def gpu_memory_note(root: Root, gpus) -> str | None:
    """One line on the GPU memory an APU (and a container on this host) gets, or None."""
    h = gather(root, gpus)
    if not h.has_apu or h.card is None or h.card.gtt_total is None:
        return None
    ram = f" of {gib(h.mem_total_kib * 1024)} RAM" if h.mem_total_kib else ""
    gtt = h.card.gtt_total
    if h.pages_limit and h.pages_limit * 4096 < gtt:
        gtt, ram = h.pages_limit * 4096, ram + f" ({h.module}.pages_limit caps the GTT)"
    note = f"GPU memory: GTT {gib(gtt)}{ram}"
    if h.mem_total_kib and gtt / (h.mem_total_kib * 1024) < facts()["memory"]["low_fraction"]:
        note += " (the kernel default, ~50 % of RAM; `rocforge host plan` raises it)"
    return note


def env_note(root: Root, gpus) -> str | None:
    """The comment `rocforge env` adds on an APU: only the GTT total, a sysfs value that is fixed
    until the next boot, so the env cache stays valid (its file is recorded by content)."""
    from rocforge_build.discover.envcache import touch

    if not any(g.is_igpu for g in gpus if g.source != "--target"):
        return None
    touch(root.host("/sys/class/drm"))
    card = apu_card(root, gpus)
    if card is None:
        return None
    touch(root.host(card.card + "/device/mem_info_gtt_total"), content=True)
    if card.gtt_total is None:
        return None
    return (f"GPU memory: GTT {gib(card.gtt_total)} (the RAM this iGPU may use, here and in "
            "containers on this host); `rocforge doctor` checks it, `rocforge host plan` raises it")


# -- the plan --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    id: str
    why: str
    commands: tuple[str, ...]
    optional: bool = False  # printed commented out: an alternative or a trade-off

    def to_json(self) -> dict:
        return {"id": self.id, "why": self.why, "commands": list(self.commands), "optional": self.optional}


@dataclass(frozen=True)
class Plan:
    pages_limit: int | None
    gtt_gib: int | None
    module: str | None
    bootloader: str
    add: tuple[str, ...]
    remove: tuple[str, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = field(default=())
    ram_gib: float | None = None
    reserve_gib: float | None = None
    gtt_ram_gib: float | None = None  # the RAM the GTT is sized from (after the UMA step)

    def to_json(self) -> dict:
        return {"pages_limit": self.pages_limit, "gtt_gib": self.gtt_gib, "module": self.module,
                "bootloader": self.bootloader, "ram_gib": self.ram_gib, "reserve_gib": self.reserve_gib,
                "gtt_ram_gib": self.gtt_ram_gib,
                "kernel_args": {"add": list(self.add), "remove": list(self.remove)},
                "steps": [s.to_json() for s in self.steps], "notes": list(self.notes)}


def _configured_words(root: Root, boot: str) -> list[str]:
    """Words of the boot loader's own configuration (what the next boot will use)."""
    words: list[str] = []
    if boot == "grub":
        for _, value in grub_lines(read(root, "/etc/default/grub") or ""):
            words += value.split()
    elif boot == "systemd-boot":
        for _, text in systemd_boot_entries(root):
            for line in text.splitlines():
                if line.startswith("options"):
                    words += line.split()[1:]
    return words


def grub_lines(text: str) -> list[tuple[str, str]]:
    """(variable, value) of GRUB_CMDLINE_LINUX(_DEFAULT) lines, shell-unquoted."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(.*)$", line)
        if m:
            try:
                value = " ".join(shlex.split(m.group(2)))
            except ValueError:
                value = m.group(2).strip("\"'")
            out.append((m.group(1), " ".join(parse_cmdline(value))))
    return out


def systemd_boot_entries(root: Root) -> list[tuple[str, str]]:
    out = []
    for d in SYSTEMD_BOOT_DIRS:
        for n in root.listdir(d):
            if n.endswith(".conf"):
                text = read(root, f"{d}/{n}")
                if text is not None:
                    out.append((f"{d}/{n}", text))
    return out


def _rewrite(words: list[str], remove: set[str], keys: set[str], add: list[str]) -> list[str]:
    kept = [w for w in words if w not in remove and param_key(w) not in keys]
    return kept + [a for a in add if a not in kept]


def _sed_line(path: str, var_regex: str, new_line: str) -> str:
    repl = new_line.replace("\\", "\\\\").replace("&", "\\&").replace("|", "\\|")
    return f"sudo sed -i.rocforge.bak {shlex.quote(f's|^{var_regex}.*|{repl}|')} {shlex.quote(path)}"


def _boot_commands(root: Root, boot: str, add: list[str], remove: list[str], keys: set[str]) -> tuple[str, ...]:
    rm = set(remove)
    if boot == "grubby":
        parts = ["sudo grubby --update-kernel=ALL"]
        if remove:
            parts.append(f"--remove-args={shlex.quote(' '.join(remove))}")
        if add:
            parts.append(f"--args={shlex.quote(' '.join(add))}")
        return (" ".join(parts),)
    if boot == "kernelstub":
        return tuple([f"sudo kernelstub -d {shlex.quote(w)}" for w in remove] +
                     [f"sudo kernelstub -a {shlex.quote(w)}" for w in add])
    if boot == "grub":
        text = read(root, "/etc/default/grub") or ""
        lines = dict(grub_lines(text))
        cmds = []
        for var in ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT"):
            if var not in lines:
                continue
            new = _rewrite(lines[var].split(), rm, keys, add if var == "GRUB_CMDLINE_LINUX_DEFAULT" else [])
            if new != lines[var].split():
                cmds.append(_sed_line("/etc/default/grub", f"{var}=", f'{var}="{" ".join(new)}"'))
        if "GRUB_CMDLINE_LINUX_DEFAULT" not in lines and add:
            line = f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {" ".join(add)}"'
            cmds.append(f"echo {shlex.quote(line)} | sudo tee -a /etc/default/grub")
        return (*cmds, "sudo update-grub")
    if boot == "systemd-boot":
        cmds = []
        for path, text in systemd_boot_entries(root):
            for line in text.splitlines():
                if line.startswith("options"):
                    words = line.split()[1:]
                    new = _rewrite(words, rm, keys, add)
                    if new != words:
                        cmds.append(_sed_line(path, "options[[:space:]]", "options " + " ".join(new)))
        kc = read(root, "/etc/kernel/cmdline")
        if kc is not None:
            new = _rewrite(kc.split(), rm, keys, add)
            if new != kc.split():
                cmds.append(f"echo {shlex.quote(' '.join(new))} | sudo tee /etc/kernel/cmdline")
        return tuple(cmds)
    return tuple(comment(f"add to the kernel command line by hand: {w}") for w in add) + \
        tuple(comment(f"remove from the kernel command line by hand: {w}") for w in remove)


def _initramfs(fam: str) -> str:
    return {"debian": "sudo update-initramfs -u", "pop": "sudo update-initramfs -u",
            "fedora": "sudo dracut -f", "arch": "sudo mkinitcpio -P"}.get(
        fam, "# regenerate the initramfs with your distribution's tool")


def plan(root: Root, gpus, reserve_gib: float | None = None) -> Plan:
    f = facts()
    m = f["memory"]
    h = gather(root, gpus)
    osr = h.os
    fam = family(osr)
    boot = bootloader(root, osr)
    reserve = m["default_reserve_gib"] if reserve_gib is None else reserve_gib
    steps: list[Step] = []
    notes: list[str] = []
    add: list[str] = []
    remove: list[str] = []
    pages = want = None
    module = h.module
    freed = uma_freed(h.card) if h.has_apu else 0
    if reserve_gib is not None:  # checked even where no GTT is planned: a bad flag is never ignored
        check_reserve(reserve_gib, h.mem_total_kib, freed)
    if h.has_apu:
        if h.mem_total_kib is None:
            raise DetectionError("cannot read MemTotal from /proc/meminfo",
                                 "the GTT size is computed from it; check that /proc is mounted")
        want = target_gib(h.mem_total_kib, reserve, freed)
        if freed:
            steps.append(_uma_step(h.card))
        pages = want * m["pages_per_gib"]
        module = module or "ttm"
        target = f"{module}.pages_limit={pages}"
        words = list(h.cmdline or []) + _configured_words(root, boot)
        keys = {"ttm.pages_limit", "amdttm.pages_limit", m["gttsize_param"]}
        for w in dict.fromkeys(words):
            k = param_key(w)
            if k == m["gttsize_param"].replace("-", "_") or (k in keys and w != target):
                remove.append(w)
        if h.kernel is not None and any(meets_floor(h.kernel, r)[0] for g, r in f["kernel"].items() if g in h.gfx):
            remove += [w for w in dict.fromkeys(words) if param_key(w) == "amdgpu.cwsr_enable" and w.endswith("=0")]
        counts = [w for w in words if w == target]
        live_ok = h.pages_limit == pages
        if (not counts and not live_ok) or remove:
            add.append(target)
        if add or remove:
            why = _gtt_why(h.mem_total_kib, freed, reserve, want, pages, module)
            if any(param_key(w) == m["gttsize_param"] for w in remove):
                why += f"; {m['gttsize_param']} removed ({m['gttsize_source']})"
            steps.append(Step("kernel-args", why,
                              _boot_commands(root, boot, add, remove, {param_key(w) for w in remove})))
            conf = m["modprobe_file"].format(module=module)
            steps.append(Step(
                "modprobe",
                f"alternative to the kernel argument: a modprobe.d file ({m['modprobe_source']}); "
                "use one or the other",
                (f"echo {shlex.quote(f'options {module} pages_limit={pages}')} | sudo tee {conf}",
                 _initramfs(fam)), optional=True))
        else:
            notes.append(f"{module}.pages_limit is already {pages} ({want} GiB): nothing to change")
        t = f["tuned"]
        active = (tuned_profile(root) or "").split()
        if t["profile"] not in active:
            cmds = []
            if not root.is_dir("/etc/tuned"):
                cmds.append({"fedora": "sudo dnf install tuned", "arch": "sudo pacman -S tuned"}.get(
                    fam, "sudo apt install tuned"))
                cmds.append("sudo systemctl enable --now tuned")
            cmds.append(f"sudo tuned-adm profile {t['profile']}")
            steps.append(Step("tuned", f"{t['gain']} ({t['source']})", tuple(cmds)))
        io = f["iommu"]
        if io["arg"] not in (h.cmdline or []):
            whole = boot in ("grub", "systemd-boot")  # these rewrite whole lines: keep the change above
            steps.append(Step("iommu", f"trade-off, not a default: {io['gain']}; but it {io['cost']}",
                              _boot_commands(root, boot, [*add, io["arg"]] if whole else [io["arg"]],
                                             remove if whole else [], {param_key(w) for w in remove}
                                             if whole else set()), optional=True))
        notes.append(f"llama.cpp on this iGPU: {f['llama_igpu']['advice']} ({f['llama_igpu']['source']})")
    steps += _firmware_steps(root, h, fam)
    notes += [f"{c.found}: {c.fix}" for c in _kernel_checks(h) if c.status != "ok" and c.fix]
    if steps and any(not s.optional for s in steps):
        notes.append("reboot for kernel arguments and firmware to take effect"
                     + (" (and enter the firmware setup on the way, for the UMA step)" if freed else "")
                     + "; rocforge changed nothing")
    if not h.gfx:
        notes.insert(0, "no AMD GPU found (KFD topology): nothing to plan")
    elif not h.has_apu:
        notes.insert(0, "no APU found: the GTT settings do not apply (a discrete GPU has its own VRAM)")
    return Plan(pages, want, module if h.has_apu else h.module, boot, tuple(add), tuple(remove),
                tuple(steps), tuple(notes),
                round(h.mem_total_kib / (1 << 20), 2) if h.mem_total_kib else None,
                reserve if h.has_apu else None,
                round(ram_basis(h.mem_total_kib, freed)[0], 2) if h.has_apu else None)


def _gtt_why(mem_total_kib: int, freed: int, reserve: float, want: int, pages: int, module: str) -> str:
    """The arithmetic of the GTT size, with the RAM it starts from (see `ram_basis`)."""
    m = facts()["memory"]
    total, where = ram_basis(mem_total_kib, freed)
    why = (f"GTT = {want} GiB ({total:.1f} GiB RAM - {reserve:g} GiB reserve) = {want} x "
           f"{m['pages_per_gib']} = {pages} pages of 4 KiB for {module} ({m['source']})")
    if freed:
        why += (f"; the RAM is {where}: sized for the machine after the firmware-setup step, "
                "since today's MemTotal lacks the carve-out")
    return why


def _uma_step(card: CardMemory) -> Step:
    """The firmware-setup (BIOS/UEFI) step: no command can do it, so the script says it in a
    comment, with the carve-out found and the source."""
    u = facts()["uma"]
    return Step("firmware-setup",
                f"the BIOS UMA carve-out holds {gib(card.vram_total)} of RAM as VRAM "
                f"({card.card}/device/mem_info_vram_total), RAM that neither the CPU nor the GTT can "
                f"use ({u['step_source']})",
                ("# " + u["step"].format(mib=u["recommended_mib"]),))


def _firmware_steps(root: Root, h: Host, fam: str) -> list[Step]:
    fw = facts()["firmware"]
    failing = [c for c in _firmware_check(root, h) if c.status == "fail"]
    if not failing:
        return []
    why = f"{failing[0].found}: {failing[0].message}"
    if fam == "fedora":
        return [Step("firmware-rollback", f"{why}; {fw['fedora_rollback_source']}", tuple(fw["fedora_rollback"]))]
    good = fw["good_snapshot"]
    if fam in ("debian", "pop"):
        pk = firmware_packages(root, h.os)
        names = [n for n, _ in (pk[1] if pk else [])] or fw["dpkg"][:1]
        cmds = []
        for n in names:
            cmds += [f"apt-cache policy {n}  # pick a version older than {fw['bad_snapshots'][0]}",
                     f"sudo apt install {n}=VERSION", f"sudo apt-mark hold {n}"]
        return [Step("firmware-rollback", why, (*cmds, "sudo update-initramfs -u"))]
    if fam == "arch":
        return [Step("firmware-rollback", why, (
            f"sudo pacman -U /var/cache/pacman/pkg/linux-firmware-amdgpu-{good}-*.pkg.tar.zst",
            "sudo mkinitcpio -P"))]
    return [Step("firmware-rollback", why, (f"# install linux-firmware {good} with your package manager",))]


# -- the script --------------------------------------------------------------------------------------
MARKER = "# rocforge host plan:"


def _commented(command: str) -> str:
    """An optional step's command, commented out line by line: a line break inside it (a quoted
    word read from the system's files) must not start a live line."""
    return "\n".join(ln if ln.startswith("#") else "# " + ln for ln in command.split("\n"))


def render_script(p: Plan) -> str:
    lines = ["#!/bin/sh", f"{MARKER} review every line before running it; rocforge changes nothing itself.",
             "set -eu"]
    if p.pages_limit:
        lines.append(comment(f"{p.module}.pages_limit={p.pages_limit} ({p.gtt_gib} GiB x 262144), "
                             f"boot loader: {p.bootloader}"))
    for s in p.steps:
        lines.append("")
        lines.append(comment(f"{s.id}{' (optional, commented out)' if s.optional else ''}: {s.why}"))
        for c in s.commands:
            lines.append(_commented(c) if s.optional else c)
    if p.notes:
        lines.append("")
        lines += [comment(f"note: {n}") for n in p.notes]
    return "\n".join(lines) + "\n"


def write_script(path: str, text: str) -> None:
    """Write the script; never over a file rocforge did not write."""
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--write {path} is a directory", "give a file name")
    if target.exists() or target.is_symlink():
        try:
            head = target.read_text(encoding="utf-8", errors="replace")[:4096]
        except OSError as exc:
            raise UsageError(f"--write {path}: cannot read the existing file ({exc.strerror})",
                             "choose another file name") from exc
        if not any(line.startswith(MARKER) for line in head.splitlines()[:3]):
            raise UsageError(f"--write {path}: the file exists and was not written by rocforge",
                             "choose another file name; rocforge never overwrites your files")
    import tempfile

    tmp = None
    try:  # a fresh temporary name (O_EXCL): never written through a file or link someone else made
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".rocforge-tmp",
                                    dir=target.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise UsageError(f"--write {path}: {exc.strerror}", "choose a writable location") from exc
