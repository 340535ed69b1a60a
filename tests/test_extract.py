"""Safe extraction: hostile members are refused before anything lands outside, truncated archives
fail cleanly, layering replaces instead of writing through, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import errno
import os
import tarfile

import pytest
from therock_tarballs import hostile, make_tree, pack

from rocforge_build import extract
from rocforge_build.errors import DiskFullError, IntegrityError


@pytest.fixture
def area(tmp_path):
    """dest inside a prefix, and a sentinel 'outside' directory that must stay untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    return tmp_path, prefix, outside


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.is_symlink()) for p in path.rglob("*"))


def test_real_tree_round_trip(tmp_path):
    for broken in (True, False):  # bin/amdclang++ links were dangling before Mar 2026
        tree = make_tree(tmp_path / f"t{broken}", "7.10.0a20251021", ["gfx1151"],
                         broken_amdclang=broken)
        arch = pack(tree, tmp_path / f"a{broken}.tar.gz")
        dest = tmp_path / f"d{broken}"
        dest.mkdir()
        stats = extract.safe_extract(arch, dest)
        assert _snapshot(dest) == _snapshot(tree)
        assert os.readlink(dest / "llvm") == "lib/llvm"
        assert os.readlink(dest / "bin/amdclang++") == os.readlink(tree / "bin/amdclang++")
        assert (dest / "bin/amdclang++").exists() is not broken
        assert os.access(dest / "lib/llvm/bin/clang", os.X_OK)
        assert (dest / "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat").exists()
        assert stats.files >= 50


HOSTILE = {
    "dotdot": [("file", "../evil.txt", b"pwned")],
    "nested-dotdot": [("dir", "bin"), ("file", "bin/../../evil.txt", b"pwned")],
    "absolute": [("file", "/tmp/evil-rocforge-test.txt", b"pwned")],
    "symlink-absolute": [("symlink", "lib/passwd", "/etc/passwd")],
    "symlink-escape": [("dir", "lib"), ("symlink", "lib/up", "../../outside")],
    # each link looks harmless alone; together they climb out (x/s -> x, t -> x/s/../..)
    "symlink-chain": [("dir", "x"), ("symlink", "x/s", "."), ("symlink", "t", "x/s/../.."),
                      ("file", "t/outside/keep.txt", b"pwned")],
    "write-through-link": [("symlink", "esc", "."), ("symlink", "esc2", "esc/.."),
                           ("file", "esc2/evil.txt", b"pwned")],
    # harmless while unpacking (q does not exist yet); escapes once `q -> .` is in place
    "late-link": [("symlink", "p", "q/q/../../outside/keep.txt"), ("symlink", "q", ".")],
    "late-link-dir": [("dir", "lib"), ("symlink", "lib/esc", "../q/q/../../outside"),
                      ("symlink", "q", ".")],
    "hardlink-outside": [("hardlink", "lib/shadow", "/etc/passwd")],
    "hardlink-dotdot": [("hardlink", "lib/shadow", "../outside/keep.txt")],
    "hardlink-unknown": [("hardlink", "lib/shadow", "lib/nothing")],
    "device": [("chr", "dev/null")],
    "fifo": [("fifo", "pipe")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused_and_nothing_escapes(area, case):
    root, prefix, outside = area
    arch = hostile(root / f"{case}.tar.gz", [("dir", "bin"), ("file", "bin/ok", b"ok")]
                   + HOSTILE[case])
    before_root = sorted(p.name for p in root.iterdir())
    with pytest.raises(IntegrityError, match="refusing member") as exc:
        with extract.staging(prefix) as stage:
            extract.safe_extract(arch, stage)
    assert "hostile" in exc.value.hint
    assert (outside / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in root.iterdir()) == before_root
    assert list(prefix.iterdir()) == []  # the staging dir is gone
    assert not os.path.exists("/tmp/evil-rocforge-test.txt")


def test_truncated_archive(area):
    root, prefix, _ = area
    good = pack(make_tree(root / "t", "7.10.0a20251021", ["gfx1151"], payload=200_000),
                root / "good.tar.gz")
    data = good.read_bytes()
    bad = root / "bad.tar.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="truncated or corrupt"):
        with extract.staging(prefix) as stage:
            extract.safe_extract(bad, stage)
    assert list(prefix.iterdir()) == []
    garbage = root / "garbage.tar.gz"
    garbage.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(IntegrityError):
        with extract.staging(prefix) as stage:
            extract.safe_extract(garbage, stage)
    assert list(prefix.iterdir()) == []


def test_ctrl_c_during_extraction_removes_staging(area):
    root, prefix, _ = area
    arch = pack(make_tree(root / "t", "7.10.0a20251021", ["gfx1151"]), root / "a.tar.gz")
    seen = []

    def interrupt(member):
        seen.append(member.name)
        if len(seen) == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with extract.staging(prefix) as stage:
            extract.safe_extract(arch, stage, on_member=interrupt)
    assert len(seen) == 8 and list(prefix.iterdir()) == []


def test_disk_full_during_extraction(area, monkeypatch):
    root, prefix, _ = area
    arch = pack(make_tree(root / "t", "7.10.0a20251021", ["gfx1151"]), root / "a.tar.gz")
    real = tarfile.TarFile.makefile
    calls = {"n": 0}

    def full(self, tarinfo, targetpath):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tarinfo, targetpath)

    monkeypatch.setattr(tarfile.TarFile, "makefile", full)
    with pytest.raises(DiskFullError, match="no space left while unpacking"):
        with extract.staging(prefix) as stage:
            extract.safe_extract(arch, stage)
    assert list(prefix.iterdir()) == []


def test_layering_replaces_links_instead_of_writing_through(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    victim = dest / "lib" / "real.txt"
    base = hostile(tmp_path / "base.tar.gz", [("dir", "lib"), ("file", "lib/real.txt", b"base"),
                                                ("symlink", "lib/alias.txt", "real.txt")])
    top = hostile(tmp_path / "top.tar.gz", [("dir", "lib"), ("file", "lib/alias.txt", b"top")])
    extract.safe_extract(base, dest)
    extract.safe_extract(top, dest)
    assert victim.read_text() == "base"  # not overwritten through the old link
    assert not (dest / "lib/alias.txt").is_symlink()
    assert (dest / "lib/alias.txt").read_text() == "top"


def test_read_only_directories_still_fill_and_clean_up(tmp_path):
    arch = hostile(tmp_path / "ro.tar.gz", [("dir", "share")])
    with tarfile.open(arch, "w:gz") as tar:  # rewrite with a 0555 directory holding a file
        info = tarfile.TarInfo("share")
        info.type, info.mode = tarfile.DIRTYPE, 0o555
        tar.addfile(info)
        import io

        f = tarfile.TarInfo("share/file")
        f.size = 2
        tar.addfile(f, io.BytesIO(b"hi"))
    prefix = tmp_path / "p"
    with extract.staging(prefix) as stage:
        extract.safe_extract(arch, stage)
        assert (stage / "share/file").read_text() == "hi"
    assert list(prefix.iterdir()) == []


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_refused_without_the_stdlib_filter(area, case, monkeypatch):
    """Debian 12's Python (3.11.2) has no tarfile `data` filter: rocforge's own checks must
    refuse every hostile archive on their own."""
    monkeypatch.setattr(extract, "_DATA_FILTER", {})
    monkeypatch.setattr(extract, "_FILTER_ERRORS", ())
    root, prefix, outside = area
    arch = hostile(root / f"{case}.tar.gz", [("dir", "bin"), ("file", "bin/ok", b"ok")]
                   + HOSTILE[case])
    with pytest.raises(IntegrityError, match="refusing member"):
        with extract.staging(prefix) as stage:
            extract.safe_extract(arch, stage)
    assert (outside / "keep.txt").read_text() == "precious"
    assert not list(root.glob("**/evil.txt")) and not list(root.glob("**/pwned"))


def test_gzip_trailer_and_trailing_bytes_are_checked(area):
    """tarfile stops at the tar end marker; the gzip CRC32/ISIZE trailer after it is read too."""
    root, prefix, _ = area
    good = pack(make_tree(root / "t", "7.10.0a20251021", ["gfx1151"]), root / "good.tar.gz")
    data = good.read_bytes()
    for name, bad, why in (
            ("crc", data[:-8] + bytes([data[-8] ^ 1]) + data[-7:], "CRC32"),
            ("isize", data[:-4] + bytes([data[-4] ^ 1]) + data[-3:], "length"),
            ("trailing", data + b"\0\0\0\0", "data after the end"),
            ("trailing-text", data + b"hello", "data after the end")):
        arch = root / f"{name}.tar.gz"
        arch.write_bytes(bad)
        with pytest.raises(IntegrityError, match=why):
            with extract.staging(prefix) as stage:
                extract.safe_extract(arch, stage)
        assert list(prefix.iterdir()) == []
    # two gzip members one after the other are one valid gzip file (RFC 1952)
    import gzip

    raw = gzip.decompress(data)
    two = root / "two.tar.gz"
    two.write_bytes(gzip.compress(raw[:10240]) + gzip.compress(raw[10240:]))
    dest = root / "d"
    dest.mkdir()
    assert extract.safe_extract(two, dest).files >= 50


def test_declared_sizes_are_checked_against_free_space(area):
    """The space probe sees each member's declared size before it is written; statvfs is asked
    again only when the budget from the last answer runs out."""
    root, prefix, _ = area
    tree = make_tree(root / "t", "7.10.0a20251021", ["gfx1151"], payload=300_000)
    arch = pack(tree, root / "a.tar.gz")
    asked = []

    def probe(path):
        asked.append(path)
        return 1_000_000 + 50_000, 5_000_000  # 50 kB reserve (1%): 1 MB may be written

    dest = root / "ok"
    dest.mkdir()
    extract.safe_extract(arch, dest, free_space=probe)
    assert asked and len(asked) < 5
    with pytest.raises(DiskFullError, match=r"declares 300.0 kB but only 350.0 kB is free .*keeps 100.0 kB spare"):
        with extract.staging(prefix) as stage:
            extract.safe_extract(arch, stage, free_space=lambda p: (350_000, 10_000_000))
    assert list(prefix.iterdir()) == []
