"""replace.py: a directory replaced as a whole, only when rocforge made it.  A destination is
refused in one line naming what made it refuse (a user's file, a link, a file, a ':' on a PATH
list); a swap leaves one whole tree at the destination and nothing beside it; upgrade's kept tree
and rollback's exchange; and a swap cut off at each point (the journal as a swap writes it) is
finished or undone by `recover`.  Signals and SIGKILL during real builds, forged journals and
mounts are the attack tests' (tests/attack/test_build_safety.py, test_trust_replace_ownership.py).

The marker here is the library closure's (`ship/closure.py`: `.rocforge-closure`, whose fixed first
words `ownership.valid_marker` checks): replace.py treats every marker alike but the manifest,
whose prefix binding is the attack tests'."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocforge_build import replace
from rocforge_build.errors import UsageError
from rocforge_build.ownership import MARK_HEADS

MARKER = ".rocforge-closure"


def made(path: Path, content: str) -> Path:
    """A tree as rocforge leaves one: its marker and one file saying which tree it is."""
    path.mkdir(parents=True)
    (path / MARKER).write_bytes(MARK_HEADS[MARKER] + b" for the test\n")
    (path / "which").write_text(content)
    return path


def beside(dest: Path) -> list[str]:
    """What lies beside `dest` in its directory, `dest` left out."""
    return sorted(p.name for p in dest.parent.iterdir() if p != dest)


def refusal(dest: Path, **kw) -> str:
    with pytest.raises(UsageError) as exc:
        replace.check_replaceable(dest, MARKER, "--out", **kw)
    assert exc.value.exit_code == 2
    return exc.value.message


def test_only_an_absent_empty_or_marked_destination_is_replaceable(tmp_path):
    replace.check_replaceable(tmp_path / "absent", MARKER, "--out")
    (tmp_path / "empty").mkdir()
    replace.check_replaceable(tmp_path / "empty", MARKER, "--out")
    replace.check_replaceable(made(tmp_path / "ours", "old"), MARKER, "--out")
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    assert refusal(users) == (f"refusing to replace --out {users}: it holds {users / 'notes.txt'}, and "
                              f"it has no valid {MARKER} of rocforge's, so rocforge did not make it")
    (users / MARKER).write_text("a file of that name with other words")  # not rocforge's marker
    assert f"it holds {users / MARKER}, and it has no valid" in refusal(users)
    (tmp_path / "link").symlink_to(made(tmp_path / "target", "t"))
    assert "is a symbolic link" in refusal(tmp_path / "link")
    (tmp_path / "file").write_text("")
    assert refusal(tmp_path / "file") == f"--out {tmp_path / 'file'} is a file, not a directory"
    assert "which is a file, not a directory" in refusal(tmp_path / "file" / "below")
    assert "contains ':'" in refusal(tmp_path / "a:b", path_list=True)
    assert (users / "notes.txt").read_text() == "mine"


def test_a_swap_leaves_the_new_tree_and_nothing_beside_it(tmp_path):
    dest = tmp_path / "out"
    new = made(replace.sibling(dest, ".rocforge-new"), "first")
    replace.swap(new, dest, MARKER)  # nothing there: one rename
    assert (dest / "which").read_text() == "first" and beside(dest) == []
    new = made(replace.sibling(dest, ".rocforge-new"), "second")
    replace.swap(new, dest, MARKER)
    assert (dest / "which").read_text() == "second" and beside(dest) == []
    assert not replace.interrupted(dest)


def test_a_swap_refuses_a_destination_rocforge_did_not_make_and_moves_nothing(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "thesis.tex").write_text("mine")
    new = made(replace.sibling(dest, ".rocforge-new"), "new")
    with pytest.raises(UsageError) as exc:
        replace.swap(new, dest, MARKER)
    assert exc.value.message == (f"refusing to replace {dest}: it has no {MARKER}, so rocforge did not "
                                 "make it")
    assert (dest / "thesis.tex").read_text() == "mine" and (new / "which").read_text() == "new"
    with pytest.raises(ValueError):  # a tree at a name replace.py does not derive from dest
        replace.swap(made(tmp_path / "elsewhere", "x"), dest, MARKER)


def test_upgrade_keeps_the_replaced_tree_and_rollback_exchanges_the_two(tmp_path):
    dest = tmp_path / "out"
    previous = replace.sibling(dest, ".rocforge-previous")
    made(dest, "v1")
    replace.swap(made(replace.sibling(dest, ".rocforge-new"), "v2"), dest, MARKER, keep=previous)
    assert (dest / "which").read_text() == "v2" and (previous / "which").read_text() == "v1"
    # the next upgrade keeps v2 and deletes the v1 kept before
    replace.swap(made(replace.sibling(dest, ".rocforge-new"), "v3"), dest, MARKER, keep=previous)
    assert (dest / "which").read_text() == "v3" and (previous / "which").read_text() == "v2"
    assert beside(dest) == [previous.name]
    replace.swap(previous, dest, MARKER, keep=previous)  # rollback: they change places
    assert (dest / "which").read_text() == "v2" and (previous / "which").read_text() == "v3"
    assert beside(dest) == [previous.name]


def _journal(dest: Path, new: Path) -> None:
    """The journal a swap writes before it moves anything (`<dest>.rocforge-swap`)."""
    ident = [[os.lstat(p).st_dev, os.lstat(p).st_ino] for p in (new, dest)]
    replace.sibling(dest, replace.JOURNAL).write_text(json.dumps(
        {"dest": str(dest), "new": str(new), "keep": None, "new_id": ident[0], "old_id": ident[1],
         "kept_id": None}))


def test_a_swap_cut_off_before_its_exchange_is_undone(tmp_path):
    dest, new = made(tmp_path / "out", "old"), made(tmp_path / "out.rocforge-new", "new")
    _journal(dest, new)
    assert replace.interrupted(dest)
    assert replace.recover(dest, MARKER) == (f"undid an interrupted replacement of {dest}: the tree "
                                             "it had is in place")
    assert (dest / "which").read_text() == "old" and (new / "which").read_text() == "new"
    assert not replace.interrupted(dest)


def test_a_swap_cut_off_after_its_exchange_is_finished(tmp_path):
    dest, new = made(tmp_path / "out", "old"), made(tmp_path / "out.rocforge-new", "new")
    _journal(dest, new)
    os.rename(dest, tmp_path / "t")  # the exchange, as renameat2 does it in one step
    os.rename(new, dest)
    os.rename(tmp_path / "t", new)
    assert replace.recover(dest, MARKER) == f"finished an interrupted replacement of {dest}"
    assert (dest / "which").read_text() == "new" and beside(dest) == []


def test_a_fallback_cut_between_its_two_renames_gets_the_old_tree_back(tmp_path):
    """Where the file system has no exchange, `dest` goes aside first: cut there, without a
    journal, no tree is at `dest`; the next command puts the old one back."""
    dest = tmp_path / "out"
    made(replace.sibling(dest, replace.OLD), "old")
    assert replace.interrupted(dest)
    assert replace.recover(dest, MARKER) == f"restored {dest} from an interrupted replacement"
    assert (dest / "which").read_text() == "old" and beside(dest) == []
    # the same aside name holding someone else's tree is never taken for the old one
    users = replace.sibling(tmp_path / "b", replace.OLD)
    users.mkdir()
    (users / "mine").write_text("")
    assert replace.recover(tmp_path / "b", MARKER) is None and (users / "mine").exists()
