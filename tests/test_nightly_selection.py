"""nightly/selection.py: which nightly `nightly install` takes.  The known-bad nightlies are left
out of `latest` (those newer than the choice named in its reason), all of them known-bad is one
error, a pinned one is taken with its entry said; a file:// mirror that cannot be read is skipped
with a warning when another source answers, and all of them failing is one line."""

from __future__ import annotations

import pytest
from therock_tarballs import tarball_name

from rocforge_build import config
from rocforge_build.discover.known_bad import KnownBad
from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.nightly import listing
from rocforge_build.nightly.selection import Listings, Wanted, read, select

OLD, BAD1, BAD2 = "7.10.0a20251021", "7.10.0a20251101", "7.10.0a20251105"
SEGFAULT = KnownBad(BAD1, BAD2, ("gfx1151",), "segfaults at start-up", "TheRock #1")
GFX1151 = tuple(listing.groups_for("gfx1151"))


def entries(*versions: str, group: str = "gfx1151") -> list[listing.Nightly]:
    return listing.sort_newest(listing.parse_name(tarball_name(group, v), f"https://cdn/{v}")
                               for v in versions)


def finder(version, target=None, family=None):
    return SEGFAULT if SEGFAULT.covers(version) and SEGFAULT.hits(target, family) else None


def test_latest_is_the_newest_nightly_no_known_bad_entry_covers():
    got = select(entries(OLD, BAD1, BAD2), Wanted(groups=GFX1151, target="gfx1151"), finder)
    assert [e.version for e in got.layers] == [OLD]
    assert got.skipped_known_bad == (SEGFAULT.describe(BAD2), SEGFAULT.describe(BAD1))
    assert got.reason.endswith("; skipped " + "; ".join(got.skipped_known_bad))
    assert got.pinned_known_bad is None


def test_a_known_bad_entry_for_another_gpu_leaves_the_newest():
    got = select(entries(OLD, BAD1, group="gfx110X-all"),
                 Wanted(groups=tuple(listing.groups_for("gfx1100")), target="gfx1100"), finder)
    assert [e.version for e in got.layers] == [BAD1]
    assert got.skipped_known_bad == () and "skipped" not in got.reason


def test_every_nightly_known_bad_is_one_error_naming_each():
    with pytest.raises(UsageError) as got:
        select(entries(BAD1, BAD2), Wanted(groups=GFX1151, target="gfx1151"), finder)
    assert got.value.message == ("every nightly published for this target is known-bad: "
                                 f"{SEGFAULT.describe(BAD2)}; {SEGFAULT.describe(BAD1)}")
    assert got.value.hint == "install one anyway with --version VERSION"


def test_a_pinned_known_bad_version_is_taken_as_asked_with_its_entry():
    got = select(entries(OLD, BAD1, BAD2), Wanted(groups=GFX1151, target="gfx1151", version=BAD1),
                 finder)
    assert [e.version for e in got.layers] == [BAD1] and got.top.version == BAD1
    assert got.pinned_known_bad == SEGFAULT.describe(BAD1)
    assert got.skipped_known_bad == () and "skipped" not in got.reason


def test_an_unreadable_mirror_is_skipped_with_a_warning_when_another_answers(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / tarball_name("gfx1151", OLD)).write_bytes(b"x")
    dead = (tmp_path / "gone").as_uri() + "/"
    warned = []
    got = read(Listings(index=(dead, live.as_uri() + "/")), config.effective(), warned.append)
    assert [e.version for e in got] == [OLD]
    assert len(warned) == 1 and warned[0].startswith(f"source skipped: {dead}: ")
    with pytest.raises(NetworkError) as failed:
        read(Listings(index=(dead, (tmp_path / "also-gone").as_uri() + "/")), config.effective(),
             warned.append)
    assert failed.value.message == "none of the 2 nightly sources could be read (each is named above)"
    assert len(warned) == 3  # each failing source named


def test_one_source_that_fails_is_its_own_error_and_no_warning(tmp_path):
    warned = []
    with pytest.raises(NetworkError) as failed:
        read(Listings(index=((tmp_path / "gone").as_uri() + "/",)), config.effective(), warned.append)
    assert "none of" not in failed.value.message and warned == []


def test_the_platform_asked_for_is_the_one_listed(tmp_path):
    (tmp_path / tarball_name("gfx1151", OLD)).write_bytes(b"x")
    (tmp_path / tarball_name("gfx1151", BAD1, platform="windows")).write_bytes(b"x")
    index = (tmp_path.as_uri() + "/",)
    assert [e.version for e in read(Listings(index), config.effective(), print)] == [OLD]
    assert [e.version for e in read(Listings(index, "windows"), config.effective(), print)] == [BAD1]
