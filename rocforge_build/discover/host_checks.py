"""Host readiness checks: what the host facts (`host.py`) mean for ROCm, as `Check`s with the
exact change that fixes each finding, and the GTT arithmetic the plan (`host_plan.py`) shares.
A fact that could not be read makes its check `unknown`; nothing is guessed.
"""

from __future__ import annotations

import math

from rocforge_build.discover.host import (
    GIB,
    MIB,
    CardMemory,
    Host,
    facts,
    firmware_packages,
    gather,
    gib,
    meets_floor,
    modprobe_pages_limits,
    param_key,
    param_values,
    read_mes,
    snapshot_of,
    tuned_profile,
)
from rocforge_build.errors import UsageError
from rocforge_build.records import Record, init
from rocforge_build.rootfs import Root

STATUSES = ("ok", "warn", "fail", "unknown")


class Check(Record):
    __slots__ = ("id", "status", "found", "message", "fix")

    def __init__(self, id: str, status: str,  # ok | warn | fail | unknown
                 found: str, message: str, fix: str | None = None):
        init(self, id, status, found, message, fix)

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "found": self.found,
                "message": self.message, "fix": self.fix}


def kernel_checks(h: Host) -> list[Check]:
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


def firmware_check(root: Root, h: Host) -> list[Check]:
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
    return [*kernel_checks(h), *firmware_check(root, h), *_memory_checks(root, h),
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
