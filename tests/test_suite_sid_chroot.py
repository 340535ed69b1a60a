"""The sid chroot helper's pure parts: the mirror URI read from the host's apt sources (deb822
and one-line forms), and the cache key that changes with the package list."""

from __future__ import annotations

import pytest
import sid_chroot


def test_mirror_uri_from_deb822_skips_security(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
        "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n")
    assert sid_chroot.mirror_uri(tmp_path) == "http://deb.debian.org/debian"


def test_mirror_uri_from_one_line_sources_list(tmp_path):
    (tmp_path / "sources.list").write_text(
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main contrib\n")
    assert sid_chroot.mirror_uri(tmp_path) == "http://mirror.example/debian"


def test_no_bookworm_entry_is_said(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
    with pytest.raises(sid_chroot.NoChroot, match="no Debian bookworm entry"):
        sid_chroot.mirror_uri(tmp_path)


def test_cache_key_follows_the_package_list():
    assert sid_chroot.key(sid_chroot.PACKAGES) == sid_chroot.key(tuple(reversed(sid_chroot.PACKAGES)))
    assert sid_chroot.key((*sid_chroot.PACKAGES, "clang-22")) != sid_chroot.key(sid_chroot.PACKAGES)
