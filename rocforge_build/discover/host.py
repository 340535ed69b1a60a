"""Host facts: what the kernel, its command line, the firmware and the memory settings of this
machine (or `--root`) are, read for the host checks (`host_checks.py`) and the host plan
(`host_plan.py`).

Facts live in `data/host.toml`, each with its public source.  Everything is read from files in
the formats the kernel and the distributions write them (`/proc/meminfo`, `/proc/cmdline`,
`/sys/class/drm/card*/device/mem_info_*`, `/sys/module/{ttm,amdttm}/parameters/pages_limit`,
debugfs `amdgpu_firmware_info`, dpkg status, the rpm sqlite database, pacman's local database,
`/etc/default/grub`, systemd-boot entries, `/etc/tuned/active_profile`, `/etc/os-release`).
A file that is missing, unreadable or garbage reads as None; nothing is guessed.
"""

from __future__ import annotations

import os
import re
import struct
from functools import cache

from rocforge_build.records import Record, init
from rocforge_build.resources import load_toml, package_data
from rocforge_build.rootfs import Root, open_regular

GIB = 1 << 30
MIB = 1 << 20
_MAX_READ = 1 << 20


@cache
def facts() -> dict:
    return load_toml(package_data("host.toml"), "host facts")


# -- reading ---------------------------------------------------------------------------------------
def read(root: Root, inner: str | os.PathLike[str]) -> str | None:
    """A small text file of the root, or None when missing or unreadable (no root for debugfs)."""
    try:
        with open_regular(root.host_str(inner)) as f:
            return f.read(_MAX_READ).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def read_int(root: Root, inner: str | os.PathLike[str]) -> int | None:
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
    import shlex  # not on `rocforge env`'s path

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
class Kernel(Record):
    __slots__ = ("release", "where")

    def __init__(self, release: str,  # uname -r
                 where: str):
        init(self, release, where)

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
class CardMemory(Record):
    __slots__ = ("card", "gtt_total", "vram_total", "gtt_used", "vram_used", "render_minor")

    def __init__(self, card: str,  # /sys/class/drm/card1
                 gtt_total: int | None, vram_total: int | None, gtt_used: int | None,
                 vram_used: int | None, render_minor: int | None):
        init(self, card, gtt_total, vram_total, gtt_used, vram_used, render_minor)


def drm_cards(root: Root) -> list[CardMemory]:
    out = []
    for name in root.listdir("/sys/class/drm"):
        if not re.fullmatch(r"card\d+", name):
            continue
        dev = f"/sys/class/drm/{name}/device"
        if (read(root, f"{dev}/vendor") or "").strip() != "0x1002":
            continue
        minors = [int(n[7:]) for n in root.listdir(f"{dev}/drm") if re.fullmatch(r"renderD\d+", n)]
        out.append(CardMemory(
            f"/sys/class/drm/{name}",
            read_int(root, f"{dev}/mem_info_gtt_total"), read_int(root, f"{dev}/mem_info_vram_total"),
            read_int(root, f"{dev}/mem_info_gtt_used"), read_int(root, f"{dev}/mem_info_vram_used"),
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
# (a pattern for re.finditer, compiled on first use: `rocforge env` never reads firmware)
_FW_LINE = (r"(?m)^\s*([A-Z][A-Z0-9_ ]*?) feature version: [^,\n]+,(?: program: \d+,)?"
            r" firmware version: 0x([0-9a-fA-F]{1,8})\b")


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
                       for m in re.finditer(_FW_LINE, text))
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
        names = sorted(os.listdir(root.host_str(base)))
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
    dev = f"{card.card}/device"
    pairs = []
    for name in root.listdir(f"{dev}/fw_version"):
        m = re.fullmatch(r"([a-z0-9_]+)_fw_version", name)
        text = (read(root, f"{dev}/fw_version/{name}") or "").strip() if m else ""
        if m and re.fullmatch(r"0x[0-9a-fA-F]{1,8}", text):
            pairs.append((m.group(1), int(text, 16)))
    out = _fw_versions(pairs)
    vbios = (read(root, f"{dev}/vbios_version") or "").strip()
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
class Host(Record):
    __slots__ = ("kernel", "cmdline", "mem_total_kib", "module", "pages_limit", "card", "os",
                 "gpus")

    def __init__(self, kernel: Kernel | None, cmdline: list[str] | None,
                 mem_total_kib: int | None, module: str | None, pages_limit: int | None,
                 card: CardMemory | None, os: dict[str, str], gpus: tuple = ()):
        init(self, kernel, cmdline, mem_total_kib, module, pages_limit, card, os, gpus)

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


def env_note(root: Root, gpus) -> str | None:
    """The comment `rocforge env` adds on an APU: only the GTT total, a sysfs value that is fixed
    until the next boot, so the env cache stays valid (its file is recorded by content)."""
    from rocforge_build.discover.envcache import touch

    if not any(g.is_igpu for g in gpus if g.source != "--target"):
        return None
    touch(root.host_str("/sys/class/drm"))
    card = apu_card(root, gpus)
    if card is None:
        return None
    touch(root.host_str(card.card + "/device/mem_info_gtt_total"), content=True)
    if card.gtt_total is None:
        return None
    return (f"GPU memory: GTT {gib(card.gtt_total)} (the RAM this iGPU may use, here and in "
            "containers on this host); `rocforge doctor` checks it, `rocforge host plan` raises it")
