"""Hostile trial 39: what a local source tree is keyed by (`--source DIR`), before any download.

Two different trees must never share a substitute key, a checkout whose files are not its commit
must not be keyed by that commit, and no name the file system allows may crash the key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from needs import require

from rocforge_build.forge import sources

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "fixture-project"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def _tree(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    subprocess.run(["cp", "-a", str(FIXTURE), str(dest)], check=True)
    return dest


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, env=GIT_ENV, capture_output=True)


def _committed(tmp_path: Path, name: str) -> Path:
    tree = _tree(tmp_path, name)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "init")
    return tree


def _shared(tree: Path) -> tuple[str, str]:
    src = sources.LocalSource(str(tree))
    return src.shared_identity(src.fetch())


def test_a_clean_checkout_is_keyed_by_its_commit(tmp_path):
    tree = _committed(tmp_path, "clean")
    os.symlink("CMakeLists.txt", tree / "link")
    os.chmod(tree / "hello.c", 0o755)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "link and mode")
    kind, ident = _shared(tree)
    assert kind == "git-checkout"


@pytest.mark.parametrize("hide", ["assume-unchanged", "skip-worktree", "ignored", "excluded",
                                  "filemode"])
def test_a_checkout_changed_where_git_status_does_not_look_is_not_its_commit(tmp_path, hide):
    tree = _committed(tmp_path, hide)
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    if hide in ("assume-unchanged", "skip-worktree"):
        _git(tree, "update-index", f"--{hide}", "greet.c")
        with open(tree / "greet.c", "a") as f:
            f.write("/* not in the commit */\n")
    elif hide == "ignored":  # an ignored file the build reads (CMake globs, a config header)
        (tree / ".gitignore").write_text("local.h\n")
        _git(tree, "add", ".gitignore")
        _git(tree, "commit", "-qm", "ignore")
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        (tree / "local.h").write_text("#define EVIL 1\n")
    elif hide == "excluded":
        (tree / ".git" / "info").mkdir(exist_ok=True)
        (tree / ".git" / "info" / "exclude").write_text("*.inc\n")
        (tree / "x.inc").write_text("1\n")
    else:
        _git(tree, "config", "core.fileMode", "false")
        os.chmod(tree / "greet.c", 0o755)
    status = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True,
                            text=True, env=GIT_ENV).stdout
    assert status.strip() == ""  # git itself calls it clean: that is the attack
    kind, ident = _shared(tree)
    assert kind == "tree" and commit not in ident


def test_a_link_target_with_a_newline_does_not_make_two_trees_one(tmp_path):
    one, two = _tree(tmp_path, "one"), _tree(tmp_path, "two")
    (one / "a0").write_text("hi\n")
    os.symlink("t\na", one / "a")
    (two / "a\na0").write_text("hi\n")
    os.symlink("t", two / "a")
    assert sources.content_hash(one) != sources.content_hash(two)
    assert _shared(one) != _shared(two)


def test_ordinary_trees_keep_their_content_hash(tmp_path):
    """The escape changes nothing for names and links without a backslash or newline."""
    import hashlib
    tree = _tree(tmp_path, "plain")
    os.symlink("hello.c", tree / "ln")
    entries = []
    for p in sorted(tree.rglob("*")):
        rel = str(p.relative_to(tree))
        if p.is_symlink():
            entries.append((rel, "link:" + os.readlink(p)))
        elif p.is_file():
            mode = "x" if os.access(p, os.X_OK) else "-"
            entries.append((rel, mode + hashlib.sha256(p.read_bytes()).hexdigest()))
    h = hashlib.sha256()
    for rel, what in sorted(entries):
        h.update(f"{rel}\0{what}\n".encode())
    assert sources.content_hash(tree) == h.hexdigest()


def test_a_name_that_is_not_utf8_is_keyed_not_a_crash(tmp_path):
    one, two = _tree(tmp_path, "one"), _tree(tmp_path, "two")
    with open(os.path.join(os.fsencode(one), b"bad\xff"), "w") as f:
        f.write("x")
    with open(os.path.join(os.fsencode(two), b"bad\xfe"), "w") as f:
        f.write("x")
    os.symlink(b"to\xff", os.path.join(os.fsencode(two), b"ln"))
    a, b = _shared(one), _shared(two)
    assert a != b and a[0] == "tree"
    assert sources.LocalSource(str(one)).identify() != sources.LocalSource(str(two)).identify()


@pytest.mark.parametrize("make", ["fifo", "socket"])
def test_a_fifo_or_socket_in_the_tree_gives_no_key_and_no_hang(tmp_path, make):
    """Left out of the key it gave the key of a tree without it; a rebuild's sync opened the FIFO
    (`_same_bytes`) and blocked for ever (a socket: an OSError out of shutil)."""
    import signal
    import socket
    tree = _tree(tmp_path, "one")
    copy = tmp_path / "copy"
    sources.sync_tree(tree, copy)
    if make == "fifo":
        os.mkfifo(tree / "pipe")
        os.mkfifo(copy / "pipe")  # as `cp -a` made the first copy
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tree / "pipe"))
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("hung")))
    signal.alarm(10)
    try:
        with pytest.raises(sources.NotNameable, match="pipe is a (FIFO|socket)"):
            _shared(tree)
        sources.sync_tree(tree, copy)  # the build goes on, without it
        assert not os.path.lexists(copy / "pipe") and (copy / "greet.c").is_file()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("git", [False, True])
def test_a_tree_changed_between_its_key_and_its_copy_is_not_built_under_that_key(tmp_path, git):
    from rocforge_build.errors import IntegrityError
    tree = _committed(tmp_path, "t") if git else _tree(tmp_path, "t")
    src = sources.LocalSource(str(tree))
    fetched = src.fetch()
    kind, ident = src.shared_identity(fetched)
    assert kind == ("git-checkout" if git else "tree")
    copy = tmp_path / "copy"
    sources.sync_tree(tree, copy)
    src.check_copy(fetched, {"kind": kind, "identity": ident}, copy, False)  # unchanged: holds
    with open(tree / "greet.c", "a") as f:  # the user edits while the build starts
        f.write("/* changed */\n")
    sources.sync_tree(tree, copy)
    with pytest.raises(IntegrityError, match="changed while this build read it"):
        src.check_copy(fetched, {"kind": kind, "identity": ident}, copy, False)


def test_an_unreadable_directory_gives_no_key_rather_than_being_left_out(tmp_path, monkeypatch):
    tree = _tree(tmp_path, "one")
    (tree / "sub").mkdir()
    real = os.scandir

    def scandir(path):
        if str(path).endswith("/sub"):
            raise PermissionError(13, "Permission denied")
        return real(path)
    monkeypatch.setattr(sources.os, "scandir", scandir)
    with pytest.raises(sources.NotNameable, match="cannot be read"):
        sources.content_hash(tree)


@pytest.mark.parametrize("target", ["/etc/hostname", "../outside.c", "/dev/zero"])
def test_a_link_out_of_the_tree_gives_no_key_rather_than_one_the_outside_is_not_in(tmp_path, target):
    """The key held only the link's text; the build reads what it points to, which differs
    between machines: two different builds under one key."""
    (tmp_path / "outside.c").write_text("int v = 1;\n")
    tree = _tree(tmp_path, "t")
    os.symlink(target, tree / "outside.c")
    with pytest.raises(sources.NotNameable, match="leads out of the tree"):
        _shared(tree)
    inside = _tree(tmp_path, "inside")  # a link within the tree is named by its text, as before
    os.symlink("greet.c", inside / "again.c")
    assert _shared(inside)[0] == "tree"


def _build_with_key(tmp_path: Path, monkeypatch) -> Path:
    """A CPU build of the fixture with a substitute key (a tarball source pinned by sha256)."""
    import shutil
    import tarfile

    from rocforge_build.cli import main
    home = tmp_path / "home"
    for name, var in (("cfg", "ROCFORGE_CONFIG_DIR"), ("cache", "ROCFORGE_CACHE_DIR"),
                      ("data", "ROCFORGE_DATA_DIR")):
        monkeypatch.setenv(var, str(home / name))
    monkeypatch.setenv("HOME", str(home))
    recipes = tmp_path / "r" / "recipes"
    recipes.mkdir(parents=True)
    shutil.copytree(FIXTURE.parents[0] / "patches" / "fixture", tmp_path / "r" / "patches" / "fixture")
    tarball = tmp_path / "x.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(FIXTURE, arcname="proj")
    import hashlib
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    text = (FIXTURE.parents[0] / "recipes" / "fixture.toml").read_text()
    text = text.replace('git = "file:///nonexistent/fixture.git"\nref = "v1.2.0"',
                        f'url = "{tarball}"\nsha256 = "{sha}"')
    (recipes / "fixture.toml").write_text(text)
    prefix = tmp_path / "ref"
    rc = main(["build", str(recipes / "fixture.toml"), "--target", "gfx1030", "--backend", "cpu",
               "--prefix", str(prefix), "--no-substitutes"])
    assert rc in (0, None)
    return prefix


@pytest.mark.parametrize("planted", ["empty", "unsigned", "not-an-index"])
def test_a_co_publishers_plant_at_my_tag_does_not_pass_for_my_published_reference(tmp_path, monkeypatch, planted):
    """publish of a GPU build skipped its reference when anything answered at the publisher's
    own index tag of the reference's key: a co-publisher who can write to the store planted
    one there, and the reference never travelled (consumers then compile it, or stop)."""
    from rocforge_build.substitute import oci, publish, publishers, signing
    from rocforge_build.substitute.stores import open_store
    prefix = _build_with_key(tmp_path, monkeypatch)
    manifest, key = publish.key_of_build(prefix)
    key_file = tmp_path / "k" / "rocforge.key"
    key_file.parent.mkdir()
    pair = signing.generate()
    signing.write_key_pair(key_file, key_file.with_suffix(".pub"), pair)
    url = f"file://{tmp_path}/store"
    tag = publishers.publisher_tag(key.digest, pair.key_id)
    with open_store(url, timeout=10) as store:
        if planted == "not-an-index":
            cfg = store.push_blob_bytes(b"{}", "application/vnd.oci.empty.v1+json")
            store.push_manifest(oci.canonical_json({
                "schemaVersion": 2, "mediaType": oci.MANIFEST, "config": cfg.to_json(), "layers": []}), tag=tag)
        else:
            store.push_index(oci.make_index([], artifact_type=publishers.INDEX_TYPE if planted == "empty"
                                            else None), tag=tag)
    said = publish._publish_reference(publish.Reference(prefix, key, manifest["stamp"]), url, model=None,
                                      key_file=key_file, root=None, timeout=10, progress=None)
    assert "in the store already" not in said
    assert said.startswith("not published: no model")  # it went on to publish it (and needs a model)


def test_my_own_published_reference_still_counts_as_in_the_store(tmp_path, monkeypatch):
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    from rocforge_build.substitute import publish, signing
    prefix = _build_with_key(tmp_path, monkeypatch)
    manifest, key = publish.key_of_build(prefix)
    key_file = tmp_path / "k" / "rocforge.key"
    key_file.parent.mkdir()
    signing.write_key_pair(key_file, key_file.with_suffix(".pub"), signing.generate())
    url = f"file://{tmp_path}/store"
    from rocforge_build.rootfs import Root
    publish.publish(prefix, url, unverified=True, model=None, key_file=key_file, root=Root("/"),
                    timeout=10, progress=None)
    said = publish._publish_reference(publish.Reference(prefix, key, manifest["stamp"]), url, model=None,
                                      key_file=key_file, root=None, timeout=10, progress=None)
    assert said == "in the store already"


# -- keys that change: a writer to the store hiding the owner's statement among its own ----------

def _rotation_store(tmp_path: Path, junk: int, overwrite_owner: bool = False, thief: bool = True):
    from rocforge_build.substitute import keys, oci, signing
    from rocforge_build.substitute.stores import open_store
    url = f"file://{tmp_path}/rot-store"
    old, owner_new, stolen_to = signing.generate(), signing.generate(), signing.generate()
    with open_store(url, timeout=10) as store:
        owner_tag = keys.publish_rotation(store, keys.make_rotation(old, owner_new, "x"), old, owner_new)
        if thief:  # the thief holds old's secret and writes to the store: its tag sorts first
            doc = keys.make_rotation(old, stolen_to, "x")
            data = oci.canonical_json(doc)
            comment = keys._comment("key-rotation", oci.sha256_digest(data))
            keys._push(store, keys.ROTATION_TYPE, f"{keys.ROTATION_TAG}{old.key_id}-000000000000", data,
                       [signing.sign(data, old, comment), signing.sign(data, stolen_to, comment)], old.key_id)
        empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
        spoil = store.push_manifest(oci.make_manifest(artifact_type="application/x-junk", config=empty, layers=[]))
        for i in range(1, junk + 1):
            store.push_manifest(spoil.data, tag=f"{keys.ROTATION_TAG}{old.key_id}-{i:012d}")
        if overwrite_owner:
            store.push_manifest(spoil.data, tag=owner_tag)
        trusted = signing.trusted_keys_from_config([old.public.text])
        rotations, lines = keys.read_rotations(store, trusted)
    added, said = keys.new_entries(rotations, trusted, None)
    return added, lines + said, stolen_to, owner_new


@pytest.mark.parametrize("junk,overwrite", [(15, False), (40, False), (0, True)])
def test_the_owners_rotation_crowded_out_or_spoiled_does_not_let_the_thiefs_through(tmp_path, junk, overwrite):
    """Only the first 16 statements of a key were read: a thief with the old key and write access
    named its rotation and 15 junk tags to sort first, the owner's rotation went unread, the fork
    rule saw one successor and `key trust-rotation` trusted the thief's key.  Overwriting the
    owner's tag with junk did the same."""
    added, lines, stolen_to, _ = _rotation_store(tmp_path, junk, overwrite)
    assert not any(stolen_to.public.text in a for a in added), lines
    assert added == []
    assert any("no rotation of" in line for line in lines)


def test_one_clean_rotation_is_still_followed(tmp_path):
    added, lines, _, owner_new = _rotation_store(tmp_path, 0, thief=False)
    assert len(added) == 1 and added[0].startswith(owner_new.public.text), lines


def test_a_rotation_refused_for_its_time_still_shows_the_fork(tmp_path):
    """The owner's statement, refused (its claimed time is outside the old key's window), still
    names a successor signed by both keys: the thief's, accepted, is one of two."""
    from rocforge_build.substitute import keys, oci, signing
    from rocforge_build.substitute.stores import open_store
    old, owner_new, stolen_to = signing.generate(), signing.generate(), signing.generate()

    def push(store, new, made_at):
        doc = keys.make_rotation(old, new, "x")
        doc["made_at"] = made_at
        data = oci.canonical_json(doc)
        comment = keys._comment("key-rotation", oci.sha256_digest(data))
        keys._push(store, keys.ROTATION_TYPE, f"{keys.ROTATION_TAG}{old.key_id}-{oci.sha256_digest(data)[7:19]}",
                   data, [signing.sign(data, old, comment), signing.sign(data, new, comment)], old.key_id)
    with open_store(f"file://{tmp_path}/s", timeout=10) as store:
        push(store, owner_new, "2020-06-01T00:00:00Z")
        push(store, stolen_to, keys._now_text())
        trusted = signing.trusted_keys_from_config([old.public.text + " not-before=2021-01-01"])
        rotations, lines = keys.read_rotations(store, trusted)
    added, said = keys.new_entries(rotations, trusted, None)
    assert added == [], lines + said


def test_what_the_work_copy_leaves_out_is_not_in_the_key_so_the_copy_check_holds(tmp_path):
    """A submodule's `.git` file and a fetched tree's `.rocforge-complete` are never copied for
    the build: hashed into the key, the copy check refused every build of such a tree."""
    tree = _tree(tmp_path, "t")
    (tree / "vendor").mkdir()
    (tree / "vendor" / ".git").write_text("gitdir: ../.git/modules/vendor\n")
    (tree / "vendor" / "f.c").write_text("int f;\n")
    (tree / ".rocforge-complete").write_text("")
    src = sources.LocalSource(str(tree))
    fetched = src.fetch()
    kind, ident = src.shared_identity(fetched)
    copy = tmp_path / "copy"
    sources.sync_tree(tree, copy)
    src.check_copy(fetched, {"kind": kind, "identity": ident}, copy, False)


@pytest.mark.parametrize("git", [False, True])
def test_the_copy_check_of_a_subdir_project(tmp_path, git):
    import shutil
    top = tmp_path / "top"
    top.mkdir()
    shutil.copytree(FIXTURE, top / "sub")
    (top / "VERSION").write_text("9.9\n")
    if git:
        _git(top, "init", "-q")
        _git(top, "add", "-A")
        _git(top, "commit", "-qm", "init")
    src = sources.LocalSource(str(top), subdir="sub")
    fetched = src.fetch()
    kind, ident = src.shared_identity(fetched)
    assert kind == ("git-checkout" if git else "tree")
    copy = tmp_path / "copy"
    sources.sync_tree(top / "sub", copy)
    src.check_copy(fetched, {"kind": kind, "identity": ident}, copy, False)
    (copy / "greet.c").write_text("changed\n")
    with pytest.raises(Exception, match="changed while this build read it"):
        src.check_copy(fetched, {"kind": kind, "identity": ident}, copy, False)


def test_a_checkout_with_a_submodule_set_to_ignore_all_is_not_its_commit(tmp_path):
    """`.gitmodules` (the tree's own file) can say `ignore = all`: `git status` then never shows
    the submodule's changes; its files are still what the build reads."""
    lib = _committed(tmp_path, "lib")
    tree = _committed(tmp_path, "main")
    subprocess.run(["git", "-C", str(tree), "-c", "protocol.file.allow=always", "submodule", "add", "-q",
                    str(lib), "vendor"], check=True, env=GIT_ENV, capture_output=True)
    _git(tree, "config", "-f", ".gitmodules", "submodule.vendor.ignore", "all")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "sub")
    with open(tree / "vendor" / "greet.c", "a") as f:
        f.write("/* not in any commit */\n")
    assert subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True,
                          env=GIT_ENV).stdout.strip() == ""
    kind, _ = _shared(tree)
    assert kind == "tree"


def test_trust_rotation_sees_a_fork_across_the_configured_stores(tmp_path, monkeypatch):
    """The owner rotated in the team store; a thief holding the old key rotated it to its own key
    in another store the consumer lists, and asked for `key trust-rotation` there: read alone,
    that store showed one successor and the thief's key was trusted."""
    import json as _json

    from rocforge_build.cli import main
    from rocforge_build.substitute import keys, signing
    from rocforge_build.substitute.stores import open_store
    for name, var in (("cfg", "ROCFORGE_CONFIG_DIR"), ("cache", "ROCFORGE_CACHE_DIR"), ("data", "ROCFORGE_DATA_DIR")):
        monkeypatch.setenv(var, str(tmp_path / name))
    monkeypatch.setenv("HOME", str(tmp_path))
    old, owner_new, stolen_to = signing.generate(), signing.generate(), signing.generate()
    team, other = f"file://{tmp_path}/team", f"file://{tmp_path}/other"
    with open_store(team, timeout=10) as store:
        keys.publish_rotation(store, keys.make_rotation(old, owner_new, "x"), old, owner_new)
    with open_store(other, timeout=10) as store:
        keys.publish_rotation(store, keys.make_rotation(old, stolen_to, "x"), old, stolen_to)
    assert main(["config", "set", "substitute.stores", _json.dumps([team, other])]) == 0
    assert main(["config", "set", "substitute.trusted_keys", _json.dumps([old.public.text])]) == 0
    main(["key", "trust-rotation", other])
    from rocforge_build import config
    listed = config.effective()["substitute"]["trusted_keys"]
    assert not any(stolen_to.public.text in e for e in listed)
    main(["key", "trust-rotation", team])  # the owner's, read from its store: the fork stops it too
    assert list(config.effective()["substitute"]["trusted_keys"]) == [old.public.text]


def test_a_second_key_rotate_to_another_key_is_refused_not_a_silent_fork(tmp_path, monkeypatch, capsys):
    """Run twice (the first run's output lost, or retried), `key rotate` published a second
    rotation of the same key to another new key: a fork, which every consumer follows to neither,
    and nothing told the publisher."""
    from rocforge_build.cli import main
    from rocforge_build.substitute import signing
    for name, var in (("cfg", "ROCFORGE_CONFIG_DIR"), ("cache", "ROCFORGE_CACHE_DIR"), ("data", "ROCFORGE_DATA_DIR")):
        monkeypatch.setenv(var, str(tmp_path / name))
    monkeypatch.setenv("HOME", str(tmp_path))
    url = f"file://{tmp_path}/store"
    assert main(["key", "generate"]) == 0
    assert main(["key", "rotate", "--to", url, "--out", str(tmp_path / "n1")]) == 0
    capsys.readouterr()
    assert main(["key", "rotate", "--to", url, "--out", str(tmp_path / "n2")]) != 0
    err = capsys.readouterr().err
    assert "fork" in err and err.count("rocforge: error:") == 1
    assert not (tmp_path / "n2").exists()  # nothing written
    # the same rotation again (--new-key, to more stores or the same) still works
    assert main(["key", "rotate", "--to", url, "--new-key", str(tmp_path / "n1" / "rocforge.key")]) == 0
    assert signing.read_secret_key(tmp_path / "n1" / "rocforge.key")


@pytest.mark.parametrize("pointer", [None, "sha256:abc", {"key": "\x1b]0;owned\x07sha256:" + "a" * 64},
                                     {"key": ["sha256:" + "a" * 64]}, {"key": "sha256:" + "A" * 64}, {"key": 7},
                                     {"stamp": "x"}])
def test_a_hostile_reference_pointer_in_trusted_evidence_names_no_key(pointer):
    """The reference a GPU build's evidence names appears in --substitute-only's one line only as
    a sha256 digest; anything else in a trusted document (terminal codes, other types) is left out,
    and the newest well-formed one before it is named."""
    from rocforge_build.substitute import artifact, pull

    good = "sha256:" + "b" * 64
    docs = [artifact.Attached("sha256:" + "0" * 64, "t", {"reference": {"key": good}}, "K"),
            artifact.Attached("sha256:" + "1" * 64, "t", {"reference": pointer}, "K")]
    assert pull.published_reference(docs) == good[:23]
    assert pull.published_reference(docs[1:]) == ""
