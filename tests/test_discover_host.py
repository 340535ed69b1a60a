"""Host readiness: `rocforge doctor` host checks and `rocforge host plan`, on host roots in the
real formats (tests/host_roots.py).  Arithmetic used below, once:

- 128 GB Strix Halo: MemTotal 131752264 kB = 125.65 GiB; the kernel's default pages_limit is
  half of it, 16469033 pages (AMD's amd-ttm example: "16469033 pages (62.82 GB)"), so
  mem_info_gtt_total = 16469033 x 4096 = 67456139264 bytes = 62.8 GiB.
- The plan keeps 4 GiB: int(125.65 - 4) = 121 GiB -> 121 x 262144 = 31719424 pages;
  with --reserve 1: int(124.65) = 124 GiB -> 124 x 262144 = 32505856 (the value peers use).
- 64 GB Strix Halo: MemTotal 65382624 kB = 62.35 GiB -> 58 GiB -> 58 x 262144 = 15204352;
  its default pages_limit is 65382624 / 4 / 2 = 8172828 -> GTT 31.2 GiB.
"""

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import fixtures_roots as fr
import host_roots as hr
import pytest
from fake_engines import fake_docker
from test_commands_env import cli

from rocforge_build.discover import host, host_plan
from rocforge_build.rootfs import Root

DATA = Path(__file__).resolve().parent / "data" / "host"


def doctor_host(root):
    out = cli(root, "doctor", "--json")
    assert "Traceback" not in out.stderr and out.stdout, out.stderr
    return {c["id"]: c for c in json.loads(out.stdout)["host"]}


def plan(root, *args):
    out = cli(root, "host", "plan", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def statuses(checks):
    return {k: c["status"] for k, c in checks.items()}


def rpmdb(root, version):
    """A real rpm sqlite database (tests/data/host/make-rpmdb.sh, built with rpm 4.18)."""
    d = root / "usr/lib/sysimage/rpm"
    d.mkdir(parents=True, exist_ok=True)
    (d / "rpmdb.sqlite").write_bytes(gzip.decompress(
        (DATA / f"rpmdb-fedora43-firmware-{version}.sqlite.gz").read_bytes()))


# -- parsing ---------------------------------------------------------------------------------------
def test_cmdline_words_as_the_kernel_splits_them():
    text = ('BOOT_IMAGE=/boot/vmlinuz-6.18.4 ro  quiet dyndbg="file drm* +p" "ttm.pages_limit=1" '
            'amdgpu.cwsr-enable=0 -- --init-arg x\n')
    words = host.parse_cmdline(text)
    assert words == ["BOOT_IMAGE=/boot/vmlinuz-6.18.4", "ro", "quiet", "dyndbg=file drm* +p",
                     "ttm.pages_limit=1", "amdgpu.cwsr-enable=0"]
    assert host.param_values(words, "amdgpu.cwsr_enable") == ["0"]  # '-' and '_' are one
    assert host.parse_cmdline('a="unbalanced b') == ["a=unbalanced b"]


def test_meminfo_and_kernel_versions():
    assert host.parse_meminfo(hr.meminfo(131752264)) == 131752264
    assert host.parse_meminfo("MemTotal: lots\n") is None and host.parse_meminfo(None) is None
    rule = host.facts()["kernel"]["gfx1151"]
    # AMD's RDNA3.5 page: mainline 6.18.4, Ubuntu HWE 6.17.0-19.19~24.04.2, Ubuntu OEM 6.14.0-1018
    cases = {"6.18.4-200.fc43.x86_64": True, "6.18.3-200.fc43.x86_64": False, "7.0.0-rc2": True,
             "6.17.0-19-generic": True, "6.17.0-14-generic": False, "6.14.0-1018-oem": True,
             "6.14.0-1017-oem": False, "6.14.0-1018-generic": False, "6.12.48+deb13-amd64": False}
    got = {r: host.meets_floor(host.Kernel(r, "test"), rule)[0] for r in cases}
    assert got == cases


def test_firmware_versions_from_every_format(tmp_path):
    text = hr.FIRMWARE_INFO.format(mes=0x83)
    assert host.parse_firmware_info(text) == 0x83
    assert host.snapshot_of("20251125-1.fc43") == "20251125"
    assert host.snapshot_of("20240318.git3b128b60-0ubuntu2.21") == "20240318"
    assert host.snapshot_of("1:20230210-5") == "20230210" and host.snapshot_of("garbage") is None
    rpmdb(tmp_path, "20251125")  # written by the real rpm: the header parser must agree with it
    assert sorted(host._rpm_versions(Root(tmp_path), ["amd-gpu-firmware", "linux-firmware"])) == [
        ("amd-gpu-firmware", "20251125-1.fc43"), ("linux-firmware", "20251125-1.fc43")]
    (tmp_path / "usr/lib/sysimage/rpm/rpmdb.sqlite").write_bytes(b"SQLite format 3\0garbage")
    assert host._rpm_versions(Root(tmp_path), ["linux-firmware"]) is None


# -- doctor: one machine each ----------------------------------------------------------------------
def test_strix_halo_at_defaults(tmp_path):
    hr.strix_defaults(tmp_path)
    checks = doctor_host(tmp_path)
    assert statuses(checks) == {"kernel.floor": "ok", "firmware.mes": "unknown", "memory.gtt": "warn",
                                "memory.uma": "ok", "tuned.profile": "warn", "vulkan.icd": "ok"}
    gtt = checks["memory.gtt"]
    assert gtt["found"] == "GTT 62.8 GiB of 125.6 GiB RAM (50%; ttm.pages_limit 16469033)"
    assert gtt["fix"].startswith("ttm.pages_limit=31719424 (121 GiB x 262144)")
    assert "noamsto/nix-amd-ai #96" in gtt["message"]
    assert checks["kernel.floor"]["found"] == ("6.17.0-19-generic: Ubuntu HWE kernel with the fixes "
                                               "backported (>= 6.17.0-19)")
    # no root: debugfs unreadable, and Ubuntu's package version does not say which MES is loaded
    mes = checks["firmware.mes"]
    assert "debugfs" in mes["found"] and "linux-firmware 20240318.git3b128b60-0ubuntu2.21" in mes["found"]
    assert mes["fix"].startswith("run `sudo grep MES")
    assert checks["memory.uma"]["found"] == "VRAM carve-out 0.5 GiB"


def test_tuned_strix_halo_is_all_ok(tmp_path):
    hr.strix_tuned(tmp_path)
    rpmdb(tmp_path, "20251111")
    checks = doctor_host(tmp_path)
    assert set(statuses(checks).values()) == {"ok"}, checks
    assert checks["memory.gtt"]["found"] == "GTT 121.0 GiB of 125.6 GiB RAM (96%; ttm.pages_limit 31719424)"
    assert checks["firmware.mes"]["found"] == "/sys/kernel/debug/dri/1/amdgpu_firmware_info: MES 0x80"
    assert checks["tuned.profile"]["found"] == "TuneD profile accelerator-performance"
    p = plan(tmp_path)
    assert p["pages_limit"] == 31719424 and p["kernel_args"] == {"add": [], "remove": []}
    assert [s["id"] for s in p["steps"]] == ["iommu"] and p["steps"][0]["optional"]
    assert "ttm.pages_limit is already 31719424 (121 GiB): nothing to change" in p["notes"]


def test_64gb_strix_halo_scales(tmp_path):
    hr.strix_64(tmp_path)
    checks = doctor_host(tmp_path)
    assert checks["memory.gtt"]["found"] == "GTT 31.2 GiB of 62.4 GiB RAM (50%; ttm.pages_limit 8172828)"
    assert checks["firmware.mes"]["status"] == "unknown"  # pacman 20251111: not the bad snapshot
    p = plan(tmp_path)
    assert (p["pages_limit"], p["gtt_gib"], p["bootloader"]) == (15204352, 58, "systemd-boot")
    assert p["kernel_args"] == {"add": ["ttm.pages_limit=15204352"], "remove": []}


def test_amdttm_kernel_ignores_ttm_and_gttsize_is_removed(tmp_path):
    hr.strix_amdttm(tmp_path)
    checks = doctor_host(tmp_path)
    assert checks["memory.gttsize"]["status"] == "warn"
    # gttsize made the GTT 124 GiB, but amdttm's pages_limit (the default) still caps allocations
    gtt = checks["memory.gtt"]
    assert gtt["status"] == "warn" and gtt["found"] == (
        "GTT 124.0 GiB of 125.6 GiB RAM (99%; amdttm.pages_limit 16469033), "
        "but TTM caps GPU allocations at 62.8 GiB")
    assert checks["memory.gttsize"]["found"] == "amdgpu.gttsize=126976 on the command line"
    assert checks["memory.ttm_module"]["found"] == "ttm.pages_limit (/proc/cmdline); loaded: amdttm"
    assert checks["kernel.floor"]["status"] == "ok"  # Ubuntu OEM 6.14.0-1018 has the backport
    p = plan(tmp_path)
    assert p["module"] == "amdttm"
    assert p["kernel_args"] == {"add": ["amdttm.pages_limit=31719424"],
                                "remove": ["amdgpu.gttsize=126976", "ttm.pages_limit=32505856"]}


def test_old_kernel_warns_on_the_gfx1151_floor_and_duplicates_are_named(tmp_path):
    hr.strix_old_kernel(tmp_path)
    checks = doctor_host(tmp_path)
    floor = checks["kernel.floor"]
    # a warning (AMD: compute "may fail"; a workaround exists), so it does not block doctor
    assert (floor["status"], floor["found"]) == ("warn", "6.12.48+deb13-amd64 < 6.18.4")
    assert "amdgpu.cwsr_enable=0" in floor["fix"] and "#5991" in floor["fix"]
    dup = checks["cmdline.duplicates"]
    assert dup["found"] == "ttm.pages_limit given 2 times: 27648000, 31457280"
    # the firmware package is Debian's own (real trixie stanza); no root for debugfs
    assert "dpkg: firmware-amd-graphics 20250410-2" in checks["firmware.mes"]["found"]
    p = plan(tmp_path)
    assert p["kernel_args"] == {"add": ["ttm.pages_limit=31719424"],
                                "remove": ["ttm.pages_limit=27648000", "ttm.pages_limit=31457280"]}
    assert any("6.12.48+deb13-amd64 < 6.18.4: install kernel 6.18.4" in n for n in p["notes"])


@pytest.mark.parametrize("make, found", [
    (hr.strix_bad_firmware, "/sys/kernel/debug/dri/1/amdgpu_firmware_info: MES 0x83"),
    (hr.strix_bad_firmware_arch, "pacman: linux-firmware-amdgpu 20251125-2"),
])
def test_bad_firmware_fails_with_its_evidence(tmp_path, make, found):
    make(tmp_path)
    mes = doctor_host(tmp_path)["firmware.mes"]
    assert (mes["status"], mes["found"]) == ("fail", found)
    assert "legacy-rocm-build #5724" in mes["message"]
    step = next(s for s in plan(tmp_path)["steps"] if s["id"] == "firmware-rollback")
    assert any("20251111" in c for c in step["commands"])


def test_a_failing_host_check_blocks_doctor(tmp_path):
    """MES 0x83 hangs ROCm: "fail" means not usable, so doctor lists it as a problem and exits 1,
    in JSON and in text; the same machine with MES 0x80 is usable."""
    hr.strix_bad_firmware(tmp_path)
    fr.make_therock_tree(tmp_path)
    out = cli(tmp_path, "doctor", "--json")
    data = json.loads(out.stdout)
    assert out.returncode == 1 and data["usable"] is False
    assert [b for b in data["blockers"] if b.startswith("firmware.mes: ")] == [
        b for b in data["blockers"] if "MES 0x83" in b] and len(data["blockers"]) == 1
    text = cli(tmp_path, "doctor", env={"COLUMNS": "80"})
    assert text.returncode == 1 and "problem: firmware.mes: /sys/kernel/debug/dri/1/amdgpu_firmware_info: MES 0x83" in text.stdout
    good = tmp_path / "good"
    hr.make_host(good, os="fedora", kernel="6.18.4-200.fc43.x86_64", grub=hr.GRUB_FEDORA, mes=0x80)
    fr.make_therock_tree(good)
    assert cli(good, "doctor", "--json").returncode == 0


@pytest.mark.parametrize("make", [hr.strix_defaults, hr.strix_tuned, hr.strix_64, hr.strix_amdttm,
                                  hr.strix_old_kernel, hr.strix_bad_firmware, hr.strix_bad_firmware_arch,
                                  hr.dgpu_desktop])
def test_every_fail_blocks_and_no_warn_does(tmp_path, make):
    """The audit, over every host of tests/host_roots.py: a check at "fail" is among doctor's
    blockers (exit 1); a "warn" or "unknown" never is."""
    make(tmp_path)
    fr.make_therock_tree(tmp_path, targets=("gfx1151", "gfx1100"))
    out = cli(tmp_path, "doctor", "--json")
    data = json.loads(out.stdout)
    failing = {c["id"] for c in data["host"] if c["status"] == "fail"}
    blocked = {b.split(":", 1)[0] for b in data["blockers"]} & {c["id"] for c in data["host"]}
    assert blocked == failing
    assert (out.returncode == 1) == bool(data["blockers"]) and (not failing or out.returncode == 1)


def test_bad_firmware_from_the_rpm_database_without_root(tmp_path):
    hr.make_host(tmp_path, os="fedora", kernel="6.18.4-200.fc43.x86_64", grub=hr.GRUB_FEDORA)
    rpmdb(tmp_path, "20251125")
    mes = doctor_host(tmp_path)["firmware.mes"]
    assert mes["status"] == "fail"
    assert mes["found"] == "rpm: linux-firmware 20251125-1.fc43, amd-gpu-firmware 20251125-1.fc43"
    step = next(s for s in plan(tmp_path)["steps"] if s["id"] == "firmware-rollback")
    assert step["commands"] == ["sudo dnf install fedora-repos-archive",
                                "sudo dnf --enablerepo=updates-archive downgrade amd-gpu-firmware-20251111",
                                "sudo dracut -f"]


def test_dgpu_desktop_gets_no_apu_checks(tmp_path):
    hr.dgpu_desktop(tmp_path)
    checks = doctor_host(tmp_path)
    assert list(checks) == ["vulkan.icd"]  # no GTT, UMA, TuneD or gfx1151 checks on a 7900 XTX
    assert checks["vulkan.icd"]["status"] == "warn" and "AMDVLK #413" in checks["vulkan.icd"]["message"]
    p = plan(tmp_path)
    assert p["pages_limit"] is None and p["steps"] == [] and p["kernel_args"] == {"add": [], "remove": []}
    assert p["notes"][0].startswith("no APU found")


def test_doctor_text_has_a_host_section(tmp_path):
    hr.strix_defaults(tmp_path)
    fr.make_therock_tree(tmp_path)
    out = cli(tmp_path, "doctor", env={"COLUMNS": "200"})
    assert "Host" in out.stdout and "   warn memory.gtt: GTT 62.8 GiB of 125.6 GiB RAM" in out.stdout
    assert "fix: ttm.pages_limit=31719424" in out.stdout


# -- the plan for each boot loader -----------------------------------------------------------------
def test_reserve_gives_the_peers_124_gib(tmp_path):
    hr.strix_defaults(tmp_path)
    p = plan(tmp_path, "--reserve", "1")
    assert (p["pages_limit"], p["gtt_gib"], p["ram_gib"]) == (32505856, 124, 125.65)


def _run_sed(cmd: str, root: Path, inner: str) -> None:
    """Run a plan's sed line for real (minus sudo) on the fixture's copy of the file."""
    assert cmd.startswith("sudo env LC_ALL=C sed -i.rocforge.bak ")
    local = cmd.replace("sudo ", "", 1).replace(f" {inner}", f" {root / inner.lstrip('/')}")
    subprocess.run(["sh", "-c", local], check=True)


def test_grub_script_really_rewrites_the_line(tmp_path):
    hr.strix_old_kernel(tmp_path)
    p = plan(tmp_path)
    cmds = p["steps"][0]["commands"]
    assert cmds[-1] == "sudo update-grub"
    grub = tmp_path / "etc/default/grub"
    subprocess.run(["sh", "-c", cmds[0].replace("sudo env ", "env ").replace(" /etc/default/grub", f" {grub}")],
                   check=True)
    text = (tmp_path / "etc/default/grub").read_text()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet ttm.pages_limit=31719424"\n' in text
    assert (tmp_path / "etc/default/grub.rocforge.bak").exists()  # the user's file kept
    # applying the result again plans nothing more for the command line
    assert dict(host_plan.grub_lines(text))["GRUB_CMDLINE_LINUX_DEFAULT"] == "quiet ttm.pages_limit=31719424"


def test_systemd_boot_entry_is_rewritten(tmp_path):
    hr.strix_64(tmp_path)
    (cmd,) = plan(tmp_path)["steps"][0]["commands"]
    _run_sed(cmd, tmp_path, "/boot/loader/entries/arch.conf")
    assert ("options root=PARTUUID=6f0f6c6e-1f7a-4b6e-9d5e-2f1f0a9b8c7d rw quiet ttm.pages_limit=15204352\n"
            in (tmp_path / "boot/loader/entries/arch.conf").read_text())


def test_fedora_uses_grubby_and_pop_uses_kernelstub(tmp_path):
    hr.strix_amdttm(tmp_path)
    (tmp_path / "etc/os-release").write_text(hr.OS_RELEASE["fedora"])
    assert plan(tmp_path)["steps"][0]["commands"] == [
        "sudo grubby --update-kernel=ALL --remove-args='amdgpu.gttsize=126976 ttm.pages_limit=32505856' "
        "--args=amdttm.pages_limit=31719424"]
    (tmp_path / "etc/os-release").write_text(hr.OS_RELEASE["pop"])
    (tmp_path / "etc/default/grub").unlink()
    assert plan(tmp_path)["steps"][0]["commands"] == [
        "sudo kernelstub -d amdgpu.gttsize=126976", "sudo kernelstub -d ttm.pages_limit=32505856",
        "sudo kernelstub -a amdttm.pages_limit=31719424"]


def test_modprobe_alternative_and_tuned(tmp_path):
    hr.strix_amdttm(tmp_path)
    steps = {s["id"]: s for s in plan(tmp_path)["steps"]}
    assert steps["modprobe"]["optional"] and steps["modprobe"]["commands"] == [
        "echo 'options amdttm pages_limit=31719424' | sudo tee /etc/modprobe.d/amdttm.conf",
        "sudo update-initramfs -u"]
    assert steps["tuned"]["commands"][-1] == "sudo tuned-adm profile accelerator-performance"
    script = cli(tmp_path, "host", "plan").stdout
    assert script.startswith("#!/bin/sh\n# rocforge host plan:")
    assert "# echo 'options amdttm pages_limit=31719424'" in script  # the alternative, commented
    subprocess.run(["sh", "-n", "-c", script], check=True)  # valid shell


# -- --write never loses data ----------------------------------------------------------------------
def test_write_refuses_a_file_it_did_not_make(tmp_path):
    root = tmp_path / "root"
    hr.strix_defaults(root)
    mine = tmp_path / "notes.sh"
    mine.write_text("my own notes\n")
    out = cli(root, "host", "plan", "--write", str(mine))
    assert out.returncode == 2 and "rocforge did not make it" in out.stderr
    assert mine.read_text() == "my own notes\n"
    script = tmp_path / "plan.sh"
    assert cli(root, "host", "plan", "--write", str(script)).returncode == 0
    first = script.read_text()
    assert "ttm.pages_limit=31719424" in first
    assert cli(root, "host", "plan", "--reserve", "1", "--write", str(script)).returncode == 0
    assert "ttm.pages_limit=32505856" in script.read_text()  # its own file: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sh", "plan.sh", "root"]


def test_write_never_goes_through_a_link_at_a_temporary_name(tmp_path):
    """The script is staged under a fresh name: a link someone left at a predictable one
    (`.plan.sh.rocforge-tmp`) is neither followed nor removed."""
    root = tmp_path / "root"
    hr.strix_defaults(root)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / ".plan.sh.rocforge-tmp").symlink_to(victim)
    assert cli(root, "host", "plan", "--write", str(tmp_path / "plan.sh")).returncode == 0
    assert victim.read_text() == "keep me\n"
    assert (tmp_path / ".plan.sh.rocforge-tmp").is_symlink()
    assert (tmp_path / "plan.sh").read_text().startswith("#!/bin/sh\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plan.sh.rocforge-tmp", "plan.sh",
                                                          "root", "victim.txt"]


# -- bad input: one line or `unknown` -------------------------------------------------------------
def test_reserve_larger_than_ram_is_one_line(tmp_path):
    hr.strix_64(tmp_path)
    out = cli(tmp_path, "host", "plan", "--reserve", "80")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0] == ("rocforge: error: --reserve 80 GiB leaves no GPU memory: this "
                                          "machine has 62.4 GiB of RAM (MemTotal in /proc/meminfo)")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf"])
def test_reserve_that_is_not_a_size(tmp_path, value):
    hr.strix_64(tmp_path)
    out = cli(tmp_path, "host", "plan", f"--reserve={value}")  # = form: argparse takes -inf as a flag
    # refused while the command line is parsed: one line naming the flag and the value
    assert out.returncode == 2 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1 and errors[0].startswith("rocforge: error: host plan: argument --reserve: ")
    assert f"'{value}'" in errors[0]
    assert out.stdout == ""


@pytest.mark.parametrize("value", ["nan", "-1", "100"])
def test_reserve_is_checked_on_a_dgpu_too(tmp_path, value):
    """No GTT to plan on a desktop, but a bad --reserve is still refused, never ignored
    (MemTotal 65785644 kB = 62.7 GiB: 100 is above it)."""
    hr.dgpu_desktop(tmp_path)
    out = cli(tmp_path, "host", "plan", f"--reserve={value}")
    assert out.returncode == 2 and len(out.stderr.splitlines()) <= 2, out.stderr
    if value == "100":  # a number, judged against this machine's RAM
        assert out.stderr.startswith(f"rocforge: error: --reserve {value}") and "62.7 GiB of RAM" in out.stderr
    else:  # not a size at all: refused while parsing
        assert out.stderr.startswith("rocforge: error: host plan: argument --reserve: ")


def test_reserve_above_ram_is_judged_against_the_ram_after_the_uma_step(tmp_path):
    """128 GiB machine with a 64 GiB carve-out: 62.1 GiB visible, 125.6 GiB once the carve-out is
    at 512 MB; --reserve 100 fits the latter and is accepted, 125 leaves < 1 GiB and is refused."""
    _strix_uma_64(tmp_path)
    assert plan(tmp_path, "--reserve", "100")["gtt_gib"] == 25  # int(125.65 - 100)
    out = cli(tmp_path, "host", "plan", "--reserve", "125")
    assert out.returncode == 2 and out.stderr.splitlines()[0] == (
        "rocforge: error: --reserve 125 GiB leaves no GPU memory: this machine has 125.6 GiB of RAM "
        "once the UMA carve-out is at its 512 MB minimum (MemTotal in /proc/meminfo 62.1 GiB + "
        "63.5 GiB freed from mem_info_vram_total)")


# -- a large BIOS UMA carve-out (issue: GTT sized from the visible 62 GB) -------------------------
# A 128 GB Strix Halo whose firmware keeps 64 GiB as VRAM (a vendor default; the OS then shows
# ~62 GB).  With the 512 MiB minimum carve-out the same machine shows MemTotal 131752264 kB
# (AMD's amd-ttm example above).  The 64 GiB carve-out takes 64 GiB - 512 MiB = 63.5 GiB more:
#   63.5 GiB = 63.5 x 1048576 kB = 66584576 kB  ->  MemTotal 131752264 - 66584576 = 65167688 kB
#   (62.15 GiB visible today).
UMA_64_MEMTOTAL_KIB = 131752264 - 66584576


def _strix_uma_64(root):
    return hr.make_host(root, mem_total_kib=UMA_64_MEMTOTAL_KIB, vram=64 * hr.GIB,
                        grub=hr.GRUB_UBUNTU.format(default="quiet splash"),
                        dpkg={"linux-firmware": "20240318.git3b128b60-0ubuntu2.21"})


def test_large_uma_carveout_sizes_gtt_from_the_ram_after_the_firmware_step(tmp_path):
    _strix_uma_64(tmp_path)
    p = plan(tmp_path)
    # after the UMA step the OS sees 65167688 kB + 63.5 GiB = 131752264 kB = 125.65 GiB;
    # minus the 4 GiB reserve: int(121.65) = 121 GiB -> 121 x 262144 = 31719424 pages: the same
    # value the same machine gets with a 512 MB carve-out (test_strix_halo_at_defaults).
    # Sized from today's 62.15 GiB it would be int(58.15) = 58 GiB = 15204352 pages.
    assert (p["pages_limit"], p["gtt_gib"], p["gtt_ram_gib"], p["ram_gib"]) == (31719424, 121, 125.65, 62.15)
    assert p["kernel_args"]["add"] == ["ttm.pages_limit=31719424"]
    ids = [s["id"] for s in p["steps"]]
    assert ids[:2] == ["firmware-setup", "kernel-args"]
    uma = p["steps"][0]
    assert not uma["optional"] and "64.0 GiB of RAM as VRAM" in uma["why"]
    assert "rocm.docs.amd.com/en/latest/how-to/system-optimization/strixhalo.html" in uma["why"]
    assert uma["commands"] == ["# reboot into the firmware setup (BIOS/UEFI) and set the UMA frame "
                               "buffer size (vendors name it 'UMA Frame Buffer Size', 'iGPU Memory "
                               "Size' or 'VRAM') to its minimum, 512 MB"]
    why = p["steps"][1]["why"]
    assert why.startswith("GTT = 121 GiB (125.6 GiB RAM - 4 GiB reserve) = 121 x 262144 = 31719424")
    assert "sized for the machine after the firmware-setup step" in why
    # the script says it too, and still runs: the firmware step is a comment, not a command
    text = cli(tmp_path, "host", "plan").stdout
    assert "# firmware-setup: the BIOS UMA carve-out holds 64.0 GiB" in text
    assert "\n# reboot into the firmware setup (BIOS/UEFI)" in text
    # doctor agrees with the plan's figure
    gtt = doctor_host(tmp_path)["memory.gtt"]
    assert gtt["fix"].startswith("ttm.pages_limit=31719424 (121 GiB x 262144; sized for the RAM after")


def test_small_carveout_keeps_sizing_from_memtotal(tmp_path):
    """4 GiB of VRAM (what a 512 MB setting was measured to report) is not a carve-out to lower:
    no firmware-setup step, GTT from MemTotal as before."""
    hr.make_host(tmp_path, vram=4 * hr.GIB, grub=hr.GRUB_UBUNTU.format(default="quiet splash"))
    p = plan(tmp_path)
    assert "firmware-setup" not in [s["id"] for s in p["steps"]]
    assert (p["pages_limit"], p["gtt_ram_gib"]) == (31719424, 125.65)


def test_garbage_and_missing_files(tmp_path):
    hr.strix_defaults(tmp_path)
    (tmp_path / "proc/meminfo").write_text("MemTotal: lots of it\n")
    vram = tmp_path / "sys" / hr.PCI / "mem_info_vram_total"
    vram.unlink()
    vram.mkdir()  # a directory where a file should be: reading it fails
    (tmp_path / "sys/module/ttm/parameters/pages_limit").write_text("\x00\xff garbage\n")
    (tmp_path / "proc/sys/kernel/osrelease").unlink()
    (tmp_path / "proc/version").write_text("not a kernel\n")
    (tmp_path / "proc/cmdline").unlink()
    checks = doctor_host(tmp_path)
    assert statuses(checks) == {"kernel.floor": "unknown", "firmware.mes": "unknown",
                                "memory.gtt": "unknown", "memory.gttsize": "unknown",
                                "memory.uma": "unknown", "tuned.profile": "warn", "vulkan.icd": "ok"}
    assert checks["memory.gtt"]["found"] == "unreadable: /proc/meminfo MemTotal"
    out = cli(tmp_path, "host", "plan")
    assert out.returncode == 3 and out.stderr.splitlines()[0] == (
        "rocforge: error: cannot read MemTotal from /proc/meminfo")


def test_empty_root_has_no_checks_and_no_plan(tmp_path):
    assert doctor_host(tmp_path) == {}
    p = plan(tmp_path)
    assert p["steps"] == [] and p["bootloader"] == "unknown"
    assert p["notes"] == ["no AMD GPU found (KFD topology): nothing to plan"]


# -- container run and env say the same ------------------------------------------------------------
def test_container_run_plan_names_the_gpu_memory(tmp_path, tmp_path_factory):
    hr.strix_defaults(tmp_path)
    docker = fake_docker(tmp_path_factory.mktemp("docker"))  # the dry run checks the engine
    out = cli(tmp_path, "container", "run", "llama-cpp", "--target", "gfx1151", "--backend", "hip",
              "--engine", "docker", "--dry-run", "--json", "--", "llama-cli", "--version",
              env={"PATH": f"{docker}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    d = {x["key"]: x for x in json.loads(out.stdout)["decisions"]}
    assert d["gpu_memory"]["value"] == ("GPU memory: GTT 62.8 GiB of 125.6 GiB RAM (the kernel default, "
                                        "~50 % of RAM; `rocforge host plan` raises it)")
    assert "host's kernel" in d["gpu_memory"]["reason"]


def test_env_comment_follows_the_gtt(tmp_path):
    hr.strix_defaults(tmp_path)
    fr.make_therock_tree(tmp_path)
    first = cli(tmp_path, "env", "--shell", "bash").stdout
    assert "# GPU memory: GTT 62.8 GiB (the RAM this iGPU may use" in first
    assert cli(tmp_path, "env", "--shell", "bash").stdout == first  # cache or not: the same
    (tmp_path / "sys" / hr.PCI / "mem_info_gtt_total").write_text(f"{121 * 262144 * 4096}\n")  # rebooted
    assert "# GPU memory: GTT 121.0 GiB" in cli(tmp_path, "env", "--shell", "bash").stdout
    assert "GPU memory" not in cli(tmp_path, "env", "--shell", "json").stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_env_script_with_the_note_still_sources(tmp_path):
    hr.strix_defaults(tmp_path)
    fr.make_therock_tree(tmp_path)
    script = cli(tmp_path, "env", "--shell", "bash").stdout
    subprocess.run(["bash", "-c", script + "\ntest -n \"$ROCM_PATH\""], check=True)


def test_cwsr_workaround_is_dropped_on_a_fixed_kernel(tmp_path):
    hr.make_host(tmp_path, os="fedora", kernel="6.18.4-200.fc43.x86_64", grub=hr.GRUB_FEDORA,
                 cmdline="BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.18.4-200.fc43.x86_64 ro rhgb quiet amdgpu.cwsr_enable=0")
    cw = doctor_host(tmp_path)["kernel.cwsr"]
    assert (cw["status"], cw["found"]) == ("warn", "amdgpu.cwsr_enable=0 on kernel 6.18.4-200.fc43.x86_64")
    assert plan(tmp_path)["kernel_args"]["remove"] == ["amdgpu.cwsr_enable=0"]
    old = tmp_path / "old"
    hr.make_host(old, kernel="6.17.0-5-generic", grub=hr.GRUB_UBUNTU.format(default="quiet"),
                 cmdline="BOOT_IMAGE=/boot/vmlinuz-6.17.0-5-generic ro quiet amdgpu.cwsr_enable=0")
    checks = doctor_host(old)
    assert checks["kernel.cwsr"]["status"] == "ok" and checks["kernel.floor"]["status"] == "warn"
    assert plan(old)["kernel_args"]["remove"] == []  # still needed on 6.17.0-5: kept


def test_modprobe_file_for_the_wrong_module_and_proc_version_fallback(tmp_path):
    hr.strix_amdttm(tmp_path)
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz-6.14.0-1018-oem ro quiet\n")
    (tmp_path / "etc/modprobe.d").mkdir(parents=True)
    (tmp_path / "etc/modprobe.d/ttm.conf").write_text("# amd-ttm\noptions ttm pages_limit=26214400\n")
    (tmp_path / "proc/sys/kernel/osrelease").unlink()  # /proc/version still tells
    checks = doctor_host(tmp_path)
    assert checks["memory.ttm_module"]["found"] == "ttm.pages_limit (/etc/modprobe.d/ttm.conf); loaded: amdttm"
    assert checks["kernel.floor"]["found"].startswith("6.14.0-1018-oem: Ubuntu OEM kernel")


def test_debugfs_without_root_is_unknown(tmp_path, monkeypatch):
    hr.strix_bad_firmware(tmp_path)

    def denied(path):
        if str(path).endswith("/sys/kernel/debug/dri"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    real = host.os.listdir
    monkeypatch.setattr(host.os, "listdir", denied)
    assert host.read_mes(Root(tmp_path), None) == (None, "/sys/kernel/debug/dri is not readable "
                                                         "(debugfs needs root)")


# -- the host fingerprint every measured row carries ----------------------------------------------
def _fingerprint(root):
    from rocforge_build.discover import gpus

    r = Root(root)
    return host.fingerprint(r, gpus.discover(r).gpus)


def test_fingerprint_fields_from_debugfs_cmdline_tuned_and_sysfs(tmp_path):
    # read as root: debugfs amdgpu_firmware_info (MES 0x83, hr.FIRMWARE_INFO's Strix Halo lines),
    # amd_iommu=off on the command line, TuneD's profile, GTT raised to 121 GiB, 512 MiB carve-out
    cmdline = ("BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.18.4-200.fc43.x86_64 root=UUID=4f1c ro rhgb quiet "
               "ttm.pages_limit=31719424 amd_iommu=off")
    hr.make_host(tmp_path, os="fedora", kernel="6.18.4-200.fc43.x86_64", cmdline=cmdline,
                 pages_limit=31719424, vram=512 * hr.MIB, mes=0x83, tuned="accelerator-performance",
                 iommu_units=())
    fp = _fingerprint(tmp_path)
    # every non-zero "firmware version" of hr.FIRMWARE_INFO (0 = not loaded), SMC's word
    # 0x0a640200 as the kernel prints the SMU version (100.2.0), and the VBIOS line
    assert fp["firmware"] == {
        "me": "0x1f", "pfp": "0x2c", "rlc": "0x11530505", "mec": "0x1f", "imu": "0xb352300",
        "asd": "0x21000104", "ta_hdcp": "0x1700004a", "ta_dtm": "0x1200001a", "smc": "0xa640200",
        "smu": "100.2.0", "sdma0": "0x11", "vcn": "0x911801b", "dmcub": "0x9003500", "toc": "0x0b",
        "mes_kiq": "0x6f", "mes": "0x83", "vpe": "0x17", "vbios": "113-STRXLGEN-001"}
    assert fp["cmdline"] == cmdline
    assert fp["tuned_profile"] == "accelerator-performance"
    assert fp["iommu"] == "off"  # amd_iommu=off, and /sys/class/iommu lists no unit
    assert fp["gtt_bytes"] == 31719424 * 4096 == 121 * hr.GIB
    assert fp["vram_bytes"] == 512 * hr.MIB
    assert fp["firmware_packages"] is None  # the loaded MES is known: no package fallback read


def test_fingerprint_as_a_user_reads_sysfs_firmware_and_the_package_only_without_mes(tmp_path):
    # no debugfs (a user): amdgpu's world-readable fw_version files; the IOMMU on (ivhd0 in sysfs)
    user = tmp_path / "user"
    hr.make_host(user, fw_sysfs={"mes": 0x80, "mes_kiq": 0x6f, "smc": 0x0A640200, "vcn": 0},
                 vbios="113-STRXLGEN-001", tuned="", iommu_units=("ivhd0",),
                 dpkg={"linux-firmware": "20240318.git3b128b60-0ubuntu2.21"})
    fp = _fingerprint(user)
    assert fp["firmware"] == {"mes": "0x80", "mes_kiq": "0x6f", "smc": "0xa640200", "smu": "100.2.0",
                              "vbios": "113-STRXLGEN-001"}
    assert fp["tuned_profile"] == "" and fp["iommu"] == "on"
    assert fp["firmware_packages"] is None
    # nothing tells the MES version: the firmware package is recorded as the evidence
    pkg = tmp_path / "pkg"
    hr.strix_bad_firmware_arch(pkg)
    fp = _fingerprint(pkg)
    assert fp["firmware"] is None and fp["firmware_packages"] == {"linux-firmware-amdgpu": "20251125-2"}
    assert fp["tuned_profile"] is None and fp["iommu"] is None


def test_fingerprint_never_fails_on_an_empty_or_unreadable_root(tmp_path):
    assert _fingerprint(tmp_path) == dict.fromkeys(
        ("cmdline", "firmware", "firmware_packages", "tuned_profile", "iommu", "gtt_bytes", "vram_bytes"))
    # directories where files belong (open() fails with EISDIR), and garbage in sysfs files
    hr.make_host(tmp_path, fw_sysfs={"mes": 0x83})
    for f in ("proc/cmdline", "etc/tuned/active_profile"):
        (tmp_path / f).unlink(missing_ok=True)
        (tmp_path / f).mkdir(parents=True)
    (tmp_path / "sys" / hr.PCI / "fw_version/mes_fw_version").chmod(0o644)
    (tmp_path / "sys" / hr.PCI / "fw_version/mes_fw_version").write_text("\x00\xffgarbage\n")
    (tmp_path / "sys" / hr.PCI / "mem_info_vram_total").write_text("-1\n")
    fp = _fingerprint(tmp_path)
    assert fp["cmdline"] is None and fp["tuned_profile"] is None and fp["iommu"] is None
    assert fp["firmware"] is None and fp["vram_bytes"] is None
    assert fp["gtt_bytes"] == (hr.STRIX_128_KIB // 4 // 2) * 4096  # the default pages_limit x 4 KiB


def test_doctor_lists_a_known_bad_firmware_as_a_blocker_with_its_source(tmp_path):
    """MES 0x83 on gfx1151 is both a host check (host.toml firmware.mes) and a known-bad host state
    (known_bad.toml, which bench/tune/verify warn of): doctor says it once, as the host check's
    problem with its rollback fix, never a second time as "known bad"."""
    hr.strix_bad_firmware(tmp_path)  # gfx1151, debugfs MES 0x83, kernel 6.18.4 (meets the floor)
    out = cli(tmp_path, "doctor", "--json")
    data = json.loads(out.stdout)
    mes = [b for b in data["blockers"] if "MES 0x83" in b or "mes 0x83" in b]
    assert len(mes) == 1 and mes[0].startswith("firmware.mes: ") and "legacy-rocm-build #5724" in mes[0]
    assert not [w for w in data["warnings"] + data["blockers"] if w.startswith("known bad:")]
    assert out.returncode == 1 and not data["usable"]
    text = cli(tmp_path, "doctor")
    assert "problem: firmware.mes:" in " ".join(text.stdout.split())
    # MES 0x80 (the good firmware) on the same machine: no match
    good = tmp_path / "good"
    hr.make_host(good, os="fedora", kernel="6.18.4-200.fc43.x86_64", mes=0x80)
    assert not [b for b in json.loads(cli(good, "doctor", "--json").stdout)["blockers"]
                if "0x83" in b or b.startswith("known bad:")]
