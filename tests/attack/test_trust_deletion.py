"""Attack tests for deletion by ownership (ownership.py): every recursive removal in rocforge goes
through `ownership.remove_owned` / `scratch_dir` (a tree carrying rocforge's mark, or a directory
this process made), on one device; a source tree is replaced as a whole (`install_tree`: staged
beside it, exchanged in one renameat2, the completeness stamp written last).  Done for real: a
directory of the user's at a source tree's path, a tmpfs and a bind mount inside a tree that a
re-fetch replaces, and a SIGKILL at each step of a replacement (the structural check of the code
is tests/test_ownership.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from buildfixtures import RECIPE, git_repo, tarball
from needs import needs
from trust_helpers import mount_namespace, one_error, python, rocforge, snapshot

from rocforge_build import ownership
from rocforge_build.download import sha256_file
from rocforge_build.forge import source_fetch, sources


def trees() -> Path:
    return Path(os.environ["ROCFORGE_CACHE_DIR"]) / "sources" / "trees"


def half_removed(spec: sources.Source) -> tuple[Path, dict[str, str]]:
    """A fetched tree as a killed `cache clean` leaves it: marked, its stamp and some files gone
    (so the next fetch replaces it); returns it and what a whole fetch holds."""
    tree = spec.fetch().root
    whole = snapshot(tree)
    (tree / ownership.COMPLETE).unlink()
    (tree / "CMakeLists.txt").unlink()
    return tree, whole


# -- a directory of the user's where a source tree goes -------------------------------------------

def test_a_users_directory_at_a_source_trees_path_is_refused_not_replaced(tmp_path):
    archive = tarball(tmp_path / "fx.tar.gz")
    mine = trees() / sha256_file(archive)[:20]
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "todo.txt").write_text("the user's")
    (mine / "CMakeLists.txt").write_text("# my own edit\n")
    before = snapshot(mine)
    res = rocforge("build", str(RECIPE), "--target", "gfx1151", "--source", str(archive),
                   "--prefix", str(tmp_path / "p"), "--dry-run", timeout=120)
    line = one_error(res)
    assert f"refusing to replace {mine} (a source tree)" in line and ".rocforge-owned" in line
    assert snapshot(mine) == before
    assert [p.name for p in trees().iterdir()] == [mine.name]  # no staging dir left beside it


def test_a_users_directory_at_a_git_trees_path_is_refused_before_anything_is_fetched(tmp_path):
    repo = git_repo(tmp_path / "repo")
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    for spec in (sources.GitSource(f"file://{repo}", ref="v1.2.0"),  # exported
                 sources.GitSource(f"file://{repo}", ref="v1.2.0", sparse=("src",))):
        dest = spec._stand_in(commit).root if not spec.checkout else None
        if dest is None:  # a checkout's tree is named for its commit and shape
            import hashlib

            shape = hashlib.sha256(json.dumps([["src"], False]).encode()).hexdigest()[:8]
            dest = trees() / f"{commit[:20]}-{shape}"
        dest.mkdir(parents=True)
        (dest / "mine.txt").write_text("the user's")
        with pytest.raises(ownership.NotOwned, match="carries no mark of rocforge's") as exc:
            spec.fetch(commit)
        assert exc.value.exit_code == 2 and str(dest) in exc.value.message
        assert snapshot(dest) == {"mine.txt": "file:the user's"}
        assert not source_fetch.mirror_has(spec.location, commit)  # nothing was fetched
    leftovers = [p.name for p in trees().iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_half_removed_tree_of_rocforges_is_replaced_whole(tmp_path):
    spec = sources.TarballSource(str(tarball(tmp_path / "fx.tar.gz")))
    tree, whole = half_removed(spec)
    again = spec.fetch()
    assert again.root == tree and snapshot(tree) == whole
    assert sorted(p.name for p in trees().iterdir()) == [tree.name]  # the old one went


def test_a_users_directory_at_a_closures_partial_or_a_container_context_path_is_kept(tmp_path):
    """`container closure --out OUT` stages into OUT.rocforge-partial and a container build into
    its context dir: a directory of the user's at either path is refused, not emptied; one that
    rocforge marked (a killed run's) is replaced."""
    from rocforge_build.ship import closure, container_context

    lib = tmp_path / "libx.so"
    lib.write_text("elf")
    one = closure.Closure(roots=[], elf_files=[],
                          entries={str(lib): closure.Entry(str(lib), "test", "library")})
    partial = tmp_path / "out.rocforge-partial"
    partial.mkdir()
    (partial / "mine.txt").write_text("the user's")
    with pytest.raises(ownership.NotOwned, match="carries no mark of rocforge's") as exc:
        closure.stage(one, tmp_path / "out")
    assert exc.value.exit_code == 2 and (partial / "mine.txt").read_text() == "the user's"
    ownership.write_mark(partial, "a killed run's partial closure")
    closure.stage(one, tmp_path / "out")
    assert not partial.exists() and (tmp_path / "out" / str(lib).lstrip("/")).read_text() == "elf"

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "notes.txt").write_text("the user's")
    with pytest.raises(ownership.NotOwned, match=f"refusing to remove {ctx}"):
        container_context.prepare_context(None, ctx)  # refused before the plan is read
    assert (ctx / "notes.txt").read_text() == "the user's"


# -- mounts inside a tree that is replaced -------------------------------------------------------

MOUNTED = textwrap.dedent("""
    import json, os, subprocess, sys
    from pathlib import Path
    from rocforge_build import ownership
    from rocforge_build.forge import sources
    spec = sources.TarballSource(sys.argv[1])
    elsewhere = Path(sys.argv[2])
    tree = spec.fetch().root
    (tree / ownership.COMPLETE).unlink()  # a killed clean: the next fetch replaces the tree
    (tree / "scratch").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tree / "scratch")], check=True)
    (tree / "scratch" / "on-tmpfs.txt").write_text("keep")
    (tree / "bound").mkdir()
    subprocess.run(["mount", "--bind", str(elsewhere), str(tree / "bound")], check=True)
    again = spec.fetch()
    mounted = [line.split()[4] for line in open("/proc/self/mountinfo")]
    on_tmpfs = [m for m in mounted if m.endswith("/scratch")]
    print(json.dumps({"root": str(again.root), "complete": (tree / ".rocforge-complete").is_file(),
                      "files": sorted(os.listdir(tree)), "mounts": on_tmpfs,
                      "tmpfs_file": [open(Path(m) / "on-tmpfs.txt").read() for m in on_tmpfs]}))
""")


@needs("unshare", "mount")
def test_a_tmpfs_and_a_bind_mount_inside_a_replaced_source_tree_keep_their_files(tmp_path):
    wrap = mount_namespace()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "on-bind.txt").write_text("keep")
    archive = tarball(tmp_path / "fx.tar.gz")
    res = python(MOUNTED, str(archive), str(elsewhere), wrap=wrap)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    tree = trees() / sha256_file(archive)[:20]
    assert got["root"] == str(tree) and got["complete"]  # the new tree is whole and in place
    assert "scratch" not in got["files"] and "bound" not in got["files"]
    assert got["tmpfs_file"] == ["keep"]  # the tmpfs went aside with the old tree, files and all
    assert (elsewhere / "on-bind.txt").read_text() == "keep"
    assert res.stderr.count("rocforge: warning: left ") == 2, res.stderr  # one line per mount
    assert "another file system is mounted there" in res.stderr


def test_a_work_copy_sync_never_descends_into_a_mount_or_removes_an_unmarked_tree(tmp_path):
    """sync_tree removes what the source no longer has: inside a work copy that is not rocforge's
    (no mark above it, not made by this run) a directory stays, with a warning, not removed."""
    src, dst = tmp_path / "src", tmp_path / "work-copy"
    (src / "keep").mkdir(parents=True)
    (src / "keep" / "a.c").write_text("int a;")
    sources.sync_tree(src, dst)
    (dst / "users-dir").mkdir()
    (dst / "users-dir" / "thesis.tex").write_text("the user's")
    res = python("import sys; from pathlib import Path; from rocforge_build.forge import sources; "
                 "sources.sync_tree(Path(sys.argv[1]), Path(sys.argv[2]))", str(src), str(dst))
    assert res.returncode == 0, res.stderr
    assert (dst / "users-dir" / "thesis.tex").read_text() == "the user's"
    assert "left" in res.stderr and "carries no mark of rocforge's" in res.stderr
    ownership.write_mark(tmp_path, "a build work dir")  # as pipeline marks its work dir
    sources.sync_tree(src, dst)
    assert sorted(os.listdir(dst)) == ["keep"]


def test_a_mark_in_home_makes_nothing_below_it_rocforges(tmp_path, monkeypatch):
    """A `.rocforge-owned` in HOME (forged, or put there by hand) does not make the user's
    directories removable: the search for a marked tree above stops below HOME."""
    home = tmp_path / "home" / "alice"
    (home / "work" / "project").mkdir(parents=True)
    (home / "work" / "project" / "main.c").write_text("int x;")
    ownership.write_mark(home, "a forged mark")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ownership.NotOwned):
        ownership.remove_owned(home / "work", "a user's directory")
    assert (home / "work" / "project" / "main.c").read_text() == "int x;"
    ownership.write_mark(home / "work", "a tree of rocforge's")  # below HOME: its own mark counts
    assert ownership.owner(home / "work" / "project") == home / "work"


# -- SIGKILL in the middle of a replacement ------------------------------------------------------

FETCH = ("import sys; from rocforge_build.forge import sources; "
         "sources.TarballSource(sys.argv[1]).fetch()")


EXCHANGE_MISSING = ("-e", "inject=renameat2:error=EINVAL")  # as on a file system without it


@needs("strace")
@pytest.mark.parametrize("kill,fallback,left", [
    ("renameat2:when=1", False, "old"),  # the exchange itself
    ("unlinkat:when=1", False, "new"), ("unlinkat:when=5", False, "new"),  # the replaced tree's
    ("unlinkat:when=8", False, "new"),  # removal (its mark goes last, at the 6th)
    ("rename:when=1", True, "old"), ("rename:when=2", True, "none"),  # old aside, then new in
])
def test_sigkill_mid_replacement_leaves_the_old_tree_unstamped_or_the_new_one_whole(
        tmp_path, kill, fallback, left):
    """SIGKILL at each step of a replacement (strace's fault injection: the exchange, the
    removal of the replaced tree, and the two renames where renameat2 is missing): the tree at
    its path is the new one, whole and stamped, or carries no stamp (the next fetch replaces it);
    what is left beside it carries rocforge's mark; the next fetch succeeds."""
    archive = tarball(tmp_path / "fx.tar.gz")
    spec = sources.TarballSource(str(archive))
    tree, whole = half_removed(spec)
    syscall, when = kill.split(":")
    res = python(FETCH, str(archive), wrap=(
        "strace", "-f", "-o", os.devnull, *(EXCHANGE_MISSING if fallback else ()),
        "-e", f"inject={syscall}:signal=KILL:{when}"))
    assert res.returncode in (-9, 137), res.stderr  # it was killed there
    if left == "new":
        assert snapshot(tree) == whole and (tree / ownership.COMPLETE).is_file()
    elif left == "old":
        assert ownership.is_marked(tree) and not (tree / ownership.COMPLETE).exists()
    else:
        assert not os.path.lexists(tree)  # for that instant: a reader fetches again
    for aside in (p for p in trees().iterdir() if p != tree):
        assert ownership.is_marked(aside) or not any(aside.iterdir()), aside  # rocforge's
    again = spec.fetch()
    assert again.root == tree and snapshot(tree) == whole
