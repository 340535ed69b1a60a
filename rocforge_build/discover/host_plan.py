"""The host plan: the commands that fix what the host checks (`host_checks.py`) found, for this
machine's boot loader and distribution, as a script for a person to review.  rocforge never
changes the host: `plan()` only returns commands, and `write_script` never writes over a file
rocforge did not write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rocforge_build import shellsafe
from rocforge_build.discover.host import (
    SYSTEMD_BOOT_DIRS,
    CardMemory,
    Host,
    bootloader,
    facts,
    family,
    firmware_packages,
    gather,
    gib,
    meets_floor,
    param_key,
    parse_cmdline,
    read,
    tuned_profile,
)
from rocforge_build.discover.host_checks import (
    check_reserve,
    firmware_check,
    kernel_checks,
    ram_basis,
    target_gib,
    uma_freed,
)
from rocforge_build.emit import kernel_cmdline
from rocforge_build.emit.sh_assignments import Absent, Simple, Unclear
from rocforge_build.errors import DetectionError
from rocforge_build.rootfs import Root, open_regular
from rocforge_build.shellsafe import comment


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
    by_hand: tuple[str, ...] = ()  # changes left to the user: the CLI says each on stderr

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
        for _, value in kernel_cmdline.grub_lines(_grub_bytes(root) or b""):
            words += parse_cmdline(value or "")
    elif boot == "systemd-boot":
        for _, text in systemd_boot_entries(root):
            for line in text.split("\n"):  # as systemd-boot reads an entry
                if line.startswith("options"):
                    words += parse_cmdline(line[len("options"):])
    return words


def grub_lines(text: str) -> list[tuple[str, str | None]]:
    """(variable, kernel words joined by spaces) of the kernel command-line lines of
    /etc/default/grub; None where the line needs the shell to compute its value."""
    return [(var, None if value is None else " ".join(parse_cmdline(value)))
            for var, value in kernel_cmdline.grub_lines(text)]


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


_MAX_EDIT = 1 << 20
BY_HAND = "rocforge does not edit it: edit it by hand"


def _file_bytes(root: Root, inner: str) -> bytes | None:
    """A file's bytes; None when missing or unreadable, or too big to read whole."""
    try:
        with open_regular(root.host_str(inner)) as f:
            data = f.read(_MAX_EDIT + 1)
    except (OSError, ValueError):
        return None
    return None if len(data) > _MAX_EDIT else data


def _grub_bytes(root: Root) -> bytes | None:
    return _file_bytes(root, kernel_cmdline.GRUB_FILE)


def _by_hand(where: str, why: str, add: list[str], rm: set[str]) -> str:
    """The comment that leaves a change to the user, naming it and why."""
    return comment(f"{where}: {why}; {BY_HAND} (add: {' '.join(add) or 'nothing'}; "
                   f"remove: {' '.join(sorted(rm)) or 'nothing'})")


def _line_file_text(data: bytes | None, path: str) -> tuple[str | None, str | None]:
    """(text, None) of a line-based file rocforge may rewrite, or (None, why not): bytes that are
    not UTF-8 or a carriage return would come back changed."""
    if data is None:
        return None, f"rocforge cannot read {path} whole"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "it is not valid UTF-8"
    return (None, "it has CRLF line endings") if "\r" in text else (text, None)


def _grub_overrides(root: Root, var: str) -> str | None:
    """A /etc/default/grub.d/*.cfg that names `var`: grub-mkconfig sources those after the
    file (Ubuntu's grub2 packaging), so an edit of /etc/default/grub may not be what boots."""
    d = kernel_cmdline.GRUB_FILE + ".d"
    for n in sorted(root.listdir(d)):
        text = read(root, f"{d}/{n}") if n.endswith(".cfg") else None
        if text is not None and var in text:
            return f"{d}/{n}"
    return None


def _grub_commands(root: Root, add: list[str], rm: set[str], keys: set[str]) -> tuple[str, ...]:
    """The edits of /etc/default/grub's command-line variables; a variable the file sets in a
    way `sh_assignments.find` does not understand is left to the user, in a comment naming the
    change and why (the file is neither edited nor given an overriding line)."""
    data = _grub_bytes(root)
    found = kernel_cmdline.grub_find(data if data is not None else b"")
    if data is None and root.exists(kernel_cmdline.GRUB_FILE):
        found = {v: Unclear("rocforge cannot read it whole") for v in found}
    cmds = []
    for var, f in found.items():
        wanted = add if var == kernel_cmdline.GRUB_ADD_TO else []
        over = _grub_overrides(root, var)
        if over and (wanted or isinstance(f, Simple)):
            f = Unclear(f"{over} sets it too")
        if isinstance(f, Absent) and wanted and not f.appendable:
            f = Unclear("the file does not end with a line break, so a line added at its end "
                        "would join its last line")
        if isinstance(f, Unclear):
            if wanted or rm:
                cmds.append(_by_hand(f"{kernel_cmdline.GRUB_FILE}: {var}", f.why, wanted, rm))
            continue
        if isinstance(f, Absent):
            if wanted:
                cmds.append(kernel_cmdline.grub_append(wanted))
            continue
        words = parse_cmdline(kernel_cmdline.literal(f.word) or "")
        new = _rewrite(words, rm, keys, wanted)
        if new != words:
            cmds.append(kernel_cmdline.grub_rewrite(var, f, new))
    return (*cmds, "sudo update-grub")


def _boot_commands(root: Root, boot: str, add: list[str], remove: list[str], keys: set[str]) -> tuple[str, ...]:
    rm = set(remove)
    if boot == "grubby":
        return (kernel_cmdline.grubby(add, remove),)
    if boot == "kernelstub":
        return tuple(kernel_cmdline.kernelstub(add, remove))
    if boot == "grub":
        return _grub_commands(root, add, rm, keys)
    if boot == "systemd-boot":
        return _systemd_boot_commands(root, add, rm, keys)
    return tuple(comment(f"add to the kernel command line by hand: {w}") for w in add) + \
        tuple(comment(f"remove from the kernel command line by hand: {w}") for w in remove)


def _systemd_boot_commands(root: Root, add: list[str], rm: set[str], keys: set[str]) -> tuple[str, ...]:
    """Each entry's one `options` line and /etc/kernel/cmdline, rewritten whole; an entry with
    several `options` lines (the loader joins them) or bytes rocforge cannot carry back is left
    to the user."""
    cmds = []
    for path, _ in systemd_boot_entries(root):
        text, why = _line_file_text(_file_bytes(root, path), path)
        opts = [ln for ln in (text or "").split("\n") if re.match(r"options[ \t]", ln)]
        if text is not None and len(opts) > 1:
            why = f"it has {len(opts)} options lines"
        if why:
            cmds.append(_by_hand(path, why, add, rm))
            continue
        for ln in opts:
            words = parse_cmdline(ln[len("options"):])
            new = _rewrite(words, rm, keys, add)
            if new != words:
                cmds.append(kernel_cmdline.loader_options(path, new))
    if root.exists("/etc/kernel/cmdline"):
        text, why = _line_file_text(_file_bytes(root, "/etc/kernel/cmdline"), "/etc/kernel/cmdline")
        if why:
            return (*cmds, _by_hand("/etc/kernel/cmdline", why, add, rm))
        words = parse_cmdline(text or "")
        new = _rewrite(words, rm, keys, add)
        if new != words:
            cmds.append(kernel_cmdline.kernel_cmdline_file(new))
    return tuple(cmds)


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
        add, remove = _gtt_args(root, h, boot, pages, module)
        if add or remove:
            why = _gtt_why(h.mem_total_kib, freed, reserve, want, pages, module)
            steps += _gtt_steps(root, boot, fam, add, remove, why, pages, module)
        else:
            notes.append(f"{module}.pages_limit is already {pages} ({want} GiB): nothing to change")
        steps += _tuned_step(root, fam)
        steps += _iommu_step(root, h, boot, add, remove)
        notes.append(f"llama.cpp on this iGPU: {f['llama_igpu']['advice']} ({f['llama_igpu']['source']})")
    steps += _firmware_steps(root, h, fam)
    notes += [f"{c.found}: {c.fix}" for c in kernel_checks(h) if c.status != "ok" and c.fix]
    if steps and any(not s.optional for s in steps):
        notes.append("reboot for kernel arguments and firmware to take effect"
                     + (" (and enter the firmware setup on the way, for the UMA step)" if freed else "")
                     + "; rocforge changed nothing")
    if not h.gfx:
        notes.insert(0, "no AMD GPU found (KFD topology): nothing to plan")
    elif not h.has_apu:
        notes.insert(0, "no APU found: the GTT settings do not apply (a discrete GPU has its own VRAM)")
    by_hand = tuple(c[2:] for s in steps if not s.optional for c in s.commands
                    if c.startswith("# ") and BY_HAND in c)
    return Plan(pages, want, module if h.has_apu else h.module, boot, tuple(add), tuple(remove),
                tuple(steps), tuple(notes),
                round(h.mem_total_kib / (1 << 20), 2) if h.mem_total_kib else None,
                reserve if h.has_apu else None,
                round(ram_basis(h.mem_total_kib, freed)[0], 2) if h.has_apu else None, by_hand)


def _gtt_args(root: Root, h: Host, boot: str, pages: int, module: str) -> tuple[list[str], list[str]]:
    """(kernel arguments to add, to remove) for the GTT: every other pages_limit and the
    deprecated gttsize go, as does cwsr_enable=0 on a kernel that no longer needs it; the
    target pages_limit is added unless it is already configured or live with nothing removed."""
    f = facts()
    m = f["memory"]
    add: list[str] = []
    remove: list[str] = []
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
    return add, remove


def _gtt_steps(root: Root, boot: str, fam: str, add: list[str], remove: list[str], why: str,
               pages: int, module: str) -> list[Step]:
    """The kernel-argument change for this boot loader, and the modprobe.d file as the
    commented-out alternative (one or the other, never both)."""
    m = facts()["memory"]
    if any(param_key(w) == m["gttsize_param"] for w in remove):
        why += f"; {m['gttsize_param']} removed ({m['gttsize_source']})"
    conf = m["modprobe_file"].format(module=module)
    return [Step("kernel-args", why,
                 _boot_commands(root, boot, add, remove, {param_key(w) for w in remove})),
            Step("modprobe",
                 f"alternative to the kernel argument: a modprobe.d file ({m['modprobe_source']}); "
                 "use one or the other",
                 (shellsafe.tee_line(f"options {module} pages_limit={pages}", conf),
                  _initramfs(fam)), optional=True)]


def _tuned_step(root: Root, fam: str) -> list[Step]:
    """TuneD's recommended profile, installing TuneD first where it is missing; none when the
    profile is already active."""
    t = facts()["tuned"]
    active = (tuned_profile(root) or "").split()
    if t["profile"] in active:
        return []
    cmds = []
    if not root.is_dir("/etc/tuned"):
        cmds.append({"fedora": "sudo dnf install tuned", "arch": "sudo pacman -S tuned"}.get(
            fam, "sudo apt install tuned"))
        cmds.append("sudo systemctl enable --now tuned")
    cmds.append(f"sudo tuned-adm profile {t['profile']}")
    return [Step("tuned", f"{t['gain']} ({t['source']})", tuple(cmds))]


def _iommu_step(root: Root, h: Host, boot: str, add: list[str], remove: list[str]) -> list[Step]:
    """The IOMMU argument as an optional trade-off; where the boot loader's commands rewrite
    whole lines, it carries the GTT change too so running it does not undo that step."""
    io = facts()["iommu"]
    if io["arg"] in (h.cmdline or []):
        return []
    whole = boot in ("grub", "systemd-boot")  # these rewrite whole lines: keep the change above
    return [Step("iommu", f"trade-off, not a default: {io['gain']}; but it {io['cost']}",
                 _boot_commands(root, boot, [*add, io["arg"]] if whole else [io["arg"]],
                                remove if whole else [], {param_key(w) for w in remove}
                                if whole else set()), optional=True)]


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
    failing = [c for c in firmware_check(root, h) if c.status == "fail"]
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
    lines = [shellsafe.SHEBANG, f"{MARKER} review every line before running it; rocforge changes nothing itself.",
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


def made_by_rocforge(head: bytes) -> bool:
    """Whether a file's first bytes are a script `render_script` wrote (its marker line)."""
    lines = head.decode("utf-8", errors="replace").splitlines()[:3]
    return any(line.startswith(MARKER) for line in lines)


def write_script(path: str, text: str) -> None:
    """Write the script (mode 0755); never over a file rocforge did not write, never through a
    link, never opening a FIFO or device (`replace.write_own_file`)."""
    from pathlib import Path

    from rocforge_build import replace

    replace.write_own_file(Path(path), text, "--write", made_by_rocforge, mode=0o755)
