"""Attack tests: `rocforge host plan` edits /etc/default/grub only where it understands every line
that sets the kernel command-line variable.  Each test writes the file into a fake root, runs
the real `rocforge --root R host plan --write plan.sh`, runs the script's kernel-argument lines
with real `sh` and `sed` (LANG=C.UTF-8, minus sudo) on the fake root's file, and sources the
result with `sh` in a clean environment, as grub-mkconfig does as root: the value keeps the
user's parameters and gains the planned one, or the file is left byte for byte as it was with
one warning line and a comment saying what to add by hand; a marker file shows nothing ran."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import host_roots as hr
import pytest
from test_commands_env import cli_subprocess

VAR = "GRUB_CMDLINE_LINUX_DEFAULT"
HEAD = b"GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
TAIL = b'GRUB_CMDLINE_LINUX=""\n'
CLEAN = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _host(tmp_path: Path, grub: bytes) -> Path:
    """A Debian 13 Strix Halo whose live command line has no pages_limit, with `grub` as its
    /etc/default/grub (written as bytes: a line may be any bytes)."""
    root = tmp_path / "root"
    hr.make_host(root, os="debian13", kernel="6.12.48+deb13-amd64",
                 cmdline="BOOT_IMAGE=/boot/vmlinuz-6.12.48+deb13-amd64 root=UUID=77e1 ro quiet",
                 grub="", dpkg={"firmware-amd-graphics": "20250410-2"})
    (root / "etc/default/grub").write_bytes(grub)
    return root


def _plan(tmp_path: Path, root: Path) -> tuple[str, str, list[str]]:
    """(the planned parameter, stderr, the kernel-args step's command lines) of a real run."""
    script = tmp_path / "plan.sh"
    out = cli_subprocess(root, "host", "plan", "--write", str(script))
    assert out.returncode == 0, out.stderr
    text = script.read_text()
    target = re.search(r"\bttm\.pages_limit=\d+", text).group(0)
    step = text.split("\n# kernel-args: ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return target, out.stderr, step


def _apply(root: Path, step: list[str]) -> None:
    """Run the step's live lines (not update-grub) with real sh on the fake root's file."""
    grub = str(root / "etc/default/grub")
    for cmd in step:
        if cmd.startswith("#") or cmd == "sudo update-grub":
            continue
        local = cmd.replace("sudo ", "").replace(" /etc/default/grub", f" {grub}")
        subprocess.run(["sh", "-c", local], check=True, timeout=30, env=CLEAN, capture_output=True)


def _sourced(root: Path) -> str:
    """The value grub-mkconfig gets: the file sourced by sh in a clean environment."""
    run = subprocess.run(["sh", "-c", f'. "$0" >/dev/null 2>&1; printf %s "${VAR}"',
                          str(root / "etc/default/grub")], capture_output=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"}, cwd=root)
    return run.stdout.decode("utf-8", "surrogateescape")


def _ran_nothing(root: Path, mark: Path) -> None:
    assert not mark.exists()
    assert not (root / "splash").exists()


# Files where rocforge must not edit the variable: (name, file); {mark} is a marker path.
BY_HAND = [
    ("continuation", b"GRUB_CMDLINE_LINUX_DEFAULT=quiet\\\nsplash\n"),
    ("continuation-command", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\\\n" $(touch {mark})"\n'),
    ("export", b'export GRUB_CMDLINE_LINUX_DEFAULT="quiet amdgpu.sg_display=0"\n'),
    ("indented", b'  GRUB_CMDLINE_LINUX_DEFAULT="quiet amdgpu.sg_display=0"\n'),
    ("non-utf8", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet \xff\xfe caf\xe9"\n'),
    ("twice", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet amdgpu.sg_display=0"\n'),
    ("inside-if", b'if [ -e /nonexistent ]; then\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nfi\n'),
    ("self-reference", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
                       b'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amdgpu.sg_display=0"\n'),
    ("crlf", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet amdgpu.sg_display=0"\r\nGRUB_TIMEOUT=5\r\n'),
    ("after-continued-line", b"GRUB_GFXMODE=auto\\\nGRUB_CMDLINE_LINUX_DEFAULT=quiet\n"),
    ("after-and", b"true &&\nGRUB_CMDLINE_LINUX_DEFAULT=quiet\n"),
    ("inside-quotes", b'GRUB_BADRAM="\nGRUB_CMDLINE_LINUX_DEFAULT=quiet\n"\n'),
    ("no-final-newline", b"GRUB_TIMEOUT=5"),
    ("here-document", b"cat >/dev/null <<EOF\nGRUB_CMDLINE_LINUX_DEFAULT=quiet\nEOF\n"),
    ("deep-nesting", b'GRUB_X="' + b'$("' * 5000 + b"\n"),
]


@pytest.mark.parametrize("name, body", BY_HAND, ids=[n for n, _ in BY_HAND])
def test_a_line_rocforge_does_not_understand_is_left_to_the_user(tmp_path, name, body):
    mark = tmp_path / "MARK"
    grub = body.replace(b"{mark}", str(mark).encode()) if name == "no-final-newline" else (
        HEAD + body.replace(b"{mark}", str(mark).encode()) + TAIL)
    root = _host(tmp_path, grub)
    target, err, step = _plan(tmp_path, root)
    assert [ln for ln in err.splitlines() if ln.startswith("rocforge: warning:")] == [
        ln for ln in err.splitlines() if ln]
    (warning,) = err.splitlines()
    assert VAR in warning and "edit it by hand" in warning and target in warning
    assert any(ln.startswith("# /etc/default/grub: ") and target in ln for ln in step)
    assert [ln for ln in step if not ln.startswith("#")] == ["sudo update-grub"]
    _apply(root, step)
    assert (root / "etc/default/grub").read_bytes() == grub  # not edited, no overriding line
    _ran_nothing(root, mark)  # (the user's own file may run its `$(...)` when sourced: checked first)
    assert target not in _sourced(root)


# Files rocforge edits: (name, the line, the value sh reads after the edit without the target).
EDITED = [
    ("double-quoted", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet amdgpu.sg_display=0"', "quiet amdgpu.sg_display=0"),
    ("bare", b"GRUB_CMDLINE_LINUX_DEFAULT=quiet", "quiet"),
    ("single-quoted", b"GRUB_CMDLINE_LINUX_DEFAULT='quiet x=$(touch {mark})'", "quiet x=$(touch {mark})"),
    ("comment-after", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash" # mine', "quiet splash"),
    ("escaped-quote", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet a=\\"b c\\""', 'quiet a="b c"'),
    ("commented-out-copy", b'#GRUB_CMDLINE_LINUX_DEFAULT="old"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"', "quiet"),
]


@pytest.mark.parametrize("name, line, kept", EDITED, ids=[n for n, _, _ in EDITED])
def test_a_plain_line_is_edited_and_keeps_the_users_parameters(tmp_path, name, line, kept):
    mark = tmp_path / "MARK"
    line = line.replace(b"{mark}", str(mark).encode())
    root = _host(tmp_path, HEAD + line + b"\n" + TAIL)
    target, err, step = _plan(tmp_path, root)
    assert err == ""
    _apply(root, step)
    assert _sourced(root) == f"{kept.format(mark=mark)} {target}"
    after = (root / "etc/default/grub").read_bytes()
    assert after.startswith(HEAD) and after.endswith(b"\n" + TAIL)  # only that line changed
    assert after.count(b"\n") == (HEAD + line + b"\n" + TAIL).count(b"\n")
    if name == "comment-after":
        assert b"# mine\n" in after
    assert (root / "etc/default/grub.rocforge.bak").read_bytes() == HEAD + line + b"\n" + TAIL
    _ran_nothing(root, mark)


def test_no_line_gets_one_appended(tmp_path):
    root = _host(tmp_path, HEAD + TAIL)
    target, err, step = _plan(tmp_path, root)
    assert err == ""
    _apply(root, step)
    assert _sourced(root) == target


def test_the_edit_stops_if_the_line_changed_after_the_plan(tmp_path):
    """The edit names the line by number and carries its old text: a file edited between plan
    and run is left alone, with one line on stderr and exit status 1."""
    root = _host(tmp_path, HEAD + b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n' + TAIL)
    _, _, step = _plan(tmp_path, root)
    changed = HEAD + b'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n' + TAIL
    (root / "etc/default/grub").write_bytes(changed)
    with pytest.raises(subprocess.CalledProcessError) as e:
        _apply(root, step)
    assert e.value.returncode == 1 and e.value.stderr.decode().count("\n") == 1
    assert b"changed since this plan was made" in e.value.stderr
    assert (root / "etc/default/grub").read_bytes() == changed


def test_a_grub_d_file_that_sets_the_variable_is_left_to_the_user(tmp_path):
    """grub-mkconfig sources /etc/default/grub.d/*.cfg after the file (Ubuntu's grub2): an edit
    of /etc/default/grub would not be what boots."""
    grub = HEAD + b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n' + TAIL
    root = _host(tmp_path, grub)
    (root / "etc/default/grub.d").mkdir()
    (root / "etc/default/grub.d/50-cloudimg-settings.cfg").write_text(f'{VAR}="console=ttyS0"\n')
    target, err, step = _plan(tmp_path, root)
    assert "50-cloudimg-settings.cfg" in err and target in err
    _apply(root, step)
    assert (root / "etc/default/grub").read_bytes() == grub


ENTRY = b"title   Arch Linux\nlinux   /vmlinuz-linux\ninitrd  /initramfs-linux.img\n"
ENTRIES = [
    ("non-utf8", ENTRY + b"options root=PARTUUID=6f0f rw quiet caf\xe9 \xff\xfe\n"),
    ("two-options-lines", ENTRY + b"options root=PARTUUID=6f0f rw\noptions quiet amdgpu.sg_display=0\n"),
    ("crlf", ENTRY.replace(b"\n", b"\r\n") + b"options root=PARTUUID=6f0f rw quiet\r\n"),
]


@pytest.mark.parametrize("name, entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_a_systemd_boot_entry_rocforge_cannot_carry_back_is_left_to_the_user(tmp_path, name, entry):
    """systemd-boot joins every `options` line of an entry (the Boot Loader Specification); a
    rewrite of each line by `^options` would give every line the same text, and bytes decoded
    with replacement would come back as U+FFFD."""
    root = tmp_path / "root"
    hr.strix_64(root)
    path = root / "boot/loader/entries/arch.conf"
    path.write_bytes(entry)
    script = tmp_path / "plan.sh"
    out = cli_subprocess(root, "host", "plan", "--write", str(script))
    assert out.returncode == 0, out.stderr
    (warning,) = out.stderr.splitlines()
    assert warning.startswith("rocforge: warning: /boot/loader/entries/arch.conf: ") and "by hand" in warning
    step = script.read_text().split("\n# kernel-args: ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert all(ln.startswith("#") for ln in step), step
    assert path.read_bytes() == entry
