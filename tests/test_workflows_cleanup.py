"""workflows/cleanup.py's `clean_cache`: the whole `cache clean` as one value — a dry run and the
real run consider the same entries, only rocforge's marked entries go, a foreign cache root is
refused before anything is scanned, and the root is tagged once nothing in it lacks the mark."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_commands_cache import _own_ccache  # noqa: F401 - autouse: a compiler cache of these tests' own

from rocforge_build import ownership
from rocforge_build.errors import RocforgeError
from rocforge_build.workflows import cleanup


def _cache() -> Path:
    return Path(os.environ["ROCFORGE_CACHE_DIR"])


def _tree(path: Path, *, marked: bool, size: int = 1000) -> Path:
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    if marked:
        ownership.write_mark(path, "a container build context")
    return path


def test_a_dry_run_and_the_clean_agree_and_only_marked_entries_go(tmp_path):
    mine = _tree(_cache() / "containers" / "abc", marked=True)
    foreign = _tree(_cache() / "containers" / "someone-elses", marked=False)
    dry = cleanup.clean_cache({"containers"}, None, dry_run=True, now=time.time())
    assert dry.categories == frozenset({"containers"}) and not dry.failed
    assert {(r.entry.path, r.done) for r in dry.removals} == {(mine, True), (foreign, False)}
    assert dry.freed >= 1000 and mine.is_dir()
    real = cleanup.clean_cache({"containers"}, None, dry_run=False, now=time.time())
    assert {(r.entry.path, r.done) for r in real.removals} == {(mine, True), (foreign, False)}
    assert real.freed == dry.freed and not mine.exists() and (foreign / "blob").is_file()
    assert not (_cache() / ownership.CACHEDIR_TAG).exists()  # someone's files are there: never tagged
    (foreign / "blob").unlink()
    foreign.rmdir()
    cleanup.clean_cache({"containers"}, None, dry_run=False, now=time.time())
    assert (_cache() / ownership.CACHEDIR_TAG).is_file()  # all of it is rocforge's now


def test_no_category_means_all_but_the_shared_compiler_cache_and_an_age_filters(tmp_path):
    old = _tree(_cache() / "bisect" / "old", marked=True)
    new = _tree(_cache() / "bisect" / "new", marked=True)
    week_ago = time.time() - 7 * 86400
    for p in (old, old / "blob", old / ownership.MARK):
        os.utime(p, (week_ago, week_ago))
    out = cleanup.clean_cache(set(), 3, dry_run=False, now=time.time())
    assert out.categories == frozenset(cleanup.CATEGORIES) - {"ccache"} and out.ccache is None
    assert [r.entry.path for r in out.removals] == [old] and not old.exists() and new.is_dir()


def test_a_cache_root_that_is_home_is_refused_before_anything_is_scanned(tmp_path, monkeypatch):
    home = tmp_path / "home"
    _tree(home / "work" / "abc", marked=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(home))
    with pytest.raises(RocforgeError):
        cleanup.clean_cache(None, None, dry_run=False, now=time.time())
    assert (home / "work" / "abc" / "blob").is_file()
