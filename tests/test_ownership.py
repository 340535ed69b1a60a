"""ownership.py: rocforge removes or replaces only what carries its mark.  A mark is judged by its
content, never followed through a link; a tree below a marked one is owned by the nearest marked
directory; `/`, HOME and what holds HOME are never a root to empty; a cache root's CACHEDIR.TAG is
the standard's (https://bford.info/cachedir/: its first line the fixed signature) with rocforge's
own line, and another tool's tag makes nothing rocforge's; a scratch directory goes on the way out
unless something else took its place; and no recursive removal anywhere else in the package (the
structural check).  The same rules done for real against hostile trees (mounts, SIGKILL, a HOME as
the cache) are tests/attack/test_trust_ownership.py's and test_trust_deletion.py's."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from rocforge_build import ownership

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rocforge_build"


def tree(path: Path, marked: bool = True) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "file").write_text("x")
    if marked:
        ownership.write_mark(path, "a test tree")
    return path


def test_a_mark_is_its_content_in_a_regular_file_not_its_name(tmp_path):
    marked = tree(tmp_path / "marked")
    assert (marked / ownership.MARK).read_text() == "made by rocforge: a test tree\n"
    assert ownership.is_marked(marked)
    forged = tree(tmp_path / "forged", marked=False)
    (forged / ownership.MARK).write_text("")  # `touch .rocforge-owned` is no mark
    linked = tree(tmp_path / "linked", marked=False)
    (linked / ownership.MARK).symlink_to(marked / ownership.MARK)  # nor a link to a real one
    a_dir = tree(tmp_path / "a-dir", marked=False)
    (a_dir / ownership.MARK).mkdir()
    assert [ownership.is_marked(p) for p in (forged, linked, a_dir)] == [False, False, False]
    assert not ownership.is_marked(tmp_path / "absent")
    (tmp_path / "link-to-marked").symlink_to(marked)
    assert not ownership.is_marked(tmp_path / "link-to-marked")  # the directory is never followed


def test_the_owner_of_a_directory_is_the_nearest_marked_one_above_it(tmp_path):
    marked = tree(tmp_path / "marked")
    assert ownership.owner(marked) == marked
    assert ownership.owner(marked / "sub") == marked
    assert ownership.owner(tree(tmp_path / "plain", marked=False) / "sub") is None
    (tmp_path / "link").symlink_to(marked / "sub")
    assert ownership.owner(tmp_path / "link") is None  # a link is nobody's tree to remove
    assert ownership.owner(marked / "sub" / "file") is None  # nor a file


def test_an_unmarked_tree_is_refused_in_one_line_and_kept_and_a_marked_one_removed(tmp_path, capsys):
    plain = tree(tmp_path / "plain", marked=False)
    with pytest.raises(ownership.NotOwned) as exc:
        ownership.remove_owned(plain, "a test tree")
    assert exc.value.exit_code == 2
    assert exc.value.message == (f"refusing to remove {plain} (a test tree): it carries no mark of "
                                 "rocforge's (.rocforge-owned), so rocforge did not make it")
    assert exc.value.hint.endswith("nothing was removed")
    assert (plain / "sub" / "file").read_text() == "x"
    assert ownership.remove_owned(plain, "a test tree", refuse=False) == []
    assert capsys.readouterr().err == (f"rocforge: warning: left {plain} in place: it carries no mark "
                                       "of rocforge's (.rocforge-owned)\n")
    assert plain.is_dir()
    marked = tree(tmp_path / "marked")
    assert ownership.remove_owned(marked, "a test tree") == [] and not os.path.lexists(marked)


def test_root_home_and_what_holds_home_are_never_emptied(tmp_path, monkeypatch):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert ownership.forbidden_root(Path("/")) == "it is the root directory /"
    assert ownership.forbidden_root(home) == "it is your home directory"
    assert ownership.forbidden_root(tmp_path / "users") == f"it holds your home directory {home}"
    (tmp_path / "elsewhere").symlink_to(home)
    assert ownership.forbidden_root(tmp_path / "elsewhere") == "it is your home directory"
    assert ownership.forbidden_root(home / "cache") is None
    # a directory holding a home's dot-files is someone's home whatever HOME says
    other = tmp_path / "other"
    other.mkdir()
    (other / ".bashrc").write_text("")
    assert ownership.forbidden_target(other) == "it holds .bashrc, as a home directory does"


def test_a_cache_root_gets_the_standards_tag_with_rocforges_line_and_another_tools_is_not_ours(tmp_path):
    """https://bford.info/cachedir/: a CACHEDIR.TAG begins with exactly `Signature:
    8a477f597d28d172789f06886806bc55` (backup tools skip such a directory)."""
    ours = tmp_path / "cache"
    ownership.tag_cache_root(ours, own=("work",))
    text = (ours / ownership.CACHEDIR_TAG).read_text()
    assert text.splitlines()[0] == "Signature: 8a477f597d28d172789f06886806bc55"
    assert ownership.has_cache_tag(ours) and ownership.has_rocforge_tag(ours)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / ownership.CACHEDIR_TAG).write_text("Signature: 8a477f597d28d172789f06886806bc55\n"
                                                 "# created by another tool\n")
    assert ownership.has_cache_tag(theirs) and not ownership.has_rocforge_tag(theirs)
    ownership.tag_cache_root(theirs, own=("work",))  # another tool's tag stays as it is
    assert "another tool" in (theirs / ownership.CACHEDIR_TAG).read_text()
    users = tmp_path / "users-files"
    users.mkdir()
    (users / "thesis.tex").write_text("")
    ownership.tag_cache_root(users, own=("work",))  # a directory of someone's files is not tagged
    assert not (users / ownership.CACHEDIR_TAG).exists()
    assert ownership.root_problem(users, own=("work",)) == (
        "it holds 1 entry rocforge did not make ('thesis.tex') and no CACHEDIR.TAG of rocforge's")
    assert ownership.root_problem(ours, own=("work",)) is None


def test_a_scratch_dir_goes_on_the_way_out_but_not_what_took_its_place(tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt), ownership.scratch_dir(tmp_path, "s-") as made:
        (made / "f").write_text("x")
        raise KeyboardInterrupt  # Ctrl-C
    assert not os.path.lexists(made) and capsys.readouterr().err == ""
    with ownership.scratch_dir(tmp_path, "s-") as made:
        made.rename(tmp_path / "moved")
        made.mkdir()  # someone else's directory at the name now
        (made / "theirs").write_text("keep")
    assert (made / "theirs").read_text() == "keep" and (tmp_path / "moved").is_dir()
    assert capsys.readouterr().err == (f"rocforge: warning: left {made} in place: it carries no mark "
                                       "of rocforge's (.rocforge-owned)\n")


def test_a_source_trees_stamp_is_one_line_naming_a_commit_or_an_archive(tmp_path):
    """forge/sources.py writes `LOCATION COMMIT` (a 40- or 64-hex git object name) or the archive's
    name, one line; anything else under the name does not make a tree whole."""
    stamp = tmp_path / ownership.COMPLETE
    for text, whole in (("https://example.org/x.git " + "a" * 40 + "\n", True),
                        ("/src/x.git " + "b" * 64 + "\n", True),
                        ("fixture-1.2.0.tar.gz\n", True),
                        ("https://example.org/x.git main\n", False),   # a ref is no commit
                        ("fixture-1.2.0.tar.gz", False),               # cut short: no newline
                        ("a.tar.gz\nb.tar.gz\n", False)):
        stamp.write_text(text)
        assert ownership.valid_stamp(stamp) is whole, text


def test_install_tree_replaces_only_a_marked_tree(tmp_path):
    dest = tree(tmp_path / "dest")
    new = tree(tmp_path / "new")
    (new / "sub" / "file").write_text("new")
    assert ownership.install_tree(new, dest, "a test tree") == []
    assert (dest / "sub" / "file").read_text() == "new" and not os.path.lexists(new)
    users = tree(tmp_path / "users", marked=False)
    newer = tree(tmp_path / "newer")
    with pytest.raises(ownership.NotOwned):
        ownership.install_tree(newer, users, "a test tree")
    assert (users / "sub" / "file").read_text() == "x" and newer.is_dir()


# -- the structure: no removal outside ownership.py ----------------------------------------------
REMOVER = "rocforge_build/ownership.py"  # the one-device remover itself


ALLOWED = {
    "rocforge_build/forge/sources.py:sync_tree": "its walk of the source (read only) unlinks the "
    "one file of the work copy it copies again; what the source lacks goes by walk_one_device",
}


REMOVE_CALLS = {"rmtree", "removedirs", "TemporaryDirectory"}


UNLINKS = {"unlink", "remove", "rmdir"}


def _is_walk(call: ast.AST) -> bool:
    """os.walk(...) or <path>.rglob(...): a walk that enters every mount below its top."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    base = getattr(call.func.value, "id", None)
    return call.func.attr == "rglob" or (call.func.attr, base) == ("walk", "os")


def _removes(nodes: list[ast.AST]) -> bool:
    return any(isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
               and inner.func.attr in UNLINKS and getattr(inner.func.value, "id", None) != "dirnames"
               for node in nodes for inner in ast.walk(node))


def _own_nodes(scope: ast.AST):
    """The nodes of a module or function, not those of the functions defined inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
            todo.extend(ast.iter_child_nodes(node))


def removals(source: str) -> dict[str, str]:
    """The recursive removals in `source` by the function they are in: shutil.rmtree,
    os.removedirs, TemporaryDirectory (an rmtree on exit), shutil.move (an rmtree of its source
    across file systems), and a loop over os.walk or Path.rglob
    that unlinks or removes (`ownership.walk_one_device` is the walk such a loop may use)."""
    found: dict[str, str] = {}
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        where = getattr(func, "name", "<module>")
        for node in _own_nodes(func):
            name = (getattr(node.func, "attr", getattr(node.func, "id", None))
                    if isinstance(node, ast.Call) else None)
            if name in REMOVE_CALLS or (name == "move" and getattr(
                    node.func, "value", None) and getattr(node.func.value, "id", None) == "shutil"):
                found.setdefault(where, f"{name} at line {node.lineno}")
            if isinstance(node, ast.For) and _is_walk(node.iter) and _removes(node.body):
                found.setdefault(where, f"a walk with removals at line {node.lineno}")
            if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)) and any(
                    _is_walk(g.iter) for g in node.generators) and _removes([node.elt]):
                found.setdefault(where, f"a walk with removals at line {node.lineno}")
    return found


def test_the_structural_check_sees_each_kind_of_recursive_removal():
    bad = {
        "import shutil\nshutil.rmtree(p)\n": "rmtree",
        "from shutil import rmtree\ndef f(p):\n    rmtree(p, ignore_errors=True)\n": "rmtree",
        "import os\nos.removedirs(p)\n": "removedirs",
        "import shutil\ndef m(a, b):\n    shutil.move(a, b)\n": "move",
        "import tempfile\nwith tempfile.TemporaryDirectory() as t:\n    pass\n": "TemporaryDirectory",
        "import os\ndef f(p):\n    for d, _, fs in os.walk(p):\n        for f in fs:\n"
        "            os.unlink(os.path.join(d, f))\n": "a walk with removals",
        "def g(p):\n    for f in p.rglob('*'):\n        f.unlink()\n": "a walk with removals",
        "def h(p):\n    [f.unlink() for f in p.rglob('*') if f.is_file()]\n": "a walk with removals",
    }
    for source, kind in bad.items():
        assert any(kind in f for f in removals(source).values()), source
    ok = ("from rocforge_build import ownership\ndef f(p):\n"
          "    for d, dirnames, fs in ownership.walk_one_device(p):\n        os.unlink(fs[0])\n"
          "    n = sum(1 for f in p.rglob('*'))\n    ownership.remove_owned(p, 'x')\n"
          "    os.unlink(p)\n")
    assert removals(ok) == {}


def test_no_recursive_removal_outside_ownership_py():
    """Every recursive removal in rocforge goes through ownership.py (remove_owned, discard,
    scratch_dir, install_tree, walk_one_device): a tree is removed by its mark, never by where
    it is.  An allowed entry names its reason, and must still exist (no stale allowance)."""
    found, used = {}, set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel == REMOVER:
            continue
        for where, what in removals(path.read_text(encoding="utf-8")).items():
            if rel in ALLOWED:
                used.add(rel)
            elif f"{rel}:{where}" in ALLOWED:
                used.add(f"{rel}:{where}")
            else:
                found[f"{rel}:{where}"] = what
    assert found == {}, ("recursive removal outside ownership.py; use ownership.remove_owned, "
                         f"discard, scratch_dir or walk_one_device: {found}")
    assert used == set(ALLOWED), f"allowances no longer needed: {set(ALLOWED) - used}"
