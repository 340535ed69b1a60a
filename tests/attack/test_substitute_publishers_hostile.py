"""Hostile publisher indexes and gc inputs (substitute/publishers.py, substitute/gc.py): an index
under a trusted key's tag that is unsigned, signed by another key, replayed from another build
key, huge, of the wrong types, naming an index (a cycle) or another key's artifact, and a store
holding files and tags rocforge did not write.  Each is passed over with one line (the index,
never the store), or refused in one line; nothing is removed or written outside the store, and
no read hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_substitute_gc import K1, K2, Publisher, _state, fake_build
from trust_helpers import REPO, one_error

from rocforge_build.substitute import oci, publishers, signing
from rocforge_build.substitute.stores import open_store


@pytest.fixture
def store(tmp_path):
    """A layout store where a (trusted) published two builds of K1 and one of K2."""
    a = signing.generate()
    url = (tmp_path / "store").as_uri()
    with open_store(url) as s:
        built = {"old": fake_build(s, K1, a, "2026-01-01T00:00:01Z", b"old" * 100),
                 "new": fake_build(s, K1, a, "2026-01-01T00:00:02Z", b"new" * 100),
                 "other": fake_build(s, K2, a, "2026-01-01T00:00:01Z", b"k2" * 100)}
    return url, a, built


def _put_index(url: str, data: bytes, tag: str) -> None:
    with open_store(url) as s:
        s._put_manifest(data, oci.INDEX, tag)


def _candidates(url: str, trusted: list[signing.PublicKey]) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    started = time.monotonic()
    with open_store(url) as s:
        found = publishers.candidates(s, K1.digest, trusted, notes)
    assert time.monotonic() - started < 5
    return [m.digest for m in found], notes


def _signed_entries(url: str, a: signing.KeyPair, key=K1) -> list[oci.Descriptor]:
    with open_store(url) as s:
        return publishers.read_index(s, key.digest, a.public)


def _without_legacy(url: str) -> None:
    with open_store(url) as s:
        s.delete_tag(K1.tag)


@pytest.mark.parametrize("forge, words", [
    (lambda a, entries: oci.make_index(entries, artifact_type=publishers.INDEX_TYPE), "is not signed"),
    (lambda a, entries: publishers.make_index(K1.digest, entries, signing.generate()), "which is not trusted"),
    (lambda a, entries: oci.make_index(entries), "is not a rocforge build index"),
    # a's own index of K2, its signature whole, put under K1's tag: it signed another list
    (lambda a, entries: publishers.make_index(K2.digest, entries, a), "does not match"),
    # a's signed index with one more entry added after signing
    (lambda a, entries: json.dumps({**json.loads(publishers.make_index(K1.digest, entries[:1], a)),
                                    "manifests": [e.to_json() for e in entries]}).encode(), "does not match"),
    (lambda a, entries: b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", '
                        b'"manifests": "all of them"}', "bad manifests list"),
    (lambda a, entries: b'{"schemaVersion": 2, "manifests": [{"mediaType": 7, "digest": [], "size": -1}]}',
     "bad mediaType"),
    (lambda a, entries: b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (lambda a, entries: b"\xff\xfe not json", "not JSON"),
    (lambda a, entries: b'{"schemaVersion": 2, "annotations": {"dev.rocforge.index.signature": 12}, '
                        b'"manifests": []}', "bad annotations"),
])
def test_a_forged_index_under_a_trusted_keys_tag_is_passed_over_with_one_line(store, forge, words):
    url, a, built = store
    entries = _signed_entries(url, a)
    _put_index(url, forge(a, entries), publishers.publisher_tag(K1.digest, a.key_id))
    found, notes = _candidates(url, [a.public])
    # the single tag of earlier stores still names the first build; the index is ignored in one line
    assert found == [built["old"].digest]
    assert len(notes) == 1 and words in notes[0] and notes[0].endswith(": ignored"), notes
    assert "\n" not in notes[0]


def test_a_huge_index_is_cut_off_at_the_manifest_cap(store):
    url, a, _ = store
    huge = b'{"schemaVersion":2,"manifests":[],"pad":"' + b"x" * (oci.MAX_MANIFEST + 10) + b'"}'
    _put_index(url, huge, publishers.publisher_tag(K1.digest, a.key_id))
    _, notes = _candidates(url, [a.public])
    assert len(notes) == 1 and "cap" in notes[0]


def test_an_index_of_thousands_of_entries_is_refused_before_any_is_read(store):
    url, a, built = store
    many = [oci.Descriptor(oci.MANIFEST, f"sha256:{i:064x}", 100) for i in range(publishers.MAX_ENTRIES + 1)]
    _put_index(url, publishers.make_index(K1.digest, many, a), publishers.publisher_tag(K1.digest, a.key_id))
    found, notes = _candidates(url, [a.public])
    assert found == [built["old"].digest] and "past 256" in notes[0]


def test_an_index_naming_an_index_a_cycle_is_refused_and_never_followed(store):
    url, a, _ = store
    tag = publishers.publisher_tag(K1.digest, a.key_id)
    with open_store(url) as s:
        own = s.index_doc(tag)[3]
    loop = oci.Descriptor(oci.INDEX, oci.sha256_digest(own), len(own))  # its own earlier self
    _put_index(url, publishers.make_index(K1.digest, [loop], a), tag)
    _, notes = _candidates(url, [a.public])
    assert "which is not a build manifest" in notes[0]
    # listed as a build manifest, what it names is an index: that entry is passed over in one line
    as_manifest = oci.Descriptor(oci.MANIFEST, loop.digest, loop.size, annotations={publishers.CREATED: "2027-01-01T00:00:00Z"})
    _put_index(url, publishers.make_index(K1.digest, [as_manifest], a), tag)
    found, notes = _candidates(url, [a.public])
    assert loop.digest not in found and any("not an OCI image manifest" in n for n in notes), notes


def test_a_signed_index_naming_another_keys_artifact_is_passed_over_at_the_pull(store, tmp_path):
    """a's signed index of K1 names its K2 build (newest): the pull's key check refuses it and
    the K1 build the single tag names is used; with that gone, one line says why not."""
    url, a, built = store
    other = oci.Descriptor(oci.MANIFEST, built["other"].digest, len(built["other"].data),
                           annotations={publishers.CREATED: "2027-01-01T00:00:00Z"})
    _put_index(url, publishers.make_index(K1.digest, [other], a), publishers.publisher_tag(K1.digest, a.key_id))
    from rocforge_build.substitute import pull

    said: list[str] = []
    with open_store(url) as s:
        man, _, signer, _ = pull._choose(s, K1, [a.public], said.append)
        assert man.digest == built["old"].digest and signer == a.key_id
        assert any("passed over" in line and "made for another key" in line for line in said), said
        s.delete_tag(K1.tag)
        with pytest.raises(oci.StoreError) as refused:
            pull._choose(s, K1, [a.public], said.append)
    assert "made for another key" in refused.value.message


@pytest.mark.parametrize("tag", [
    "rocforge-" + "0" * 64 + "-" + "a" * 16,  # a key id in lowercase: not a publisher tag
    "rocforge-" + "0" * 64 + "-0123456789ABCDEF0",  # 17 digits
    "rocforge-" + "0" * 63,
    "rocforge-nightly-advisory-0123",
])
def test_tags_that_only_look_like_rocforge_tags_are_not_read_as_builds(tag):
    assert publishers.parse_tag(tag) is None


def test_store_list_names_a_forged_index_in_one_row_and_lists_the_rest(store, tmp_path):
    url, a, built = store
    _put_index(url, oci.make_index([], artifact_type=publishers.INDEX_TYPE),
               publishers.publisher_tag(K1.digest, a.key_id))
    me = Publisher(tmp_path / "me", a, [a])
    res = subprocess.run([sys.executable, "-m", "rocforge_build", "store", "list", url, "--json"],
                         capture_output=True, text=True, timeout=60, env=me.env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = json.loads(res.stdout)
    ignored = [r for r in rows if r["signed_by"].startswith("ignored: ")]
    assert len(ignored) == 1 and "is not signed" in ignored[0]["signed_by"]
    assert {r["manifest"] for r in rows if r["signed_by"] == a.key_id} == {built["old"].digest, built["other"].digest}


# -- gc --------------------------------------------------------------------------------------------

def _snapshot(top: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(top)): (p.lstat().st_mode, p.lstat().st_size) for p in sorted(top.rglob("*"))}


def test_gc_with_its_own_index_forged_leaves_that_keys_builds_alone(store, tmp_path):
    url, a, built = store
    _put_index(url, oci.make_index([], artifact_type=publishers.INDEX_TYPE),
               publishers.publisher_tag(K1.digest, a.key_id))
    res = Publisher(tmp_path / "me", a, [a]).gc(url, "--keep", "0")
    assert res.returncode == 0, res.stderr
    assert "is not signed: this key's builds of it left as they are" in res.stdout
    state = _state(url, built)
    assert state["old"] and state["new"] and not state["other"]  # K2's own index was whole: --keep 0


def test_gc_with_a_tag_naming_garbage_removes_nothing_in_one_line(store, tmp_path):
    url, a, built = store
    with open_store(url) as s:
        s._put_manifest(b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", '
                        b'"config": 7}', oci.MANIFEST, "latest")
    before = _snapshot(tmp_path / "store")
    res = Publisher(tmp_path / "me", a, [a]).gc(url, "--keep", "1")
    line = one_error(res, code=res.returncode)
    assert res.returncode != 0 and "nothing was removed" in line
    assert _snapshot(tmp_path / "store") == before


def test_gc_leaves_fifos_links_and_stray_files_in_the_store_and_touches_nothing_outside(store, tmp_path):
    url, a, built = store
    blobs = tmp_path / "store" / "blobs" / "sha256"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine\n")
    os.mkfifo(blobs / ("f" * 64))
    (blobs / ("e" * 64)).symlink_to(outside / "keep")
    (blobs / "notes.txt").write_text("x")
    (blobs / "subdir").mkdir()
    # the old build's layer replaced by a link out of the store: gc removes the link's name? never
    layer = blobs / built["old"].layers[0].digest.removeprefix("sha256:")
    layer.unlink()
    layer.symlink_to(outside / "keep")
    before_outside = _snapshot(outside)
    res = Publisher(tmp_path / "me", a, [a]).gc(url, "--keep", "1")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "left alone: " in res.stdout and "is not a regular file" in res.stdout
    assert layer.is_symlink() and (blobs / ("f" * 64)).exists() and (blobs / "notes.txt").is_file()
    assert _snapshot(outside) == before_outside


def test_gc_on_a_read_only_https_store_is_one_line(tmp_path):
    a = signing.generate()
    res = Publisher(tmp_path / "me", a, [a]).gc("https://127.0.0.1:9/store", "--keep", "1")
    line = one_error(res, code=res.returncode)
    assert res.returncode != 0 and "read-only" in line


def test_gc_of_a_store_url_holding_credentials_is_refused_without_repeating_them(tmp_path):
    a = signing.generate()
    env = Publisher(tmp_path / "me", a, [a]).env
    res = subprocess.run([sys.executable, "-m", "rocforge_build", "store", "gc", "oci://u:hunter2@127.0.0.1:9/r",
                          "--keep", "1"], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": str(REPO)})
    line = one_error(res, code=2)
    assert "hunter2" not in res.stderr and "hunter2" not in res.stdout and line


def test_an_index_signed_by_a_key_past_its_window_is_ignored_in_one_line(store):
    """The key's validity window (substitute.trusted_keys' not-after) holds for its index as for
    its builds: a list it signed is not believed once the window has closed."""
    from rocforge_build.trusted_entry import format_time

    url, a, _ = store
    [late] = signing.trusted_keys_from_config([f"{a.public.text} not-after={format_time(int(time.time()) - 60)}"])
    _, notes = _candidates(url, [late])
    assert len(notes) == 1 and "outside it" in notes[0] and notes[0].endswith(": ignored"), notes


@pytest.mark.parametrize("answer, words", [
    ((200, {"Content-Type": oci.INDEX}, b"\x00not json"), "not JSON"),
    ((200, {"Content-Type": oci.MANIFEST}, b"{}"), "not an OCI image index"),
    ((200, {"Content-Type": oci.INDEX}, b"{" + b" " * (oci.MAX_MANIFEST + 1) + b"}"), "cap"),
])
def test_a_registry_answering_the_index_tag_with_junk_is_passed_over_in_one_line(answer, words):
    from registry_server import FakeRegistry

    a = signing.generate()
    with FakeRegistry() as fake:
        url = fake.store_url("team/hostile")
        with open_store(url) as s:
            good = fake_build(s, K1, a, "2026-01-01T00:00:01Z", b"good" * 100)
        fake.route("GET", "/manifests/" + publishers.publisher_tag(K1.digest, a.key_id), lambda request: answer)
        found, notes = _candidates(url, [a.public])
    assert found == [good.digest]
    assert len(notes) == 1 and words in notes[0] and notes[0].endswith(": ignored"), notes
