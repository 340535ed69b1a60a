"""Hostile and damaged bundles: `rocforge bundle check` and `bundle unpack` run for real on
archives crafted here with tarfile / zipfile / the zstd program (and folders with real links and
real FIFOs), each asserting the safe outcome: the documented exit code, exactly one
`rocforge: error:` line and no traceback, nothing created or changed outside `--into` (watched
with inotify, so even a directory that lives a moment counts), nothing left inside it, and no
hang (FIFO cases run in a child process under a timeout).  The good path is asserted too: a
valid bundle in every format still checks and unpacks, and its unpacked folder checks.

The sha256 values in the hand-made bundle.toml files are computed here with hashlib from the
bytes written, not taken from rocforge.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import io
import os
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
from needs import needs

from rocforge_build.cli import main

BIN = b"\x7fELF-not-really\n"
RUN = b"#!/bin/sh\necho hi\n"


# -- what a hand-made bundle holds ----------------------------------------------------------------
def toml_for(name: str, files: dict[str, bytes], links: dict[str, str], extra: str = "") -> bytes:
    lines = ['[bundle]', 'made_by = "rocforge"', f'name = "{name}"', 'gpu = "none"', extra, ""]
    for path, data in sorted(files.items()):
        lines += ["[[file]]", f'path = "{path}"', f'sha256 = "{hashlib.sha256(data).hexdigest()}"', ""]
    for path, target in sorted(links.items()):
        lines += ["[[file]]", f'path = "{path}"', f'link = "{target}"', ""]
    return "\n".join(lines).encode()


GOOD_FILES = {"bin/prog": BIN, "run": RUN, "lib/libx.so.1.0": b"library bytes"}
GOOD_LINKS = {"lib/libx.so.1": "libx.so.1.0", "lib/self": "."}


def good_entries(name: str = "b", toml: bytes | None = None) -> list[tuple]:
    """(kind, member name, data or link target) in the order rocforge writes them."""
    out: list[tuple] = [("dir", name, b""), ("dir", f"{name}/bin", b"")]
    out.append(("file", f"{name}/bin/prog", BIN))
    out.append(("file", f"{name}/bundle.toml", toml or toml_for(name, GOOD_FILES, GOOD_LINKS)))
    out.append(("dir", f"{name}/lib", b""))
    out += [("file", f"{name}/lib/libx.so.1.0", b"library bytes"), ("link", f"{name}/lib/libx.so.1", "libx.so.1.0"),
            ("link", f"{name}/lib/self", "."), ("file", f"{name}/run", RUN)]
    return out


def write_tar(path: Path, entries: list[tuple]) -> Path:
    """A .tar.gz, or a .tar.zst made by the real zstd program from the same tar."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for kind, name, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, payload
                tf.addfile(info)
            else:
                info.size, info.mode = len(payload), 0o755
                tf.addfile(info, io.BytesIO(payload))
    if path.name.endswith(".tar.zst"):
        subprocess.run(["zstd", "-q", "-f", "-o", str(path)], input=plain.getvalue(), check=True)
    else:
        import gzip

        path.write_bytes(gzip.compress(plain.getvalue()))
    return path


def write_zip(path: Path, entries: list[tuple]) -> Path:
    """Info-ZIP's conventions, as rocforge writes them: a link is mode S_IFLNK, its target the data."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on a duplicate name: that is the attack
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for kind, name, payload in entries:
                info = zipfile.ZipInfo(name + ("/" if kind == "dir" else ""))
                info.create_system = 3
                mode = {"dir": 0o040755, "link": 0o120777, "file": 0o100755}[kind]
                info.external_attr = mode << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, payload if isinstance(payload, bytes) else payload.encode())
    return path


def write_archive(path: Path, entries: list[tuple]) -> Path:
    return write_zip(path, entries) if path.suffix == ".zip" else write_tar(path, entries)


# -- the observations ---------------------------------------------------------------------------
class Inotify:
    """Linux inotify through libc: every create/move-in/modify/delete in the watched directories,
    so a directory that exists only for a moment is still seen."""

    MASK = 0x100 | 0x80 | 0x2 | 0x200 | 0x8  # IN_CREATE, IN_MOVED_TO, IN_MODIFY, IN_DELETE, IN_CLOSE_WRITE

    def __init__(self, dirs: list[Path]):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.dirs = {}
        for d in dirs:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(d), self.MASK)
            assert wd >= 0, (d, os.strerror(ctypes.get_errno()))
            self.dirs[wd] = d

    def events(self) -> list[str]:
        out = []
        try:
            while True:
                buf = os.read(self.fd, 65536)
                i = 0
                while i < len(buf):
                    wd, mask, _, size = struct.unpack_from("iIII", buf, i)
                    name = buf[i + 16:i + 16 + size].rstrip(b"\0").decode(errors="replace")
                    out.append(f"{self.dirs.get(wd)}/{name} (mask {mask:#x})")
                    i += 16 + size
        except BlockingIOError:
            pass
        os.close(self.fd)
        return out


def snapshot(root: Path, skip: Path | None = None) -> dict[str, object]:
    """Every path under `root` (without following links) with its content or link target."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None and Path(dirpath) == skip:
            dirnames[:] = []
            continue
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                out[p] = Path(p).read_bytes()
            elif not os.path.isdir(p):
                out[p] = "special"
    return out


def one_line(err: str, rc: int, code: int) -> str:
    assert rc == code, err
    assert "Traceback" not in err and "internal error" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1, err
    assert all(line.startswith("rocforge: ") for line in err.splitlines()), err  # no zstd noise
    return errors[0]


@pytest.fixture
def sandbox(tmp_path):
    """tmp/up/above/into (empty) beside a victim file and directory that an escape would touch."""
    into = tmp_path / "up" / "above" / "into"
    into.mkdir(parents=True)
    (tmp_path / "up" / "above" / "victim").write_text("the user's file\n")
    (tmp_path / "up" / "victim-dir").mkdir()
    (tmp_path / "work").mkdir()
    return tmp_path


def attack_unpack(sandbox: Path, archive: Path, capsys, code: int) -> str:
    """`bundle unpack ARCHIVE --into into`: refused with `code`; nothing created, changed or
    removed anywhere outside --into (even briefly), nothing left inside it."""
    into = sandbox / "up" / "above" / "into"
    before = snapshot(sandbox, skip=into)
    dirs = [Path(d) for d, _, _ in os.walk(sandbox) if Path(d) != into and into not in Path(d).parents]
    watch = Inotify(dirs)
    capsys.readouterr()
    rc = main(["bundle", "unpack", str(archive), "--into", str(into)])
    seen = watch.events()
    line = one_line(capsys.readouterr().err, rc, code)
    assert seen == [], seen
    assert snapshot(sandbox, skip=into) == before
    assert os.listdir(into) == []
    return line


def check_fails(path: Path, capsys, code: int = 7) -> str:
    capsys.readouterr()
    rc = main(["bundle", "check", str(path)])
    return one_line(capsys.readouterr().err, rc, code)


ZSTD = pytest.param(".tar.zst", marks=needs("zstd"))
FORMATS = [".tar.gz", ZSTD, ".zip"]


# -- the good path ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", FORMATS)
def test_a_valid_bundle_checks_unpacks_and_its_folder_checks(sandbox, capsys, suffix):
    archive = write_archive(sandbox / "work" / f"good{suffix}", good_entries())
    assert main(["bundle", "check", str(archive)]) == 0
    assert "5 files, every sha256 matches" in capsys.readouterr().out
    into = sandbox / "up" / "above" / "into"
    assert main(["bundle", "unpack", str(archive), "--into", str(into)]) == 0
    assert os.listdir(into) == ["b"]  # the folder only: no staging directory left
    assert (into / "b" / "bin" / "prog").read_bytes() == BIN
    assert os.readlink(into / "b" / "lib" / "libx.so.1") == "libx.so.1.0"
    assert main(["bundle", "check", str(into / "b")]) == 0
    # a second unpack never writes over the first
    capsys.readouterr()
    rc = main(["bundle", "unpack", str(archive), "--into", str(into)])
    assert "exists: not unpacking over it" in one_line(capsys.readouterr().err, rc, 2)
    assert (into / "b" / "bin" / "prog").read_bytes() == BIN and os.listdir(into) == ["b"]


# -- item 2: links resolve inside the bundle's own folder; the folder's name is plain ------------
ESCAPES = [("esc", "../victim"), ("up", ".."), ("deep", "lib/../../b/run"), ("far", "../above/victim")]


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize(("link", "target"), ESCAPES)
def test_a_link_leaving_the_bundles_folder_is_refused(sandbox, capsys, suffix, link, target):
    """`esc -> ../victim` stays inside the staging directory but not inside `b/`: once unpacked
    it points at the user's `into/../victim`; `up -> ..` is --into itself.  `deep` climbs out and
    back in, so it breaks as soon as the folder is renamed."""
    links = {**GOOD_LINKS, link: target}
    entries = good_entries(toml=toml_for("b", GOOD_FILES, links)) + [("link", f"b/{link}", target)]
    archive = write_archive(sandbox / "work" / f"esc{suffix}", entries)
    assert "resolves outside the bundle's folder" in check_fails(archive, capsys)
    assert "resolves outside the bundle's folder" in attack_unpack(sandbox, archive, capsys, 7)


def test_links_that_leave_only_together_are_refused(sandbox, capsys):
    """`p -> q/q/../../../x` reads as inside while `q` does not exist yet; `q -> .` comes after."""
    links = {**GOOD_LINKS, "p": "q/q/../../../x", "q": "."}
    entries = good_entries(toml=toml_for("b", GOOD_FILES, links)) + [("link", "b/p", "q/q/../../../x"),
                                                                     ("link", "b/q", ".")]
    archive = write_tar(sandbox / "work" / "chain.tar.gz", entries)
    assert "resolves outside the bundle's folder" in check_fails(archive, capsys)
    attack_unpack(sandbox, archive, capsys, 7)


def test_a_link_loop_is_refused_not_followed_forever(sandbox, capsys):
    links = {**GOOD_LINKS, "a": "b2/x", "b2": "a/x"}
    entries = good_entries(toml=toml_for("b", GOOD_FILES, links)) + [("link", "b/a", "b2/x"), ("link", "b/b2", "a/x")]
    archive = write_tar(sandbox / "work" / "loop.tar.gz", entries)
    assert "too many levels of links" in check_fails(archive, capsys)


@pytest.mark.parametrize(("link", "target"), ESCAPES)
def test_check_of_an_unpacked_folder_applies_the_same_link_rule(sandbox, capsys, link, target):
    archive = write_tar(sandbox / "work" / "good.tar.gz", good_entries())
    into = sandbox / "up" / "above" / "into"
    assert main(["bundle", "unpack", str(archive), "--into", str(into)]) == 0
    folder = into / "b"
    os.symlink(target, folder / link)
    (folder / "bundle.toml").write_bytes(toml_for("b", GOOD_FILES, {**GOOD_LINKS, link: target}))
    assert "resolves outside the bundle's folder" in check_fails(folder, capsys)


BAD_NAMES = ["./../../x", "../x", "a/b", ".", "..", "x\ny", ""]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_path_like_name_creates_nothing_outside_into(sandbox, capsys, name):
    """Before the fix, `name = "./../../x"` named the staging directory, made (for a moment) two
    levels above --into; inotify on every directory there sees any such moment."""
    toml = toml_for(name.replace("\n", "\\n"), GOOD_FILES, GOOD_LINKS)
    archive = write_tar(sandbox / "work" / "name.tar.gz", good_entries(toml=toml))
    assert "is not a plain folder name" in check_fails(archive, capsys)
    assert "is not a plain folder name" in attack_unpack(sandbox, archive, capsys, 7)


def test_the_name_must_be_the_archives_top_folder(sandbox, capsys):
    """A plain `name` that is not the top folder: the folder unpacked would not be the one named."""
    toml = toml_for("other", GOOD_FILES, GOOD_LINKS)  # the top folder is b/
    archive = write_tar(sandbox / "work" / "other.tar.gz", good_entries(toml=toml))
    why = "name 'other' is not the archive's top folder 'b'"
    assert why in check_fails(archive, capsys)
    assert why in attack_unpack(sandbox, archive, capsys, 7)


# -- item 4: damaged bundles, one line each -----------------------------------------------------
def _with(extra: list[tuple]) -> list[tuple]:
    return good_entries() + extra


DUPLICATES = {
    "file-twice": _with([("file", "b/run", b"#!/bin/sh\ntouch /tmp/pwned\n")]),
    "file-then-link": _with([("link", "b/run", "../victim")]),
    "file-then-dir": _with([("dir", "b/run", b"")]),
    "dir-then-file": _with([("file", "b/lib", b"x")]),
    "link-then-file-through-it": _with([("link", "b/sub", "lib"), ("file", "b/sub/evil.so", b"x")]),
    "file-below-a-file": _with([("file", "b/run/inner", b"x")]),
}


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_duplicate_members_and_writes_through_links_are_refused(sandbox, capsys, suffix, case):
    archive = write_archive(sandbox / "work" / f"{case}{suffix}", DUPLICATES[case])
    line = check_fails(archive, capsys)
    assert any(w in line for w in ("comes twice", "written through the link", "below the file")), line
    attack_unpack(sandbox, archive, capsys, 7)


BAD_TOMLS = {
    "missing-name": (b'[bundle]\nmade_by = "rocforge"\n', "field bundle.name is missing"),
    "name-not-a-string": (b'[bundle]\nmade_by = "rocforge"\nname = 5\n', "field bundle.name: 5 is not a string"),
    "file-without-path": (b'[bundle]\nmade_by = "rocforge"\nname = "b"\n[[file]]\nsha256 = "00"\n',
                          "field file[0].path is missing"),
    "file-list-mistyped": (b'file = 3\n[bundle]\nmade_by = "rocforge"\nname = "b"\n', "is not a list"),
    "kernel-targets-mistyped": (b'[bundle]\nmade_by = "rocforge"\nname = "b"\nkernel_targets = 7\n',
                                "field bundle.kernel_targets: 7 is not a list"),
    "invalid-toml": (b'[bundle\nname = "b"\n', "is not valid TOML"),
    "not-utf8": (b'[bundle]\nmade_by = "rocforge"\nname = "b\xff\xfe"\n', "is not UTF-8 text"),
    "deeply-nested": (b'[bundle]\nmade_by = "rocforge"\nname = "b"\nx = ' + b"[" * 5000 + b"]" * 5000 + b"\n",
                      "is not valid TOML"),
    "bundle-not-a-table": (b'bundle = "rocforge"\n', "not a rocforge bundle"),
}


@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
@pytest.mark.parametrize("case", sorted(BAD_TOMLS))
def test_a_bad_bundle_toml_is_one_line(sandbox, capsys, suffix, case):
    toml, why = BAD_TOMLS[case]
    archive = write_archive(sandbox / "work" / f"{case}{suffix}", good_entries(toml=toml))
    assert why in check_fails(archive, capsys)
    assert why in attack_unpack(sandbox, archive, capsys, 7)


@pytest.mark.parametrize("case", sorted(BAD_TOMLS))
def test_a_bad_bundle_toml_in_a_folder_is_one_line(sandbox, capsys, case):
    toml, why = BAD_TOMLS[case]
    folder = sandbox / "work" / "b"
    folder.mkdir()
    (folder / "bundle.toml").write_bytes(toml)
    assert why in check_fails(folder, capsys)


@pytest.mark.parametrize("suffix", [".tar.gz", ZSTD])
@pytest.mark.parametrize("keep", ["half", "all-but-4", "first-100"])
def test_a_cut_archive_is_one_line(sandbox, capsys, suffix, keep):
    """Cut anywhere: in a member, in the end marker, in the gzip trailer (its CRC32/length) or
    the zstd frame's checksum; zstd's own complaint goes into the one line, not beside it."""
    whole = write_tar(sandbox / "work" / f"whole{suffix}", good_entries()).read_bytes()
    n = {"half": len(whole) // 2, "all-but-4": len(whole) - 4, "first-100": 100}[keep]
    archive = sandbox / "work" / f"cut{suffix}"
    archive.write_bytes(whole[:n])
    assert "is truncated or not a readable" in check_fails(archive, capsys)
    attack_unpack(sandbox, archive, capsys, 7)


def test_bytes_after_the_gzip_stream_are_refused(sandbox, capsys):
    archive = write_tar(sandbox / "work" / "trail.tar.gz", good_entries())
    archive.write_bytes(archive.read_bytes() + b"appended garbage")
    assert "data after the end of the gzip stream" in check_fails(archive, capsys)


def _corrupt_deflate(archive: Path, member: str) -> None:
    """Overwrite the middle of `member`'s compressed data (its local header says where)."""
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member)
    data = bytearray(archive.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start, start + info.compress_size):
        data[i] ^= 0x5A
    archive.write_bytes(bytes(data))


def test_a_corrupt_deflate_stream_in_a_zip_is_one_line(sandbox, capsys):
    big = bytes(range(256)) * 64
    files = {**GOOD_FILES, "bin/prog": big}
    entries = [e if e[1] != "b/bin/prog" else ("file", "b/bin/prog", big)
               for e in good_entries(toml=toml_for("b", files, GOOD_LINKS))]
    archive = write_zip(sandbox / "work" / "deflate.zip", entries)
    _corrupt_deflate(archive, "b/bin/prog")
    assert "is truncated or not a readable .zip archive" in check_fails(archive, capsys)
    attack_unpack(sandbox, archive, capsys, 7)


def test_a_zip_link_target_that_is_not_utf8_is_one_line(sandbox, capsys):
    archive = write_zip(sandbox / "work" / "nonutf8.zip", _with([("link", "b/odd", b"lib\xff\xfe")]))
    assert "a link target that is not UTF-8" in check_fails(archive, capsys)
    attack_unpack(sandbox, archive, capsys, 7)


def test_special_members_are_refused(sandbox, capsys):
    archive = sandbox / "work" / "fifo.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:  # a good bundle with a FIFO member at its end
        for kind, name, payload in good_entries():
            info = tarfile.TarInfo(name)
            info.type = {"dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE, "file": tarfile.REGTYPE}[kind]
            if kind == "link":
                info.linkname = payload
            info.size = len(payload) if kind == "file" else 0
            tf.addfile(info, io.BytesIO(payload) if kind == "file" else None)
        fifo = tarfile.TarInfo("b/pipe")
        fifo.type = tarfile.FIFOTYPE
        tf.addfile(fifo)
    assert "neither file, directory nor symbolic link" in check_fails(archive, capsys)
    attack_unpack(sandbox, archive, capsys, 7)


# -- a real small disk: a bomb stops with exit 10, the tree removed --------------------------------
@pytest.fixture
def small_disk(sandbox):
    """A real 2 MiB tmpfs as --into (root mounts it; unmounted at teardown)."""
    if os.geteuid() != 0:
        pytest.skip("SKIPPED LOUDLY: the disk-full test mounts a 2 MiB tmpfs, which needs root")
    into = sandbox / "up" / "above" / "into"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(into)], check=True)
    try:
        yield into
    finally:
        subprocess.run(["umount", str(into)], check=True)


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("shape", ["one-big", "many-small"])
def test_a_bomb_on_a_small_disk_is_disk_full_not_a_crash(sandbox, small_disk, capsys, suffix, shape):
    """8 MB of zeros (a few kB compressed) into 2 MiB: exit 10 (disk full), not 70."""
    zeros = {"one-big": {"bin/zero": bytes(8 << 20)},
             "many-small": {f"bin/zero{i}": bytes(700 << 10) for i in range(6)}}[shape]
    files = {**GOOD_FILES, **zeros}
    entries = good_entries(toml=toml_for("b", files, GOOD_LINKS))
    entries += [("file", f"b/{p}", data) for p, data in zeros.items()]
    archive = write_archive(sandbox / "work" / f"bomb{suffix}", entries)
    assert archive.stat().st_size < 200_000
    line = attack_unpack(sandbox, archive, capsys, 10)
    assert "stopped before filling the disk" in line or "no space left" in line, line
    used = shutil.disk_usage(small_disk).used
    assert used < 64 << 10, used  # the partial tree is gone


# -- --into and --out that are not what they should be ------------------------------------------
def test_into_naming_a_file_is_one_line(sandbox, capsys):
    archive = write_tar(sandbox / "work" / "good.tar.gz", good_entries())
    target = sandbox / "up" / "above" / "victim"
    for into in (target, target / "below"):
        capsys.readouterr()
        rc = main(["bundle", "unpack", str(archive), "--into", str(into)])
        assert "--into" in one_line(capsys.readouterr().err, rc, 2)
        assert target.read_text() == "the user's file\n"


def _cli(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """rocforge in a child process: a hang is a test failure (TimeoutExpired), not a stuck suite."""
    return subprocess.run([sys.executable, "-m", "rocforge_build.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_out_naming_a_dangling_link_or_a_fifo_is_one_line(sandbox):
    prefix = sandbox / "prefix"  # --out is judged before the prefix is looked at
    prefix.mkdir()
    dangling = sandbox / "work" / "b.tar.gz"
    dangling.symlink_to(sandbox / "work" / "nowhere.tar.gz")
    res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(dangling))
    assert "is a symbolic link" in one_line(res.stderr, res.returncode, 2)
    assert os.readlink(dangling) == str(sandbox / "work" / "nowhere.tar.gz")
    assert not (sandbox / "work" / "nowhere.tar.gz").exists()
    fifo = sandbox / "work" / "f.zip"
    os.mkfifo(fifo)
    res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(fifo))
    assert "is a FIFO: not replacing it" in one_line(res.stderr, res.returncode, 2)
    res = _cli("bundle", "check", str(fifo))
    assert "is a FIFO, not a bundle archive" in one_line(res.stderr, res.returncode, 2)


@pytest.mark.parametrize("where", ["lib/pipe", "bundle.toml"])
def test_a_fifo_in_a_bundle_folder_is_refused_not_opened(sandbox, capsys, where):
    """Before the fix `bundle check DIR` hashed the FIFO: its open() waited for a writer forever."""
    archive = write_tar(sandbox / "work" / "good.tar.gz", good_entries())
    into = sandbox / "up" / "above" / "into"
    assert main(["bundle", "unpack", str(archive), "--into", str(into)]) == 0
    if where == "bundle.toml":
        (into / "b" / "bundle.toml").unlink()
    os.mkfifo(into / "b" / where)
    res = _cli("bundle", "check", str(into / "b"))
    assert "is a FIFO" in one_line(res.stderr, res.returncode, 7)


def test_a_link_named_bundle_toml_in_a_folder_is_not_followed(sandbox, capsys):
    folder = sandbox / "work" / "b"
    folder.mkdir()
    (sandbox / "work" / "elsewhere.toml").write_bytes(toml_for("b", {}, {}))
    (folder / "bundle.toml").symlink_to(sandbox / "work" / "elsewhere.toml")
    assert "is a symbolic link, not a file" in check_fails(folder, capsys)


# -- `rocforge bundle PREFIX`: special files inside the prefix -------------------------------------
def _show_prefix(where: Path) -> Path:
    """A prefix `rocforge build` could have made: a script (no ELF, no closure) and a manifest."""
    prefix = where / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "show").write_bytes(RUN)
    (prefix / "bin" / "show").chmod(0o755)
    (prefix / "rocforge-manifest.toml").write_text(
        f'prefix = "{prefix}"\ntarget = "gfx1151"\nbackend = "cpu"\n[recipe]\nname = "show"\n')
    return prefix


@pytest.mark.parametrize("kind", ["fifo", "socket", "manifest-fifo"])
def test_a_special_file_in_the_prefix_is_refused_before_any_copy(sandbox, kind):
    """A FIFO (shutil.copytree ended in exit 70, "internal error"), a socket, or a FIFO in the
    manifest's place: one line naming the file, exit 2, no hang, no bundle and no work left."""
    import socket

    prefix = _show_prefix(sandbox / "work")
    special = prefix / {"fifo": "share/pipe", "socket": "run.sock",
                        "manifest-fifo": "rocforge-manifest.toml"}[kind]
    special.parent.mkdir(exist_ok=True)
    sock = None
    if kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(special))
    else:
        special.unlink(missing_ok=True)
        os.mkfifo(special)
    out = sandbox / "work" / "b.tar.gz"
    before = snapshot(sandbox)
    try:
        res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(out))
    finally:
        if sock is not None:
            sock.close()
    line = one_line(res.stderr, res.returncode, 2)
    assert f"{special} is a {'socket' if kind == 'socket' else 'FIFO'}, not a regular file" in line
    assert snapshot(sandbox) == before and not out.exists()


def test_a_device_in_the_prefix_is_refused(sandbox):
    """A character device (/dev/zero's numbers) would be copied as its endless contents."""
    prefix = _show_prefix(sandbox / "work")
    try:
        os.mknod(prefix / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(sandbox / "b.tar.gz"))
    assert f"{prefix / 'zero'} is a character device" in one_line(res.stderr, res.returncode, 2)
    assert not (sandbox / "b.tar.gz").exists()


# -- every key of bundle.toml has a spec: archive and unpacked folder alike ------------------------
def full_toml(name: str = "b", change=None) -> bytes:
    """bundle.toml with every key rocforge writes (render_toml's shape), `change(doc)` applied."""
    import tomlkit

    doc = {
        "bundle": {"made_by": "rocforge", "rocforge": "0.1.0", "name": name, "made_at": "2026-01-01T00:00:00Z",
                   "recipe": "show", "target": "gfx1151", "backend": "hip", "gpu": "none",
                   "gpu_meaning": "none: CPU code only", "kernel_targets": ["gfx1151"], "glibc": "glibc 2.36",
                   "launcher": "run"},
        "decisions": [{"key": "prefix", "value": "/opt/p", "reason": "given as PREFIX"}],
        "excluded": [{"library": "/lib/x86_64-linux-gnu/libc.so.6", "why": "glibc"}],
        "kernels": [{"dir": "lib/rocblas/library", "kept": 1, "dropped": 0, "targets": ["gfx1151"],
                     "reason": "rocBLAS"}],
        "env": {"HIP_VISIBLE_DEVICES": "0"},
        "file": [{"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "from": "prefix"}
                 for p, d in sorted(GOOD_FILES.items())] + [{"path": p, "link": t} for p, t in sorted(GOOD_LINKS.items())],
    }
    if change is not None:
        change(doc)
    return tomlkit.dumps(doc).encode()


def _set(where: str, value):
    """A change setting `where` (`bundle.target`, `file[0].size`, `env.R2`, `kernels`) to `value`."""
    def change(doc):
        node, parts = doc, where.replace("[", ".").replace("]", "").split(".")
        for p in parts[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        node[parts[-1]] = value
    return change


def _env(table):
    def change(doc):
        doc["env"] = table
    return change


NAN, HUGE = float("nan"), 1e300
# (the field the error must name, the change): every key, with values the tester found accepted
BAD_KEYS = [
    ("env.R2", _env({"R2": "a\nb"})), ("env.A B", _env({"A B": "x"})), ("env.R2", _env({"R2": 5})),
    ("env", _set("env", "x")),
    *[("file[0].size", _set("file[0].size", v)) for v in ("x", -5, NAN, HUGE, 1 << 50, True)],
    *[("file[0].path", _set("file[0].path", v)) for v in ("../x", "/etc/passwd", "a//b", "a\nb", "./run", 5)],
    *[("file[0].sha256", _set("file[0].sha256", v)) for v in ("zz", "A" * 64, 5)],
    *[("file[3].link", _set("file[3].link", v)) for v in ("/etc/passwd", "", "a\x1b[2Jb", 5)],
    ("file[0].from", _set("file[0].from", "prefix\nPASSED")),
    ("kernels", _set("kernels", "x")), ("kernels[0].dir", _set("kernels[0].dir", "../../x")),
    *[("kernels[0].kept", _set("kernels[0].kept", v)) for v in (-1, "3", NAN)],
    ("kernels[0].targets[0]", _set("kernels[0].targets", ["gfx1151\nPASSED"])),
    *[("bundle.launcher", _set("bundle.launcher", v)) for v in ("../../x", "/bin/sh", "", "a/../../x", 5)],
    *[("bundle.target", _set("bundle.target", v)) for v in ("gfx1151\nPASSED", "\x1b[31mgfx1151", "gfx99999",
                                                           "x", 5)],
    *[("bundle.gpu", _set("bundle.gpu", v)) for v in ("cuda", "gfx1151\x1b[2J", "")],
    *[("bundle.kernel_targets", _set("bundle.kernel_targets", v)) for v in ("gfx1151", ["x"])],
    *[("bundle.name", _set("bundle.name", v)) for v in ("a/b", "b\x1b[2J", "..")],
    *[(f"bundle.{k}", _set(f"bundle.{k}", v)) for k in ("rocforge", "made_at", "recipe", "backend",
                                                        "gpu_meaning", "glibc")
      for v in ("x\nPASSED", "x\x1b[2Jy", 5)],
    ("decisions", _set("decisions", "x")), ("decisions[0].value", _set("decisions[0].value", "a\nPASSED")),
    ("excluded[0].library", _set("excluded[0].library", "")), ("excluded[0].why", _set("excluded[0].why", 7)),
    # unknown keys are refused: a key no spec names would reach check's output unchecked
    ("surprise", _set("surprise", "x")), ("bundle.surprise", _set("bundle.surprise", "x")),
    ("file[0].surprise", _set("file[0].surprise", "x")), ("kernels[0].surprise", _set("kernels[0].surprise", 1)),
]


def test_the_full_bundle_toml_is_valid(sandbox, capsys):
    """The baseline of the attacks below: every key set as rocforge writes it checks, unpacks."""
    archive = write_tar(sandbox / "work" / "full.tar.gz", good_entries(toml=full_toml()))
    assert main(["bundle", "check", str(archive)]) == 0
    into = sandbox / "up" / "above" / "into"
    assert main(["bundle", "unpack", str(archive), "--into", str(into)]) == 0
    assert main(["bundle", "check", str(into / "b")]) == 0


@pytest.mark.parametrize(("field", "change"), BAD_KEYS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_KEYS)])
def test_every_key_of_bundle_toml_is_checked(sandbox, capsys, field, change):
    """Before the fix, `[env] R2 = "a\\nb"`, `size = nan`, `launcher = "../../x"` or
    `target = "gfx1151\\nPASSED"` (which printed a fake line) were accepted with exit 0."""
    toml = full_toml(change=change)
    archive = write_tar(sandbox / "work" / "bad.tar.gz", good_entries(toml=toml))
    for line in (check_fails(archive, capsys), attack_unpack(sandbox, archive, capsys, 7)):
        assert f"field {field}" in line, line
        assert "\x1b" not in line, line
    folder = sandbox / "work" / "b"  # the same bundle, unpacked by hand
    for kind, rel, payload in good_entries(toml=toml):
        target = sandbox / "work" / rel
        if kind == "dir":
            target.mkdir()
        elif kind == "link":
            target.symlink_to(payload)
        else:
            target.write_bytes(payload)
    assert f"field {field}" in check_fails(folder, capsys)


# -- names bundle.toml cannot carry; builds made for no GPU target ---------------------------------
@needs("patchelf")
@pytest.mark.parametrize("bad", [b"bad\xffname", b"two\nlines", b"esc\x1b[2Jape"])
def test_a_name_bundle_toml_cannot_record_is_one_line(sandbox, bad):
    """Before the fix a file named `bad\\xffname` in the prefix ended in exit 70 (internal error:
    UnicodeEncodeError writing bundle.toml); a newline or escape in a name made a bundle that
    `bundle check` then refused.  Refused before any copy: one line naming the file, exit 2."""
    prefix = _show_prefix(sandbox / "work")
    with open(os.path.join(os.fsencode(prefix / "bin"), bad), "wb") as fh:
        fh.write(RUN)
    out = sandbox / "work" / "b.tar.gz"
    before = snapshot(sandbox)
    res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(out))
    line = one_line(res.stderr, res.returncode, 2)
    assert repr(str(prefix / "bin" / os.fsdecode(bad))) in line, line
    assert "\x1b" not in res.stderr
    assert snapshot(sandbox) == before and not out.exists()


def _cpu_prefix(where: Path, target: str) -> Path:
    prefix = _show_prefix(where)
    manifest = prefix / "rocforge-manifest.toml"
    manifest.write_text(manifest.read_text().replace('target = "gfx1151"', f'target = "{target}"'))
    return prefix


@needs("patchelf")
def test_a_build_for_no_gpu_target_bundles_without_target(sandbox):
    """A CPU or Vulkan build records `target = ""`: before the fix it could not be bundled at all
    ("built for , not gfx1151", hint "use --target ,"; `--target ''`: "--target is required")."""
    prefix = _cpu_prefix(sandbox / "work", "")
    out = sandbox / "work" / "cpu.tar.gz"
    res = _cli("bundle", str(prefix), "--out", str(out))
    assert res.returncode == 0, res.stderr
    res = _cli("bundle", "check", str(out))
    assert res.returncode == 0, res.stderr
    assert "show (cpu) for no GPU target" in res.stdout
    assert "CPU code only" in res.stdout
    again = sandbox / "work" / "cpu2.tar.gz"
    res = _cli("bundle", str(prefix), "--target", "gfx1151", "--out", str(again))
    assert res.returncode == 0, res.stderr
    assert "rocforge: warning: --target gfx1151 is ignored" in res.stderr
    for argv in (["--target", ""], []):
        res = _cli("bundle", str(prefix), *argv, "--out", str(sandbox / "work" / "cpu3.tar.gz"))
        assert res.returncode == 0 and " , " not in res.stderr and "for ," not in res.stderr, res.stderr


def test_a_gpu_build_without_target_names_its_target(sandbox):
    prefix = _cpu_prefix(sandbox / "work", "gfx1151")
    res = _cli("bundle", str(prefix), "--out", str(sandbox / "work" / "g.tar.gz"))
    line = one_line(res.stderr, res.returncode, 2)
    assert "was built for gfx1151" in line and "add --target gfx1151" in res.stderr
    res = _cli("bundle", str(prefix), "--target", "gfx1100", "--out", str(sandbox / "work" / "g.tar.gz"))
    assert "was built for gfx1151, not gfx1100" in one_line(res.stderr, res.returncode, 2)


@needs("patchelf")
def test_a_recipes_cpu_build_is_found_without_target(sandbox):
    """RECIPE names the build rocforge made: one made for no GPU target is found without --target
    (and with one, which is then ignored); the bundle's folder is `<recipe>-<backend>`."""
    data = sandbox / "data"
    prefix = data / "builds" / "llama-cpp-cpu"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "show").write_bytes(RUN)
    (prefix / "rocforge-manifest.toml").write_text(
        f'prefix = "{prefix}"\ntarget = ""\nbackend = "cpu"\n[recipe]\nname = "llama-cpp"\n')
    env = {**os.environ, "ROCFORGE_DATA_DIR": str(data)}
    for argv, name in ((["--target", "gfx1151"], "t"), ([], "n")):
        out = sandbox / "work" / f"{name}.tar.gz"
        res = subprocess.run([sys.executable, "-m", "rocforge_build.cli", "bundle", "llama-cpp", *argv,
                              "--out", str(out)], capture_output=True, text=True, timeout=60, env=env,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr
        assert ("is ignored" in res.stderr) == bool(argv), res.stderr
        with tarfile.open(out) as tf:
            assert tf.getnames()[0] == "llama-cpp-cpu"
