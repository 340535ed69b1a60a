"""`rocforge cache list|clean` on real cache dirs made by real builds of the fixture project, and
the attacks on it: links inside the cache pointing outside, a build prefix inside the cache dir,
bad --older-than values, an unreadable entry, a work dir whose build holds its lock."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy
from trust_helpers import build_lock_held

from rocforge_build import cli, ownership
from rocforge_build.forge import locations
from rocforge_build.forge.plan import work_dir

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _own_ccache(tmp_path, monkeypatch):
    """The compiler cache of these tests: an empty one of their own, never the user's."""
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "sccache"))


def cache() -> Path:
    return Path(os.environ["ROCFORGE_CACHE_DIR"])


def build(src: Path, prefix: Path) -> int:
    return cli.main(["build", str(RECIPE), "--target", "gfx1030", "--source", str(src),
                     "--prefix", str(prefix), "-j", "1", "--no-cache"])


def rf_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert cli.main(["cache", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_path(listing: dict) -> dict[str, dict]:
    return {e["path"]: e for e in listing["entries"]}


def test_list_tells_installed_from_failed_work_dirs_and_clean_failed_keeps_the_rest(tmp_path, capsys):
    good_src, bad_src = project_copy(tmp_path / "good"), project_copy(tmp_path / "bad")
    (bad_src / "hello.c").write_text("this is not C\n")
    good, bad = tmp_path / "prefix-good", tmp_path / "prefix-bad"
    assert build(good_src, good) == 0
    assert build(bad_src, bad) != 0
    entries = by_path(rf_json(capsys, "list"))
    assert entries[str(work_dir(good))]["category"] == "work"
    assert entries[str(work_dir(bad))]["category"] == "failed"
    assert entries[str(work_dir(bad))]["size"] > 0

    out = rf_json(capsys, "clean", "--failed")
    assert [e["path"] for e in out["entries"] if e["removed"]] == [str(work_dir(bad))]
    assert not work_dir(bad).exists() and not Path(f"{work_dir(bad)}.lock").exists()
    assert work_dir(good).is_dir() and (good / "rocforge-manifest.toml").is_file()

    # everything is minutes old: --older-than 1 (day) matches nothing
    assert rf_json(capsys, "clean", "--older-than", "1")["entries"] == []
    assert work_dir(good).is_dir()
    assert rf_json(capsys, "clean", "--dry-run")["freed_bytes"] > 0
    assert work_dir(good).is_dir()
    rf_json(capsys, "clean")
    assert not work_dir(good).exists()
    assert (good / "rocforge-manifest.toml").is_file()  # the build prefix itself: never
    assert build(good_src, good) == 0  # the removed work dir is made again by the next build


def test_links_inside_the_cache_are_never_followed(tmp_path, capsys):
    outside = tmp_path / "precious"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "file").write_text("keep me")
    tree = cache() / "sources" / "trees" / "t1"
    tree.mkdir(parents=True)
    (tree / ".rocforge-complete").write_text(  # what forge/sources.py writes there
        "https://example.org/project.git " + "ab" * 20 + "\n")
    (tree / "to-outside").symlink_to(outside)  # a link inside a rocforge entry
    (cache() / "sources" / "trees" / "t2").symlink_to(outside)  # an entry that is itself a link
    (cache() / "downloads").mkdir()
    (cache() / "downloads" / "x.tar.gz").symlink_to(outside / "deep" / "file")

    entries = by_path(rf_json(capsys, "list"))
    assert entries[str(tree)]["removable"] is True
    assert entries[str(tree)]["size"] < 10_000  # the link's own size, not the target's
    assert "symbolic link" in entries[str(cache() / "sources" / "trees" / "t2")]["kept"]
    out = rf_json(capsys, "clean")
    assert not tree.exists()
    assert (cache() / "sources" / "trees" / "t2").is_symlink()
    assert (cache() / "downloads" / "x.tar.gz").is_symlink()
    assert (outside / "deep" / "file").read_text() == "keep me"
    assert {e["path"] for e in out["entries"] if not e["removed"]} == {
        str(cache() / "sources" / "trees" / "t2"), str(cache() / "downloads" / "x.tar.gz")}


def test_a_linked_category_directory_is_not_entered(tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    (outside / "abc123").mkdir(parents=True)
    (outside / "abc123" / "data").write_text("x")
    cache().mkdir(parents=True)
    (cache() / "work").symlink_to(outside)
    rf_json(capsys, "clean")
    assert (outside / "abc123" / "data").read_text() == "x"


def test_a_build_prefix_inside_the_cache_dir_is_never_removed(tmp_path, capsys):
    src = project_copy(tmp_path / "src")
    prefix = cache() / "sources" / "trees" / "my-install"  # a user's --prefix inside the cache
    assert build(src, prefix) == 0
    listing = by_path(rf_json(capsys, "list"))
    assert "build prefix" in listing[str(prefix)]["kept"]
    out = rf_json(capsys, "clean", "--sources")
    assert (prefix / "rocforge-manifest.toml").is_file()
    assert [e["removed"] for e in out["entries"] if e["path"] == str(prefix)] == [False]


def test_a_data_dir_inside_the_cache_dir_is_never_removed(tmp_path, monkeypatch, capsys):
    data = cache() / "verify" / "refs" / "data"
    (data / "builds").mkdir(parents=True)
    (data / "results.sqlite3").write_text("not lost")
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(data))
    out = rf_json(capsys, "clean")
    assert (data / "results.sqlite3").read_text() == "not lost"
    assert any(e["path"] == str(data) and not e["removed"] for e in out["entries"])


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", ""])
def test_a_bad_older_than_is_one_line_and_exit_2_and_removes_nothing(value, capsys):
    (cache() / "env").mkdir(parents=True)
    (cache() / "env" / "0.sh").write_text("x")
    with pytest.raises(SystemExit) as exc:
        cli.main(["cache", "clean", "--older-than", value])
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "--older-than" in err[0], err
    assert (cache() / "env" / "0.sh").is_file()


def test_an_unreadable_entry_is_kept_whole(capsys):
    """As an unprivileged user (root reads everything): a tree with a directory it cannot read is
    left whole, not half removed; the readable entry beside it goes."""
    with tempfile.TemporaryDirectory(prefix="rocforge-unreadable-") as top_name:
        top = Path(top_name)
        top.chmod(0o755)
        base = top / "cache"
        tree = base / "sources" / "trees" / "t1"
        (tree / "secret").mkdir(parents=True)
        (tree / "a-file").write_text("a")
        (tree / "secret" / "inside").write_text("s")
        (base / "downloads").mkdir(parents=True)
        fine = base / "downloads" / f"{hashlib.sha256(b'f').hexdigest()[:16]}-fine.tar.gz"
        fine.write_text("f")  # named by its sha256, as forge/sources.py names a download
        env = {"PATH": os.environ["PATH"], "HOME": str(top), "ROCFORGE_CACHE_DIR": str(base),
               "ROCFORGE_DATA_DIR": str(top / "data"), "ROCFORGE_CONFIG_DIR": str(top / "config"),
               "CCACHE_DIR": str(top / "ccache"), "SCCACHE_DIR": str(top / "sccache"),
               "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        argv = [sys.executable, "-m", "rocforge_build", "cache", "clean", "--json"]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("setpriv (util-linux) is needed to run as an unprivileged user")
            subprocess.run(["chown", "-R", "nobody:nogroup", str(base)], check=True)
            (tree / "secret").chmod(0o700)
            os.chown(tree / "secret", 0, 0)  # root's: nobody cannot read it
            argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
        else:
            (tree / "secret").chmod(0)
        try:
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        finally:
            (tree / "secret").chmod(0o755)
        assert out.returncode == 0, out.stderr
        entries = {e["path"]: e for e in json.loads(out.stdout)["entries"]}
        assert "cannot be read" in entries[str(tree)]["kept"]
        assert (tree / "a-file").is_file() and (tree / "secret" / "inside").is_file()
        assert not fine.exists()


def test_a_work_dir_whose_build_holds_its_lock_is_never_removed(tmp_path, capsys):
    work = cache() / "work" / "0123456789ab"
    (work / "build").mkdir(parents=True)
    ownership.write_mark(work, "a build work dir")  # as forge/pipeline.py marks it
    (work / "build" / "obj.o").write_text("o")
    with build_lock_held(work, tmp_path / "ready") as holder:
        listing = by_path(rf_json(capsys, "list"))
        assert listing[str(work)]["kept"].startswith("in use:")
        assert f"pid {holder.pid}" in listing[str(work)]["kept"]
        out = rf_json(capsys, "clean", "--work")
        assert (work / "build" / "obj.o").is_file()
        assert [e["outcome"] for e in out["entries"]][0].startswith("in use")
    rf_json(capsys, "clean", "--work")  # the build ended: now it goes, with its lock file
    assert not work.exists() and not Path(f"{work}.lock").exists()


def test_names_rocforge_does_not_make_are_listed_and_never_removed(capsys):
    locations.claim_cache_root()  # a cache rocforge made (CACHEDIR.TAG); then a user's file in it
    (cache() / "notes").mkdir(parents=True)
    (cache() / "notes" / "mine.txt").write_text("mine")
    listing = by_path(rf_json(capsys, "list"))
    assert listing[str(cache() / "notes")]["category"] == "other"
    rf_json(capsys, "clean")
    assert (cache() / "notes" / "mine.txt").read_text() == "mine"


def test_ccache_is_cleaned_only_by_asking_ccache_with_an_age(capsys):
    if shutil.which("ccache") is None:
        pytest.skip("ccache is not installed")
    ccache_dir = Path(os.environ["CCACHE_DIR"])
    ccache_dir.mkdir(parents=True)
    (ccache_dir / "ccache.conf").write_text("max_size = 1G\n")
    assert cli.main(["cache", "clean", "--ccache"]) == 0  # no age: nothing asked, one line said
    out = capsys.readouterr().out
    assert "give --older-than DAYS" in out
    assert (ccache_dir / "ccache.conf").is_file()
    result = rf_json(capsys, "clean", "--ccache", "--older-than", "30")
    assert result["ccache"]["done"] is True and "--evict-older-than 2592000s" in result["ccache"]["outcome"]
    assert (ccache_dir / "ccache.conf").read_text() == "max_size = 1G\n"
