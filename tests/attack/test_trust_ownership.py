"""Attack tests for ownership by mark (ownership.py): `rocforge cache clean` and `rocforge nightly
prune` remove only what carries rocforge's mark.  A cache dir that is HOME or `/`, a tmpfs or
bind mount inside the cache, dot-directories in a HOME given as nightly prefix, an unmarked entry
among marked ones and a SIGKILL in the middle of a clean, each done for real: nothing of the
user's is removed, a refusal is one `rocforge: error:` line with exit 2, and a dry run lists
exactly what the real run removes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import textwrap
from pathlib import Path

import pytest
from needs import needs
from trust_helpers import (
    build_lock_held,
    entries,
    mount_namespace,
    one_error,
    python,
    rocforge,
    snapshot,
)

from rocforge_build import ownership
from rocforge_build.forge import locations, sources
from rocforge_build.workflows import cleanup


def cache() -> Path:
    return Path(os.environ["ROCFORGE_CACHE_DIR"])


def fake_home(tmp_path: Path) -> Path:
    """A HOME with a user's files, some under names rocforge uses in its cache dir."""
    home = tmp_path / "home" / "alice"
    for rel, text in (("Documents/thesis.tex", "five years"), ("work/project/main.c", "int x;"),
                      ("downloads/photo.jpg", "jpeg"), ("sources/trees/mine/README", "mine"),
                      (".bashrc", "alias ll='ls -l'"), ("env/secrets.sh", "TOKEN=1")):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    return home


# -- the cache root -------------------------------------------------------------------------------

@pytest.mark.parametrize("dry_run", [False, True])
def test_a_cache_dir_that_is_home_is_refused_and_nothing_is_removed_or_listed(tmp_path, dry_run):
    home = fake_home(tmp_path)
    ownership.write_mark(home / "work" / "project", "a forged mark")  # HOME: refused even so
    before = snapshot(home)
    env = {"HOME": str(home), "ROCFORGE_CACHE_DIR": str(home)}
    res = rocforge("cache", "clean", *(["--dry-run"] if dry_run else []), env=env)
    line = one_error(res)
    assert str(home) in line and "your home directory" in line
    assert res.stdout == ""  # not one of the user's paths is listed as removable
    assert snapshot(home) == before
    listing = json.loads(rocforge("cache", "list", "--json", env=env).stdout)["entries"]
    mine = [e for e in listing if e["category"] != "ccache"]
    assert mine and all("cache clean refuses" in e["kept"] for e in mine)  # none removable
    # through a link to HOME, or a parent of HOME: the same
    (tmp_path / "link").symlink_to(home)
    for where in (tmp_path / "link", home.parent):
        res = rocforge("cache", "clean", env={**env, "ROCFORGE_CACHE_DIR": str(where)})
        assert "home directory" in one_error(res)
    assert snapshot(home) == before
    assert not (home / ownership.CACHEDIR_TAG).exists()


def test_root_as_cache_dir_is_refused_before_any_removal_is_tried(tmp_path):
    """`/` as the cache dir, run for real, with every way of removing a file replaced by a trap
    that exits 99: the refusal comes first, so the trap is never reached."""
    trap = textwrap.dedent("""
        import os, shutil, sys
        from rocforge_build import cli, ownership
        def trap(*a, **k):
            print("REMOVAL TRIED", a, file=sys.stderr); os._exit(99)
        os.unlink = os.remove = os.rmdir = shutil.rmtree = ownership.remove_tree_one_device = trap
        sys.exit(cli.main(sys.argv[1:]))
    """)
    for argv in (["cache", "clean"], ["cache", "clean", "--sources"], ["cache", "clean", "--dry-run"]):
        res = python(trap, *argv, env={"ROCFORGE_CACHE_DIR": "/"})
        assert "REMOVAL TRIED" not in res.stderr
        assert "the root directory /" in one_error(res)
    with pytest.raises(Exception, match="refuses /: it is the root directory"):
        cleanup.check_root(Path("/"))


def test_a_cache_dir_holding_files_of_someone_else_is_refused_until_rocforge_tagged_it(tmp_path,
                                                                                     monkeypatch):
    shared = tmp_path / "shared"
    (shared / "work" / "0123456789ab").mkdir(parents=True)  # a work dir rocforge would make
    (shared / "report.odt").write_text("someone's")
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(shared))
    before = snapshot(shared)
    for argv in (["cache", "clean"], ["cache", "clean", "--dry-run"]):
        line = one_error(rocforge(*argv))
        assert "1 entry rocforge did not make ('report.odt')" in line and "CACHEDIR.TAG" in line
    assert snapshot(shared) == before
    locations.claim_cache_root()  # never tags a directory with someone else's files in it
    assert not (shared / ownership.CACHEDIR_TAG).exists()


def test_a_cache_rocforge_makes_is_tagged_with_the_cachedir_signature(tmp_path):
    tarball = make_tarball(tmp_path, files=3)
    fetched = sources.TarballSource(str(tarball)).fetch()
    tag = (cache() / "CACHEDIR.TAG").read_text()
    assert tag.splitlines()[0] == "Signature: 8a477f597d28d172789f06886806bc55"
    assert ownership.is_marked(fetched.root) and (fetched.root / ".rocforge-complete").is_file()


# -- the entries ----------------------------------------------------------------------------------

STAMP = "https://example.org/project.git " + "ab" * 20 + "\n"  # what forge/sources.py writes


def make_legacy_work(prefix: Path) -> Path:
    """A work dir as a rocforge that wrote no marks left it: named by its prefix's hash
    (forge/plan.work_dir), its build log starting with the plan."""
    work = cache() / "work" / hashlib.sha256(str(prefix).encode()).hexdigest()[:12]
    (work / "build").mkdir(parents=True)
    (work / "rocforge-build.log").write_text(json.dumps({"prefix": str(prefix), "stamp": "s1"})
                                             + "\nconfiguring...\n")
    return work


def make_tarball(tmp_path: Path, files: int, name: str = "src") -> Path:
    top = tmp_path / f"{name}-tree" / "project-1.0"
    (top / "sub").mkdir(parents=True)
    (top / "CMakeLists.txt").write_text("project(p C)\n")
    for i in range(files):  # at the top, beside the completeness stamp, and below
        (top / ("sub" if i % 2 else ".") / f"f{i:04d}.c").write_text(f"int f{i};\n")
    out = tmp_path / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, arcname="project-1.0")
    return out


def mixed_cache(tmp_path: Path) -> dict[str, Path]:
    """A cache rocforge made (a fetched tree, a legacy tree and work dir, a marked work dir)
    holding also what is not rocforge's: an unmarked tree, a user's dir in work/, a file of a
    name rocforge never gives in llama-help/."""
    fetched = sources.TarballSource(str(make_tarball(tmp_path, 5))).fetch()
    legacy_tree = cache() / "sources" / "trees" / "abcdef0123456789abcd"
    legacy_tree.mkdir(parents=True)
    (legacy_tree / ".rocforge-complete").write_text(STAMP)
    (legacy_tree / "a.c").write_text("int a;\n")
    marked_work = cache() / "work" / "notes-marked"
    marked_work.mkdir(parents=True)
    ownership.write_mark(marked_work, "a build work dir")
    (marked_work / "build.ninja").write_text("x")
    legacy_work = make_legacy_work(tmp_path / "legacy-prefix")
    user_tree = cache() / "sources" / "trees" / "my-checkout"
    user_tree.mkdir(parents=True)
    (user_tree / "patch.diff").write_text("my work")
    user_work = cache() / "work" / "thesis"
    user_work.mkdir(parents=True)
    (user_work / "chapter1.tex").write_text("mine")
    (cache() / "llama-help").mkdir()
    (cache() / "llama-help" / "README.txt").write_text("mine too")
    return {"fetched": fetched.root, "legacy_tree": legacy_tree, "marked_work": marked_work,
            "legacy_work": legacy_work, "user_tree": user_tree, "user_work": user_work,
            "user_file": cache() / "llama-help" / "README.txt"}


def test_unmarked_entries_among_marked_ones_are_kept_and_dry_run_lists_exactly_what_goes(tmp_path):
    made = mixed_cache(tmp_path)
    ours = {str(made[k]) for k in ("fetched", "legacy_tree", "marked_work", "legacy_work")}
    theirs = {str(made[k]) for k in ("user_tree", "user_work", "user_file")}
    kept_before = {p: snapshot(Path(p)) if Path(p).is_dir() else Path(p).read_text()
                   for p in theirs}

    dry = rocforge("cache", "clean", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    dry_entries = json.loads(dry.stdout)["entries"]
    would = {e["path"] for e in dry_entries if e["outcome"] == "would be removed"}
    assert would == ours
    assert all("carries no mark" in e["outcome"] for e in dry_entries if e["path"] in theirs)
    assert all(Path(p).exists() for p in ours)  # the dry run removed nothing

    real = rocforge("cache", "clean", "--json")
    assert real.returncode == 0, real.stderr
    removed = {e["path"] for e in json.loads(real.stdout)["entries"] if e["removed"]}
    assert removed == would  # the same function chose both lists
    assert not any(Path(p).exists() for p in removed)
    assert {p: snapshot(Path(p)) if Path(p).is_dir() else Path(p).read_text()
            for p in theirs} == kept_before


@needs("strace")
def test_sigkill_mid_clean_leaves_a_tree_the_next_fetch_makes_whole(tmp_path):
    """SIGKILL at the 4th unlinkat(2) of `cache clean --sources` (strace's fault injection): the
    completeness stamp went first, so the half-removed tree is not taken as fetched; it still
    carries rocforge's mark, so the next clean finishes it; the next fetch makes it whole."""
    spec = sources.TarballSource(str(make_tarball(tmp_path, 400)))
    tree = spec.fetch().root
    whole = snapshot(tree)
    res = rocforge("cache", "clean", "--sources",
                   wrap=("strace", "-f", "-o", os.devnull, "-e", "trace=unlinkat",
                         "-e", "inject=unlinkat:signal=KILL:when=4"))
    assert res.returncode in (-9, 137), res.stderr
    assert tree.is_dir() and 0 < len(snapshot(tree)) < len(whole)  # killed mid-way
    assert not (tree / ".rocforge-complete").exists()
    assert ownership.is_marked(tree)

    again = spec.fetch()  # what the next build does first
    assert again.root == tree and snapshot(tree) == whole

    (tree / ".rocforge-complete").unlink()  # as the first step of another killed clean
    res = rocforge("cache", "clean", "--sources", "--json")
    assert res.returncode == 0, res.stderr
    assert not tree.exists()  # the next clean finishes an interrupted one


def test_a_running_build_is_listed_as_running_not_failed(tmp_path):
    work = make_legacy_work(tmp_path / "prefix-being-built")
    with build_lock_held(work, tmp_path / "ready") as holder:
        res = rocforge("cache", "list", "--json")
        entry = {e["path"]: e for e in json.loads(res.stdout)["entries"]}[str(work)]
        assert entry["category"] == "running" and entry["removable"] is False
        assert f"pid {holder.pid}" in entry["kept"]
        res = rocforge("cache", "clean", "--failed", "--json")  # not failed: not touched
        assert json.loads(res.stdout)["entries"] == [] and work.is_dir()
    res = rocforge("cache", "list", "--json")
    entry = {e["path"]: e for e in json.loads(res.stdout)["entries"]}[str(work)]
    assert entry["category"] == "failed"  # the build ended without installing


# -- mounts inside the cache ---------------------------------------------------------------------

MOUNTED = textwrap.dedent("""
    import json, os, subprocess, sys
    from pathlib import Path
    from rocforge_build import cli, ownership
    cache = Path(os.environ["ROCFORGE_CACHE_DIR"])
    tree = cache / "sources" / "trees" / "abcdef0123456789abcd"
    (tree / "scratch").mkdir(parents=True)
    ownership.write_mark(tree, "a source tree")
    (tree / ".rocforge-complete").write_text("x")
    (tree / "a.c").write_text("int a;")
    other = cache / "work" / "0123456789ab"
    other.mkdir(parents=True)
    elsewhere = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tree / "scratch")], check=True)
    (tree / "scratch" / "on-tmpfs.txt").write_text("keep")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(other)], check=True)  # an entry itself
    (other / "on-tmpfs-too.txt").write_text("keep")
    (elsewhere / "bound").mkdir()
    (elsewhere / "bound" / "on-bind.txt").write_text("keep")
    loose = cache / "work" / "fedcba987654"
    (loose / "bind").mkdir(parents=True)
    (loose / "junk.o").write_text("o")
    subprocess.run(["mount", "--bind", str(elsewhere / "bound"), str(loose / "bind")], check=True)
    rc = cli.main(["cache", "clean", "--json"])
    left = ownership.remove_tree_one_device(loose)  # the remover itself, past the scan's check
    print(json.dumps({"rc": rc, "left": left, "loose_junk": (loose / "junk.o").exists(),
                      "files": [str(p) for p in (tree / "scratch" / "on-tmpfs.txt",
                                other / "on-tmpfs-too.txt", loose / "bind" / "on-bind.txt",
                                tree / "a.c") if p.exists()]}), file=sys.stderr)
""")


@needs("unshare", "mount")
def test_a_tmpfs_or_bind_mount_inside_the_cache_keeps_its_files(tmp_path):
    wrap = mount_namespace()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = python(MOUNTED, str(elsewhere), wrap=wrap)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stderr.strip().splitlines()[-1])
    assert got["rc"] == 0
    clean = json.loads(res.stdout)
    kept = {e["path"]: e["outcome"] for e in clean["entries"] if not e["removed"]}
    tree = cache() / "sources" / "trees" / "abcdef0123456789abcd"
    assert "another file system is mounted inside it" in kept[str(tree)]
    assert "another file system is mounted there" in kept[str(cache() / "work" / "0123456789ab")]
    assert len(got["files"]) == 4  # all three mounts' files, and the tree that holds one
    loose = cache() / "work" / "fedcba987654"
    assert got["left"] == [str(loose / "bind")] and not got["loose_junk"]  # the rest went
    assert (elsewhere / "bound" / "on-bind.txt").read_text() == "keep"


# -- nightly prune --------------------------------------------------------------------------------

def test_nightly_prune_with_home_as_prefix_is_refused_and_keeps_every_dot_dir(tmp_path):
    home = fake_home(tmp_path)
    for rel in (".staging-abcd1234/notes.txt", ".trash-mail/inbox", ".downloads/id_rsa.tar.gz",
                ".current-config/x"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("the user's")
    before = snapshot(home)
    res = rocforge("nightly", "prune", "--keep", "0", "--prefix", str(home),
                   env={"HOME": str(home)})
    assert "your home directory" in one_error(res)
    assert snapshot(home) == before


def test_nightly_prune_removes_only_rocforge_leftovers(tmp_path):
    prefix = tmp_path / "nightlies"
    mine = {".staging-k3j9x2ab/lib/libamdhip64.so": "so",  # a killed install's (marked below)
            ".downloads/therock-dist-linux-gfx1151-7.10.0.tar.gz.part": "partial",
            ".downloads/therock-dist-linux-gfx1151-7.10.0.tar.gz.part.validator": '"etag"'}
    theirs = {".staging-area/todo.txt": "the user's", ".trash-notes/old.txt": "the user's",
              ".downloads/notes.txt": "the user's", ".downloads/keys/id": "the user's",
              ".staging-abcd1234/important": "the user's",  # extract.staging's form, no mark
              ".downloads/backup.tar.gz": "the user's"}  # an archive no record names
    for rel, text in {**mine, **theirs}.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text(text)
    marked = prefix / ".trash-therock-7.9.0-gfx1151-4242"
    half = prefix / "therock-7.8.0-gfx1151"  # what a killed prune left: its record went first
    ownership.write_mark(prefix / ".staging-k3j9x2ab", "a nightly install being unpacked")
    for d in (marked, half):
        (d / "bin").mkdir(parents=True)
        ownership.write_mark(d, "a nightly install")
    (half / "bin" / "clang").write_text("elf")
    res = rocforge("nightly", "prune", "--keep", "0", "--prefix", str(prefix))
    assert res.returncode == 0, res.stderr
    assert not (prefix / ".staging-k3j9x2ab").exists() and not marked.exists()
    assert not half.exists()
    assert not (prefix / ".downloads" / "therock-dist-linux-gfx1151-7.10.0.tar.gz.part").exists()
    for rel, text in theirs.items():
        assert (prefix / rel).read_text() == text, rel
    assert "left" in res.stderr and ".trash-notes" in res.stderr and "Traceback" not in res.stderr


def test_the_one_device_remover_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    victim = tmp_path / "victim"
    (victim / "ro").mkdir(parents=True)
    (victim / "ro" / "f").write_text("x")
    (victim / "link").symlink_to(outside)
    (victim / "ro" / "link-file").symlink_to(outside / "precious")
    os.chmod(victim / "ro", 0o555)  # archives carry read-only directories
    assert ownership.remove_tree_one_device(victim) == []
    assert not victim.exists() and (outside / "precious").read_text() == "keep"
    shutil.rmtree(outside)


def test_a_cache_of_a_rocforge_without_marks_keeps_working_and_is_tagged_on_its_first_clean():
    tree = cache() / "sources" / "trees" / "0123456789abcdef0123"
    tree.mkdir(parents=True)
    (tree / ".rocforge-complete").write_text(STAMP)
    work = make_legacy_work(cache().parent / "some-prefix")
    assert not (cache() / ownership.CACHEDIR_TAG).exists()
    dry = json.loads(rocforge("cache", "clean", "--dry-run", "--json").stdout)
    assert {e["path"] for e in dry["entries"] if e["outcome"] == "would be removed"} == {
        str(tree), str(work)}
    assert not (cache() / ownership.CACHEDIR_TAG).exists()  # a dry run writes nothing
    res = rocforge("cache", "clean", "--json")
    assert res.returncode == 0, res.stderr
    assert not tree.exists() and not work.exists()
    assert ownership.has_cache_tag(cache())


# -- ownership by proof, never by form (a hostile trial's findings) --------------------------------

USERS_FILES = {"downloads/photos.zip": b"PK\x03\x04 family photos",
               "downloads/thesis.tar.gz": b"\x1f\x8b five years",
               "work/0123456789ab/notes.txt": b"my notes",
               "bisect/my-family-photos/img.jpg": b"\xff\xd8 jpeg",
               "env/deadbeef.sh": b"export TOKEN=1\n"}


def bytes_snapshot(top: Path) -> dict[str, bytes | str]:
    """Every path below `top`: files byte for byte, links by target, directories by kind."""
    return {rel: "link:" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
            for rel, p in entries(top)}


@pytest.mark.parametrize("tag", ["none", "another tool's"])
def test_user_files_named_as_rocforge_names_cache_entries_are_never_removed(tmp_path, tag):
    """A directory of the user's whose files have the names rocforge gives (an archive in
    downloads/, a 12-hex dir in work/, an a-b-c dir in bisect/, an 8-hex .sh in env/), with no
    CACHEDIR.TAG or with another tool's: a name proves nothing, nothing is listed as removable,
    nothing is removed, and no tag is written into it."""
    mine = tmp_path / "mine"
    for rel, data in USERS_FILES.items():
        (mine / rel).parent.mkdir(parents=True, exist_ok=True)
        (mine / rel).write_bytes(data)
    if tag != "none":
        (mine / "CACHEDIR.TAG").write_text(
            "Signature: 8a477f597d28d172789f06886806bc55\n# created by another backup tool\n")
    before = bytes_snapshot(mine)
    env = {"ROCFORGE_CACHE_DIR": str(mine)}
    dry = rocforge("cache", "clean", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    entries = json.loads(dry.stdout)["entries"]
    assert {e["path"] for e in entries} == {str(mine / r).rsplit("/", 1)[0] if r.startswith(
        ("work/", "bisect/")) else str(mine / r) for r in USERS_FILES}
    assert not [e for e in entries if e["outcome"] == "would be removed"]
    res = rocforge("cache", "clean", "--sources", "--work", "--bisect", "--env", env=env)
    assert res.returncode == 0, res.stderr
    assert not [line for line in res.stdout.splitlines() if line.startswith("removed")]
    assert bytes_snapshot(mine) == before  # every file byte-identical, no CACHEDIR.TAG written


def test_another_tools_cachedir_tag_does_not_make_a_root_rocforge_s(tmp_path):
    """A root with a foreign file is refused unless the tag holds rocforge's own line."""
    shared = tmp_path / "shared"
    (shared / "work" / "0123456789ab").mkdir(parents=True)
    ownership.write_mark(shared / "work" / "0123456789ab", "a build work dir")
    (shared / "report.odt").write_text("someone's")
    (shared / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    before = bytes_snapshot(shared)
    line = one_error(rocforge("cache", "clean", env={"ROCFORGE_CACHE_DIR": str(shared)}))
    assert "'report.odt'" in line and "CACHEDIR.TAG of rocforge's" in line
    assert bytes_snapshot(shared) == before


def test_nightly_prune_removes_nothing_that_only_has_rocforges_names(tmp_path):
    """A prefix holding an archive and a checksum in `.downloads` that no install record
    names, an unmarked dir of extract.staging's form, a dir whose rocforge-install.toml does not
    validate and a user's `.current-` link: prune (--keep 0) removes none of it, writes no mark
    into any of it, and says what it left."""
    np = tmp_path / "np"
    files = {".downloads/backup.tar.gz": b"\x1f\x8b backup", ".downloads/keys.sha256": b"k",
             ".staging-abcd1234/important": b"important", "proj/rocforge-install.toml": b"[x]\n",
             "proj/sub/code.c": b"int main;"}
    for rel, data in files.items():
        (np / rel).parent.mkdir(parents=True, exist_ok=True)
        (np / rel).write_bytes(data)
    (np / ".current-mine").symlink_to("proj")
    before = bytes_snapshot(np)
    res = rocforge("nightly", "prune", "--keep", "0", "--prefix", str(np))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "nothing to remove" and "Traceback" not in res.stderr
    assert "proj" in res.stderr and "does not validate" in res.stderr
    after = bytes_snapshot(np)
    assert after.pop(".lock") == b""  # the prefix's lock (nightly/install.py), all else as it was
    assert after == before


def test_nightly_prune_refuses_a_prefix_holding_what_rocforge_never_makes_there(tmp_path):
    np = tmp_path / "np"
    (np / "src").mkdir(parents=True)
    (np / "src" / "main.c").write_text("int x;")
    (np / ".staging-k3j9x2ab").mkdir()
    ownership.write_mark(np / ".staging-k3j9x2ab", "a nightly install being unpacked")
    before = bytes_snapshot(np)
    line = one_error(rocforge("nightly", "prune", "--keep", "0", "--prefix", str(np)))
    assert "refuses" in line and "'src'" in line
    assert bytes_snapshot(np) == before  # refused before anything, even the marked leftover


def test_a_data_dir_reached_through_a_link_into_the_cache_is_kept(tmp_path):
    """ROCFORGE_DATA_DIR is a link to a (marked) work dir of the cache: `cache clean --work`
    compares identities, not paths, and keeps the results database inside it."""
    target = cache() / "work" / ("d" * 12)
    target.mkdir(parents=True)
    ownership.write_mark(target, "a build work dir")
    (target / "results.sqlite3").write_bytes(b"SQLite format 3\x00 presets")
    link = tmp_path / "datalink"
    link.symlink_to(target)
    before = bytes_snapshot(target)
    res = rocforge("cache", "clean", "--work", "--json", env={"ROCFORGE_DATA_DIR": str(link)})
    assert res.returncode == 0, res.stderr
    entry = {e["path"]: e for e in json.loads(res.stdout)["entries"]}[str(target)]
    assert entry["removed"] is False and "rocforge's data" in entry["outcome"]
    assert bytes_snapshot(target) == before


BOUND_HOME = textwrap.dedent("""
    import os, subprocess, sys
    home, alias = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "--bind", home, alias], check=True)
    res = subprocess.run([sys.executable, "-m", "rocforge_build", "cache", "clean"],
                         capture_output=True, text=True,
                         env={**os.environ, "HOME": home, "ROCFORGE_CACHE_DIR": alias})
    sys.stdout.write(res.stdout); sys.stderr.write(res.stderr); sys.exit(res.returncode)
""")


@needs("unshare", "mount")
def test_home_bind_mounted_elsewhere_is_still_home(tmp_path):
    """HOME (with rocforge's own CACHEDIR.TAG and a marked work dir) bind-mounted at another
    path and given as the cache dir: refused as HOME by identity, nothing removed."""
    wrap = mount_namespace()
    home = fake_home(tmp_path)
    (home / ownership.CACHEDIR_TAG).write_text(ownership.TAG_TEXT)
    work = home / "work" / "0123456789ab"
    (work / "build").mkdir(parents=True)
    ownership.write_mark(work, "a build work dir")
    alias = tmp_path / "alias"
    alias.mkdir()
    before = bytes_snapshot(home)
    res = python(BOUND_HOME, str(home), str(alias), wrap=wrap)
    assert "your home directory" in one_error(res)
    assert bytes_snapshot(home) == before


FORGED = "evil\nremoved      sources       1 B  ~thesis.zip\nx"


def test_a_file_name_with_newlines_cannot_forge_an_output_line(tmp_path):
    """Names holding newlines, in cache list / cache clean and nightly prune's "removed NAME":
    each entry stays one line, so no fake "removed" line appears."""
    (cache() / "downloads").mkdir(parents=True)
    (cache() / "downloads" / (FORGED + ".zip")).write_text("x")
    marked = cache() / "work" / FORGED
    marked.mkdir(parents=True)
    ownership.write_mark(marked, "a build work dir")
    listing = rocforge("cache", "list")
    assert listing.returncode == 0, listing.stderr
    lines = [x for x in listing.stdout.splitlines() if not x.startswith("ccache")]
    assert len(lines) == 3, lines  # the two entries and the totals line (compiler caches aside)
    for argv in (("cache", "clean", "--dry-run"), ("cache", "clean")):
        res = rocforge(*argv)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert len(lines) == 3 and not any("~thesis.zip" in x and not x.startswith(
            ("kept", "would remove", "removed")) for x in lines), lines
        assert sum(x.startswith(("removed", "would remove")) for x in lines) == 1
    np = tmp_path / "np"
    half = np / FORGED  # what a killed prune left of an install: marked, record gone
    half.mkdir(parents=True)
    ownership.write_mark(half, "a nightly install")
    res = rocforge("nightly", "prune", "--keep", "0", "--prefix", str(np))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["removed evil removed sources 1 B ~thesis.zip x"]


def test_a_stamp_or_record_counts_as_a_mark_only_with_the_text_rocforge_writes(tmp_path):
    """A user's directory holding a file named as rocforge's completeness stamp or install
    record, with other content, is not rocforge's: replacing or removing it is refused."""
    from rocforge_build.nightly.install import RECORD

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "thesis.tex").write_text("five years")
    for stamp in ("mine\n", "https://example.org/p.git HEAD\n", "a.zip\nb\n"):
        (tree / ownership.COMPLETE).write_text(stamp)
        with pytest.raises(ownership.NotOwned):
            ownership.check_tree_replaceable(tree, "a source tree", (ownership.MARK,
                                                                     ownership.COMPLETE))
    (tree / ownership.COMPLETE).write_text(STAMP)  # what forge/sources.py writes: replaceable
    ownership.check_tree_replaceable(tree, "a source tree", (ownership.MARK, ownership.COMPLETE))
    (tree / ownership.COMPLETE).unlink()
    (tree / RECORD).write_text("[x]\n")
    before = bytes_snapshot(tree)
    with pytest.raises(ownership.NotOwned):
        ownership.remove_owned(tree, "a replaced nightly install", marks=(ownership.MARK, RECORD))
    assert bytes_snapshot(tree) == before
