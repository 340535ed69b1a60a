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

REPO = Path(__file__).resolve().parents[2]
MARKER = "rocforge-manifest.toml"
ENOUGH = 40  # more unlinkat calls than any of these removals makes: a sweep that gets here is wrong


def snapshot(top: Path) -> dict[str, str]:
    """Every path below `top` with its kind and content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(top))] = ("dir" if p.is_dir() and not p.is_symlink() else
                                            "link:" + os.readlink(p) if p.is_symlink() else
                                            "file:" + p.read_bytes().hex())
    return out


def manifest(tag: str) -> str:
    """A build manifest as rocforge writes it (it passes discover/builds.py's schema)."""
    return f'target = ""\nbackend = "cpu"\n[recipe]\nname = "tool"\n[source]\ncommit = "{tag}"\n'


def build_tree(path: Path, tag: str, marker: str | None = MARKER) -> dict[str, str]:
    """A tree as a build leaves it (files, a subdirectory, its marker); returns its snapshot."""
    (path / "bin").mkdir(parents=True)
    (path / "lib" / "cmake").mkdir(parents=True)
    for rel in ("bin/tool", "lib/libx.so", "lib/cmake/x.cmake", "share.txt"):
        (path / rel).write_text(f"{tag} {rel}\n")
    if marker:
        (path / marker).write_text(manifest(tag))
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
    prefix, new = tmp_path / "prefix", tmp_path / "prefix.rocforge-new"
    keep = tmp_path / "prefix.rocforge-previous"
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


# -- a destination or journal that only looks like rocforge's (a real build of the fixture) --------

@pytest.fixture(scope="module")
def fixture_build(tmp_path_factory):
    """The fixture project built once into a prefix: (its recipe, the prefix)."""
    from upgrade_history import built

    h, prefix = built(tmp_path_factory.mktemp("replace-attack"))
    return h.recipe, prefix


def rocforge_cli(*args: str, home: Path | None = None, wrap: tuple[str, ...] = ()
                 ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)} | ({"HOME": str(home)} if home else {})
    return subprocess.run([*wrap, sys.executable, "-m", "rocforge_build", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def refused(res: subprocess.CompletedProcess, *words: str) -> str:
    """The one `rocforge: error:` line of a run that exited 2 without a traceback."""
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("rocforge: error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def precious(path: Path) -> dict[str, str]:
    (path / "thesis").mkdir(parents=True, exist_ok=True)
    (path / "thesis.txt").write_text("four years of work\n")
    (path / "thesis" / "data.csv").write_text("1,2,3\n")
    return snapshot(path)


def build_args(recipe: Path, prefix: Path) -> list[str]:
    return ["build", str(recipe), "--target", "gfx1151", "--prefix", str(prefix), "--force",
            "--no-recheck"]


def ident(path: Path) -> list[int]:
    st = os.lstat(path)
    return [st.st_dev, st.st_ino]


@pytest.mark.parametrize("slot", ["new", "keep"])
def test_a_forged_journal_naming_another_directory_deletes_nothing(tmp_path, fixture_build, slot):
    """A journal beside the prefix that names a directory of the user's (as the staged tree, or
    as the kept one, with its inode numbers so they "match"): the build refuses it, one line,
    exit 2, and the directory, the prefix and the journal are as they were."""
    import shutil

    recipe, built = fixture_build
    prefix, mine = tmp_path / "p1", tmp_path / "precious"
    shutil.copytree(built, prefix, symlinks=True)
    manifest = prefix / MARKER  # the copy made rocforge's there: its manifest names p1
    manifest.write_text(manifest.read_text().replace(str(built), str(prefix)))
    before, whole = precious(mine), snapshot(prefix)
    entry = {"dest": str(prefix), "new": str(mine), "keep": None, "new_id": ident(prefix),
             "old_id": ident(mine), "kept_id": None}
    if slot == "keep":
        (tmp_path / "p1.rocforge-new").mkdir()
        entry.update(new=str(tmp_path / "p1.rocforge-new"), keep=str(mine),
                     old_id=ident(tmp_path / "p1.rocforge-new"), kept_id=ident(mine))
    journal = Path(f"{prefix}{replace.JOURNAL}")
    journal.write_text(json.dumps(entry))
    refused(rocforge_cli(*build_args(recipe, prefix)), str(journal))
    assert snapshot(mine) == before and snapshot(prefix) == whole
    assert json.loads(journal.read_text()) == entry
    with pytest.raises(UsageError, match="not a journal rocforge wrote"):
        replace.recover(prefix, MARKER)
    assert snapshot(mine) == before


def _home(top: Path) -> Path:
    home = top / "home"
    home.mkdir(parents=True)
    (home / ".bashrc").write_text("export PS1='mine'\n")
    (home / "notes.txt").write_text("mine\n")
    return home


@pytest.mark.parametrize("where", ["home", "above-home", "dotfiles"])
def test_a_prefix_that_is_home_above_it_or_like_it_is_refused_whatever_it_holds(
        tmp_path, fixture_build, where):
    """The build's manifest copied into HOME (or the directory above HOME, or one holding a
    .bashrc) does not make it replaceable: one line, exit 2, every file kept."""
    recipe, built = fixture_build
    home = _home(tmp_path / "u")
    target = {"home": home, "above-home": tmp_path / "u", "dotfiles": home}[where]
    run_home = tmp_path / "elsewhere" if where == "dotfiles" else home
    run_home.mkdir(exist_ok=True)
    (target / MARKER).write_bytes((built / MARKER).read_bytes())
    before = snapshot(tmp_path)
    refused(rocforge_cli(*build_args(recipe, target), home=run_home), "refusing to replace",
            str(target))
    assert snapshot(tmp_path) == before


@needs("ldd")
def test_a_closure_out_at_home_with_a_closure_marker_is_refused(tmp_path, fixture_build):
    _, built = fixture_build
    home = _home(tmp_path)
    (home / ".rocforge-closure").write_text("x\n")
    before = snapshot(home)
    refused(rocforge_cli("container", "closure", str(built), "--out", str(home), home=home),
            "refusing to replace --out", "home directory")
    assert snapshot(home) == before


def test_a_kernels_out_at_home_is_refused_before_any_work(tmp_path):
    home = _home(tmp_path)
    (home / "rocforge-kernels.json").write_text(json.dumps(
        {"target": "gfx1151", "platform": "amd", "binary": "x"}))
    before = snapshot(home)
    refused(rocforge_cli("kernels", "build", "--target", "gfx1151", "--out", str(home), home=home),
            "refusing to replace --out", "home directory")
    assert snapshot(home) == before


@pytest.mark.parametrize("text", ["x = [\n", "recipe = 1\n", "\udcff"],
                         ids=["not-toml", "not-the-schema", "not-utf8"])
def test_a_broken_manifest_does_not_make_a_prefix_rocforges(tmp_path, fixture_build, text):
    recipe, _ = fixture_build
    prefix = tmp_path / "u"
    (prefix / "docs").mkdir(parents=True)
    (prefix / "docs" / "t.txt").write_text("t\n")
    (prefix / MARKER).write_bytes(text.encode("utf-8", "surrogateescape"))
    before = snapshot(prefix) if text.isascii() else None
    res = rocforge_cli(*build_args(recipe, prefix))
    refused(res, "refusing to replace --prefix", f"no valid {MARKER}")
    assert (prefix / "docs" / "t.txt").read_text() == "t\n"
    assert (prefix / MARKER).read_bytes() == text.encode("utf-8", "surrogateescape")
    assert before is None or before == snapshot(prefix)


@needs("ldd")
def test_a_closure_marker_rocforge_did_not_write_does_not_make_out_rocforges(tmp_path, fixture_build):
    _, built = fixture_build
    out = tmp_path / "out"
    before = users_tree(out)
    (out / ".rocforge-closure").write_text("x\n")
    before = snapshot(out)
    refused(rocforge_cli("container", "closure", str(built), "--out", str(out)),
            "refusing to replace --out", "no valid .rocforge-closure")
    assert snapshot(out) == before
    partial = tmp_path / "new.rocforge-partial"  # where a closure is staged, with that file too
    users_tree(partial)
    (partial / ".rocforge-closure").write_text("x\n")
    before = snapshot(partial)
    refused(rocforge_cli("container", "closure", str(built), "--out", str(tmp_path / "new")),
            "refusing to remove", str(partial))
    assert snapshot(partial) == before


def test_a_mark_file_rocforge_did_not_write_does_not_make_a_staged_tree_rocforges(
        tmp_path, fixture_build):
    """`.rocforge-owned` or `.rocforge-scratch` with other content at the staging name: the
    build refuses to clear it, one line, exit 2, nothing removed."""
    recipe, _ = fixture_build
    prefix = tmp_path / "p"
    for mark in (ownership.MARK, replace.SCRATCH):
        staging = Path(f"{prefix}.rocforge-new")
        before = users_tree(staging)
        (staging / mark).write_text("x\n")
        before = snapshot(staging)
        refused(rocforge_cli(*build_args(recipe, prefix)), "refusing to remove", str(staging))
        assert snapshot(staging) == before and not prefix.exists()
        for p in sorted(staging.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        staging.rmdir()


UNSHARE = ("unshare", "-m")


def _can_mount() -> bool:
    return subprocess.run([*UNSHARE, "mount", "-t", "tmpfs", "t", "/mnt"],
                          capture_output=True).returncode == 0


@needs("unshare")
def test_a_prefix_that_is_a_mount_point_is_refused_in_one_line(tmp_path, fixture_build):
    if not _can_mount():
        pytest.skip("unshare -m with mount is not permitted here")
    recipe, built = fixture_build
    mp = tmp_path / "mp"
    mp.mkdir()
    script = ('mp=$1; mount -t tmpfs t "$mp" && cp -a "$2"/. "$mp"/ && echo mine > "$mp"/notes.txt'
              ' || exit 99; shift 2; "$@"; rc=$?; cat "$mp"/notes.txt >&2; exit $rc')
    res = subprocess.run([*UNSHARE, "sh", "-c", script, "sh", str(mp), str(built), sys.executable,
                          "-m", "rocforge_build", *build_args(recipe, mp)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    refused(res, "refusing to replace --prefix", "mount point")
    assert "mine" in res.stderr.splitlines()[-1]


@needs("unshare")
def test_a_rename_refused_by_a_mount_is_one_line(tmp_path):
    """EBUSY from the exchange (the staged tree is a mount point): one line, exit 2, the prefix
    whole."""
    if not _can_mount():
        pytest.skip("unshare -m with mount is not permitted here")
    prefix, new = tmp_path / "prefix", tmp_path / "prefix.rocforge-new"
    whole = build_tree(prefix, "old")
    new.mkdir()
    code = ("import sys; from pathlib import Path; from rocforge_build import cli, replace; "
            "from rocforge_build.errors import UsageError\n"
            "try:\n    replace.swap(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])\n"
            "except UsageError as e:\n    print('rocforge: error:', e.message, file=sys.stderr); "
            "sys.exit(e.exit_code)")
    res = subprocess.run([*UNSHARE, "sh", "-c", 'mount -t tmpfs t "$1" && shift && "$@"', "sh",
                          str(new), sys.executable, "-c", code, str(new), str(prefix), MARKER],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    refused(res, "cannot replace", "mount")
    assert snapshot(prefix) == whole


def _user_dir_with(manifest_from: Path, at: Path) -> dict[str, str]:
    """A user's directory holding their own files and a copy of a real build's manifest."""
    at.mkdir()
    (at / "thesis.tex").write_text("\\chapter{Mine}\n")
    (at / "model.gguf").write_bytes(os.urandom(4096))
    (at / MARKER).write_bytes((manifest_from / MARKER).read_bytes())
    return snapshot(at)


def test_a_copied_manifest_does_not_make_a_users_directory_rocforges(tmp_path, fixture_build):
    """A rocforge manifest copied into a user's directory (it names the build it came from):
    `build --prefix DIR --force` refuses DIR with one line naming the other prefix, and every
    file in DIR is as it was (a hostile trial's thesis and model were deleted this way)."""
    recipe, built = fixture_build
    mine = tmp_path / "thesis"
    before = _user_dir_with(built, mine)
    line = refused(rocforge_cli(*build_args(recipe, mine)), str(mine), "written for another prefix",
                   str(built))
    assert "rocforge did not make this directory" in line
    assert snapshot(mine) == before
    assert not list(tmp_path.glob("thesis.rocforge-*"))


def test_a_manifest_naming_another_directory_is_not_replaced_by_a_swap(tmp_path, fixture_build):
    """The same copy met at the swap itself (`replace.swap`, as a substitution or upgrade reaches
    it): one UsageError, the user's directory untouched, the staged tree left where it was."""
    _, built = fixture_build
    mine = tmp_path / "data"
    before = _user_dir_with(built, mine)
    staged = tmp_path / "data.rocforge-new"
    staged.mkdir()
    (staged / "new-file").write_text("new\n")
    with pytest.raises(UsageError, match="written for another prefix"):
        replace.swap(staged, mine, MARKER)
    assert snapshot(mine) == before and (staged / "new-file").read_text() == "new\n"


def test_a_build_whose_manifest_names_its_own_prefix_is_still_replaced(tmp_path, fixture_build):
    """The binding keeps rocforge's own builds rocforge's: a copy whose manifest names where it
    now is (as the build itself wrote it) passes check_replaceable, and so does a manifest that
    records no prefix (the field is optional in the schema)."""
    import shutil

    _, built = fixture_build
    here = tmp_path / "here"
    shutil.copytree(built, here, symlinks=True)
    text = (here / MARKER).read_text()
    (here / MARKER).write_text(text.replace(str(built), str(here)))
    replace.check_replaceable(here, MARKER, "--prefix")
    linked = tmp_path / "link"
    linked.symlink_to(tmp_path)  # reached through a link above it: the same directory
    replace.check_replaceable(linked / "here", MARKER, "--prefix")


def test_a_symlinked_prefix_to_a_users_directory_deletes_nothing(tmp_path, fixture_build):
    """`--prefix LINK` where LINK points at a user's directory holding a copied manifest: the
    link is resolved and the directory it names is refused (its manifest names another prefix);
    the link and every file behind it are as they were."""
    recipe, built = fixture_build
    mine = tmp_path / "mine"
    before = _user_dir_with(built, mine)
    link = tmp_path / "prefix-link"
    link.symlink_to(mine)
    refused(rocforge_cli(*build_args(recipe, link)), "written for another prefix")
    assert link.is_symlink() and os.readlink(link) == str(mine) and snapshot(mine) == before


def test_files_a_user_added_to_a_prefix_are_kept_aside_by_build_force(tmp_path):
    """A rocforge build with files the user put inside it (a script in bin/, notes in a directory
    of their own): `build --force` replaces rocforge's tree and moves those files, byte for byte,
    to `<prefix>.rocforge-kept-<time>/` at the same relative paths, naming them in one line."""
    from upgrade_history import built

    h, prefix = built(tmp_path)
    (prefix / "bin" / "my-script").write_text("#!/bin/sh\necho mine\n")
    (prefix / "notes").mkdir()
    (prefix / "notes" / "thesis.txt").write_bytes(os.urandom(2048))
    mine = {rel: (prefix / rel).read_bytes() for rel in ("bin/my-script", "notes/thesis.txt")}
    res = rocforge_cli(*build_args(h.recipe, prefix))
    assert res.returncode == 0, res.stderr
    kept = list(tmp_path.glob("prefix.rocforge-kept-*"))
    assert len(kept) == 1, kept
    assert {rel: (kept[0] / rel).read_bytes() for rel in mine} == mine
    line = next(ln for ln in res.stderr.splitlines() if "you added" in ln)
    assert "bin/my-script" in line and "notes/thesis.txt" in line and str(kept[0]) in line
    assert not (prefix / "bin" / "my-script").exists() and (prefix / "bin" / "fixture-hello").is_file()
    assert not [f for f in replace.installed_files(kept[0]) if f not in mine]  # nothing of rocforge's


def test_a_swap_into_a_prefix_keeps_the_files_a_user_added(tmp_path, capsys):
    """The same at `replace.swap` itself, where a substitution's pulled tree goes in: the user's
    file is moved to the kept sibling, byte for byte, and the new tree is in place."""
    import shutil

    from upgrade_history import built

    _, prefix = built(tmp_path)
    staged = Path(f"{prefix}.rocforge-new")
    shutil.copytree(prefix, staged, symlinks=True)
    (prefix / "lib" / "my-plugin.so").write_bytes(b"\x7fELF mine")
    replace.swap(staged, prefix, MARKER)
    kept = list(tmp_path.glob("prefix.rocforge-kept-*"))
    assert len(kept) == 1 and (kept[0] / "lib" / "my-plugin.so").read_bytes() == b"\x7fELF mine"
    assert not (prefix / "lib" / "my-plugin.so").exists() and not staged.exists()
    assert "lib/my-plugin.so" in capsys.readouterr().err


def test_an_installed_list_edited_to_hold_non_paths_keeps_files_aside_without_a_traceback(tmp_path):
    """A manifest's `installed` list edited by hand to hold a table and a number: those entries name
    nothing rocforge installed, so the files beside them are kept aside as the user's (the safe
    direction), and the swap's bookkeeping never raises on them."""
    from rocforge_build import replace

    old = tmp_path / "old"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "tool").write_text("rocforge's")
    (old / "notes.txt").write_text("the user's")
    (old / "rocforge-manifest.toml").write_text('installed = ["bin/tool", {a = 1}, 7]\n')
    kept = replace.keep_added_files(old, tmp_path / "prefix", "rocforge-manifest.toml")
    assert kept is not None and (kept / "notes.txt").read_text() == "the user's"
    assert (old / "bin" / "tool").read_text() == "rocforge's" and not (old / "notes.txt").exists()
