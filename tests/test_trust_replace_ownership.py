"""Attack tests for the removals of replace.py (build prefixes, kernel builds, closures): a tree
is removed only through ownership.py, when it is the replaced tree the swap's journal names (its
inode numbers) or carries a mark of rocforge's (the tree's marker, `.rocforge-scratch`,
`.rocforge-owned`).  Done for real: a user's directory at each name rocforge deletes under, a
destination that lost its marker, SIGKILL at every unlinkat(2) of a removal (strace's fault
injection), and `rocforge cache clean` over a prefix placed inside the cache with a live journal
and half-deleted trees beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from needs import needs

from rocforge_build import cli, ownership, replace
from rocforge_build.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
MARKER = "rocforge-manifest.toml"
ENOUGH = 40  # more unlinkat calls than any of these removals makes: a sweep that gets here is wrong


def snapshot(top: Path) -> dict[str, str]:
    """Every path below `top` with its kind and content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(top))] = "dir" if p.is_dir() else "file:" + p.read_text()
    return out


def build_tree(path: Path, tag: str, marker: str | None = MARKER) -> dict[str, str]:
    """A tree as a build leaves it (files, a subdirectory, its marker); returns its snapshot."""
    (path / "bin").mkdir(parents=True)
    (path / "lib" / "cmake").mkdir(parents=True)
    for rel in ("bin/tool", "lib/libx.so", "lib/cmake/x.cmake", "share.txt"):
        (path / rel).write_text(f"{tag} {rel}\n")
    if marker:
        (path / marker).write_text(f"[source]\ncommit = '{tag}'\n")
    return snapshot(path)


def users_tree(path: Path) -> dict[str, str]:
    (path / "thesis").mkdir(parents=True)
    (path / "thesis" / "chapter1.tex").write_text("the user's\n")
    (path / "notes.txt").write_text("the user's\n")
    return snapshot(path)


def python(code: str, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def siblings(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(f"{dest.name}."))


RECOVER = ("import sys; from pathlib import Path; from rocforge_build import replace; "
           "replace.recover(Path(sys.argv[1]), sys.argv[2])")
SWAP = ("import sys; from pathlib import Path; from rocforge_build import replace; "
        "replace.swap(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], "
        "keep=Path(sys.argv[4]) if len(sys.argv) > 4 else None)")
DISCARD = ("import sys; from pathlib import Path; from rocforge_build import replace; "
           "replace.discard(Path(sys.argv[1]), sys.argv[2], 'a staged install')")


# -- a user's directory at a name rocforge deletes under ------------------------------------------

def test_a_users_directory_at_the_deleting_name_is_left_with_a_warning(tmp_path):
    prefix = tmp_path / "prefix"
    whole = build_tree(prefix, "a")
    mine = Path(f"{prefix}{replace.DELETING}")
    before = users_tree(mine)
    res = python(RECOVER, str(prefix), MARKER)  # as every build, upgrade and rollback starts
    assert res.returncode == 0, res.stderr
    assert f"rocforge: warning: left {mine} in place" in res.stderr and "no mark" in res.stderr
    assert snapshot(mine) == before and snapshot(prefix) == whole
    ownership.write_mark(mine, "a removal cut off")  # what rocforge's own cut-off removal leaves
    res = python(RECOVER, str(prefix), MARKER)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    assert siblings(prefix) == [] and snapshot(prefix) == whole


def test_a_users_directory_at_the_kept_trees_deleting_name_refuses_the_swap(tmp_path):
    """An upgrade renames the build kept for rollback to `<keep>.deleting` and deletes it: a
    directory of the user's there is refused before anything moves, one line, exit 2."""
    prefix, new, keep = tmp_path / "prefix", tmp_path / "prefix.rocforge-new", tmp_path / "prev"
    trees = {p: build_tree(p, p.name) for p in (prefix, new, keep)}
    mine = Path(f"{keep}.deleting")
    before = users_tree(mine)
    with pytest.raises(UsageError, match="rocforge did not make it") as exc:
        replace.swap(new, prefix, MARKER, keep=keep)
    assert exc.value.exit_code == 2 and str(mine) in exc.value.message
    assert "\n" not in exc.value.message
    assert snapshot(mine) == before and all(snapshot(p) == s for p, s in trees.items())
    assert not os.path.lexists(f"{prefix}{replace.JOURNAL}")


def test_a_destination_without_its_marker_is_not_replaced_by_the_swap(tmp_path):
    """The callers check the destination before their work; the swap, which deletes the tree it
    replaces, checks again: a directory of the user's that appeared meanwhile is refused, kept."""
    dest, new = tmp_path / "out", tmp_path / "out.rocforge-new"
    staged = build_tree(new, "new")
    before = users_tree(dest)
    with pytest.raises(UsageError, match=f"refusing to replace {dest}") as exc:
        replace.swap(new, dest, MARKER)
    assert exc.value.exit_code == 2
    assert snapshot(dest) == before and snapshot(new) == staged and siblings(dest) == ["out.rocforge-new"]
    for p in dest.iterdir():  # an empty destination is replaced (nothing in it to lose)
        ownership.remove_tree_one_device(p)
    replace.swap(new, dest, MARKER)
    assert snapshot(dest) == staged and siblings(dest) == []


def test_a_staged_tree_is_discarded_only_with_a_mark(tmp_path):
    staging = tmp_path / "prefix.rocforge-new"
    before = users_tree(staging)
    with pytest.raises(UsageError, match="refusing to remove") as exc:
        replace.discard(staging, MARKER, "a staged install")
    assert exc.value.exit_code == 2 and snapshot(staging) == before
    replace.mark_scratch(staging)  # as `rocforge build` marks the trees it stages into
    replace.discard(staging, MARKER, "a staged install")
    assert not os.path.lexists(staging)


# -- SIGKILL at every step of a removal -----------------------------------------------------------

def _killed_at(n: int, code: str, args: list[str], fallback: bool) -> bool:
    inject = ["-e", f"inject=unlinkat:signal=KILL:when={n}"]
    if fallback:
        inject += ["-e", "inject=renameat2:error=ENOSYS"]
    res = python(code, *args, wrap=("strace", "-qq", "-o", os.devnull, *inject))
    if res.returncode == 0:
        return False
    assert res.returncode == -9, res.stderr
    return True


@needs("strace")
@pytest.mark.parametrize("fallback, kept", [(False, False), (True, False), (False, True)],
                         ids=["exchange", "fallback", "upgrade-keep"])
def test_sigkill_at_each_removal_of_a_replaced_tree_leaves_it_marked_and_recover_clears_it(
        tmp_path, fallback, kept):
    """Killed at each unlinkat(2) of the replaced tree's removal (or of the kept build's, where
    an upgrade keeps the one it replaces): the new tree is whole in place, every tree left beside
    it is empty or carries `.rocforge-owned` (and its marker only when cut at the first unlink,
    the marker's), and the next recover removes it."""
    for n in range(1, ENOUGH):
        top = tmp_path / str(n)
        prefix, new, keep = top / "prefix", top / "prefix.rocforge-new", top / "prefix.rocforge-previous"
        build_tree(prefix, "old")
        staged = build_tree(new, "new")
        args = [str(new), str(prefix), MARKER]
        if kept:
            build_tree(keep, "kept-before")
            args.append(str(keep))
        if not _killed_at(n, SWAP, args, fallback):
            break
        assert snapshot(prefix) == staged  # the removal comes after the new tree went in
        for name in siblings(prefix):
            left = top / name
            if name in ("prefix.rocforge-swap", "prefix.rocforge-previous"):
                continue  # the journal; the build kept for rollback
            if not any(left.iterdir()):
                continue  # cut at its last step, the rmdir: nothing in it
            assert ownership.is_marked(left), (n, name)  # written before the first unlink
            assert (left / MARKER).exists() == (n == 1), (n, name)  # the marker goes first
        res = python(RECOVER, str(prefix), MARKER)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        assert siblings(prefix) == (["prefix.rocforge-previous"] if kept else [])
        assert snapshot(prefix) == staged
        if kept:
            assert (keep / "share.txt").read_text() == "old share.txt\n"  # the replaced build
    else:
        raise AssertionError("killed at every unlinkat: the sweep never reached the end")
    assert n > 5  # it was cut at every file of the tree


@needs("strace")
def test_sigkill_at_each_removal_of_a_staged_tree_leaves_it_marked_and_the_next_clears_it(
        tmp_path):
    for n in range(1, ENOUGH):
        staging = tmp_path / str(n) / "prefix.rocforge-new"
        build_tree(staging, "half", marker=None)
        replace.mark_scratch(staging)
        if not _killed_at(n, DISCARD, [str(staging), MARKER], False):
            break
        assert ownership.is_marked(staging) or not any(staging.iterdir())  # empty: its rmdir
        replace.check_scratch(staging, MARKER, "a staged install")  # the next build accepts it
        res = python(DISCARD, str(staging), MARKER)
        assert res.returncode == 0 and not os.path.lexists(staging), res.stderr
    else:
        raise AssertionError("killed at every unlinkat: the sweep never reached the end")
    assert n > 5


# -- cache clean beside a prefix placed inside the cache ------------------------------------------

@needs("strace")
def test_cache_clean_keeps_a_live_journal_and_removes_a_prefixs_sibling_only_by_its_mark(
        tmp_path, capsys):
    """A --prefix inside the cache dir (allowed: it is kept as a build prefix) has rocforge's
    names beside it, which can take the form of a cache entry: a swap killed after its journal
    (`0123456789abcdef-tool.rocforge-swap`, named like a download) and trees being deleted
    (`a-b-c.rocforge-old.deleting`, named like a bisect build).  `cache clean` keeps the
    journal and an unmarked tree, and removes only a tree carrying rocforge's mark."""
    cache = Path(os.environ["ROCFORGE_CACHE_DIR"])
    prefix = cache / "downloads" / "0123456789abcdef-tool"
    build_tree(prefix, "old")
    new = Path(f"{prefix}.rocforge-new")
    build_tree(new, "new")
    res = python(SWAP, str(new), str(prefix), MARKER, wrap=(
        "strace", "-qq", "-o", os.devnull, "-e", "inject=renameat2:signal=KILL:when=1"))
    assert res.returncode == -9, res.stderr
    journal = Path(f"{prefix}{replace.JOURNAL}")
    assert journal.is_file()
    mine = cache / "bisect" / f"a-b-c{replace.DELETING}"
    before = users_tree(mine)
    ours = cache / "bisect" / f"d-e-f{replace.DELETING}"
    build_tree(ours, "cut off", marker=None)
    ownership.write_mark(ours, "a replaced tree rocforge is deleting")
    capsys.readouterr()
    assert cli.main(["cache", "clean", "--json"]) == 0
    done = {e["path"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    assert done[str(journal)]["removed"] is False and journal.is_file()
    assert "journal" in done[str(journal)]["outcome"]
    assert done[str(mine)]["removed"] is False and snapshot(mine) == before
    assert done[str(ours)]["removed"] is True and not os.path.lexists(ours)
    assert replace.recover(prefix, MARKER).startswith("undid")  # the journal did its work
    assert (prefix / "share.txt").read_text() == "old share.txt\n" and not journal.exists()
