"""`rocforge store gc URL --keep N` through the real CLI, on an OCI image layout on disk, a real
registry (Debian's docker-registry, deletion enabled) and S3 (moto's server): this key's builds
past the N newest per key go with their referrers and the blobs nothing kept needs, its signed
index is written again, another publisher's builds stay (unless --all-publishers), `--dry-run`
changes nothing, and a registry that refuses deletion is one line with nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from needs import require
from registry_server import FakeRegistry, clear_store_environment, start_registry
from test_substitute_layout_store import s3_endpoint  # noqa: F401 - moto's server on 127.0.0.1, a fixture
from trust_helpers import REPO, one_error

from rocforge_build.forge.substitute_key import SubstituteKey
from rocforge_build.substitute import artifact, oci, publishers, signing
from rocforge_build.substitute.stores import open_store

K1 = SubstituteKey.of_fields({"recipe": "fixture", "n": 1})
K2 = SubstituteKey.of_fields({"recipe": "fixture", "n": 2})


def fake_build(store: oci.Store, key: SubstituteKey, pair: signing.KeyPair, created: str, payload: bytes) -> oci.Manifest:
    """A build as `rocforge publish` leaves it (key document, one layer, a signature, the
    publisher's signed index, the single tag where none is), with `payload` as its bundle."""
    config = store.push_blob_bytes(key.document, oci.KEY_CONFIG)
    layer = store.push_blob_bytes(payload, oci.BUNDLE_LAYER)
    man = store.push_manifest(artifact.build_manifest(key, config, layer, {
        publishers.CREATED: created, "dev.rocforge.publisher": pair.key_id}))
    artifact.attach(store, man, oci.SIGNATURE_TYPE, None, pair)
    publishers.add(store, key, man, pair)
    try:
        store.manifest(key.tag)
    except oci.NotFound:
        store.push_manifest(man.data, tag=key.tag)
    return man


class Publisher:
    """A machine whose config trusts `trusted` and whose signing key is `pair`."""

    def __init__(self, base: Path, pair: signing.KeyPair, trusted: list[signing.KeyPair]):
        self.pair = pair
        config = base / "config"
        (config / "keys").mkdir(parents=True)
        signing.write_key_pair(config / "keys" / "rocforge.key", config / "keys" / "rocforge.pub", pair)
        keys = ", ".join(json.dumps(p.public.text) for p in trusted)
        (config / "config.toml").write_text(f"[substitute]\ntrusted_keys = [{keys}]\ntimeout = 5\n")
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "ROCFORGE_CONFIG_DIR": str(config),
                    "ROCFORGE_CACHE_DIR": str(base / "cache"), "ROCFORGE_DATA_DIR": str(base / "data")}

    def gc(self, url: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rocforge_build", "store", "gc", url, *args],
                              capture_output=True, text=True, timeout=60, env=self.env)


def _store(kind: str, tmp_path: Path, request) -> str:
    if kind == "registry":
        require("docker-registry")
        registry = start_registry(tmp_path / "registry")
        request.addfinalizer(lambda: registry.__exit__(None, None, None))
        return registry.__enter__().store_url("team/gc")
    if kind == "s3":
        request.getfixturevalue("s3_endpoint")
        return "s3://builds/gc"
    return (tmp_path / "store").as_uri()


def _populate(url: str, a: signing.KeyPair, b: signing.KeyPair) -> dict[str, oci.Manifest]:
    with open_store(url) as store:
        return {"a1": fake_build(store, K1, a, "2026-01-01T00:00:01Z", b"a1" * 5000),
                "a2": fake_build(store, K1, a, "2026-01-01T00:00:02Z", b"a2" * 5000),
                "b1": fake_build(store, K1, b, "2026-01-01T00:00:03Z", b"b1" * 5000),
                "a3": fake_build(store, K1, a, "2026-01-01T00:00:04Z", b"a3" * 5000),
                "c1": fake_build(store, K2, a, "2026-01-01T00:00:01Z", b"c1" * 5000)}


def _state(url: str, built: dict[str, oci.Manifest]) -> dict[str, bool]:
    """Which builds' manifests and layers the store still holds."""
    out = {}
    with open_store(url) as store:
        for name, man in built.items():
            try:
                store.manifest(man.digest)
                held = True
            except oci.NotFound:
                held = False
            with_layer = held
            try:
                store.read_blob(man.layers[0], 1 << 20)
            except oci.NotFound:
                with_layer = False
            except oci.StoreError as exc:  # a registry's 404 for a blob
                assert "404" in exc.message, exc.message
                with_layer = False
            out[name] = held and with_layer
    return out


@pytest.mark.parametrize("kind", ["file", "registry", "s3"])
def test_gc_keeps_the_newest_of_this_keys_builds_and_every_other_publishers(tmp_path, kind, request, monkeypatch):
    clear_store_environment(monkeypatch)
    url = _store(kind, tmp_path, request)
    a, b = signing.generate(), signing.generate()
    built = _populate(url, a, b)
    me = Publisher(tmp_path / "a", a, [a, b])
    everything = dict.fromkeys(built, True)

    dry = me.gc(url, "--keep", "1", "--dry-run")
    assert dry.returncode == 0 and not dry.stderr, dry.stderr
    assert built["a1"].digest[:19] in dry.stdout and built["a2"].digest[:19] in dry.stdout
    assert "would free" in dry.stdout and " bytes" in dry.stdout and "would move rocforge-" in dry.stdout
    assert _state(url, built) == everything  # a dry run removes nothing

    done = me.gc(url, "--keep", "1")
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "freed " in done.stdout
    assert _state(url, built) == {**everything, "a1": False, "a2": False}
    with open_store(url) as store:
        assert [e.digest for e in publishers.read_index(store, K1.digest, a.public)] == [built["a3"].digest]
        assert [e.digest for e in publishers.read_index(store, K1.digest, b.public)] == [built["b1"].digest]
        # the single tag older rocforge reads named a1: it now names this key's newest kept build
        assert store.manifest(K1.tag).digest == built["a3"].digest
        [newest, *_] = publishers.candidates(store, K1.digest, [a.public], [])
        assert newest.digest == built["a3"].digest and artifact.signed_by(store, newest, [a.public]) == a.key_id

    if kind == "file":  # nothing left to remove: a second run is a no-op (the same code on each store)
        again = me.gc(url, "--keep", "1")
        assert again.returncode == 0 and "0 build(s)" in again.stdout, again.stdout + again.stderr

    everyone = me.gc(url, "--keep", "1", "--all-publishers")
    assert everyone.returncode == 0, everyone.stderr
    assert f"the index of {b.key_id}" in everyone.stdout
    assert _state(url, built) == {**everything, "a1": False, "a2": False, "b1": False}


def test_gc_never_removes_an_untrusted_publishers_builds_and_leaves_foreign_files(tmp_path):
    """A publisher this machine does not trust is still another's: kept without
    --all-publishers; a file in blobs/ that is not a blob, and a link named as a blob, are left."""
    url = (tmp_path / "store").as_uri()
    a, stranger = signing.generate(), signing.generate()
    built = _populate(url, a, stranger)
    blobs = tmp_path / "store" / "blobs" / "sha256"
    (blobs / "README").write_text("notes\n")
    outside = tmp_path / "outside"
    outside.write_text("not the store's\n")
    (blobs / ("0" * 64)).symlink_to(outside)
    res = Publisher(tmp_path / "a", a, [a]).gc(url, "--keep", "1")
    assert res.returncode == 0, res.stderr
    assert "left alone: 2 file(s) under blobs/ that are not blobs" in res.stdout
    assert _state(url, built)["b1"] and not _state(url, built)["a1"]
    assert outside.read_text() == "not the store's\n" and (blobs / "README").is_file()


def test_a_registry_that_refuses_deletion_is_one_line_and_nothing_changes(tmp_path):
    a = signing.generate()
    with FakeRegistry() as fake:
        url = fake.store_url("team/gc")
        built = _populate(url, a, signing.generate())
        tags_before = dict(fake.tag_map)
        fake.route("DELETE", r"/manifests/|/blobs/", lambda request: (405, {"Content-Type": "application/json"}, json.dumps(
            {"errors": [{"code": "UNSUPPORTED", "message": "The operation is unsupported."}]}).encode()))
        res = Publisher(tmp_path / "a", a, [a]).gc(url, "--keep", "1")
        line = one_error(res, code=res.returncode)
        assert res.returncode != 0 and "refuses deletion: HTTP 405 (UNSUPPORTED" in line, res.stderr
        assert line.endswith("; nothing was removed")
        assert fake.tag_map == tags_before and _state(url, built) == dict.fromkeys(built, True)


@pytest.mark.parametrize("args, words", [
    (("--keep", "-1"), "below 0"),
    (("--keep", "lots"), "whole number"),
    (("--keep", "99999999999999999999"), "above 10000"),
    ((), "needs --keep N"),
    (("sha256:" + "0" * 64, "--keep", "1"), "takes a URL"),
])
def test_bad_gc_arguments_are_one_line_before_any_store_is_opened(tmp_path, args, words):
    a = signing.generate()
    res = Publisher(tmp_path / "a", a, [a]).gc((tmp_path / "nothing").as_uri(), *args)
    line = one_error(res, code=2)
    assert words in line, line
    assert not (tmp_path / "nothing").exists()


def test_a_build_published_while_gc_runs_stays_listed_and_whole(tmp_path, monkeypatch):
    """This key publishes a build between gc's plan and its rewrite of the key's index (another
    machine with the same key): the index gc signs again still lists it, and its blobs stay."""
    from rocforge_build.substitute import gc

    url = (tmp_path / "store").as_uri()
    a, b = signing.generate(), signing.generate()
    built = _populate(url, a, b)
    real_plan = gc.plan

    def plan_then_publish(store, *args, **kwargs):
        found = real_plan(store, *args, **kwargs)
        with open_store(url) as other:
            built["late"] = fake_build(other, K1, a, "2026-01-01T00:00:09Z", b"late" * 5000)
        return found

    monkeypatch.setattr(gc, "plan", plan_then_publish)
    lines: list[str] = []
    with open_store(url) as store:
        gc.run(store, 1, a, a.public, [a.public, b.public], all_publishers=False, dry_run=False, say=lines.append)
        assert [e.digest for e in publishers.read_index(store, K1.digest, a.public)] == [
            built["late"].digest, built["a3"].digest]
    assert _state(url, built) == {**dict.fromkeys(built, True), "a1": False, "a2": False}


def test_a_build_another_tag_names_is_kept_whole_with_its_signature(tmp_path):
    """A tag rocforge did not make (`latest`, by hand) names an old build of this key: gc keeps
    it, with its referrers and the tag-schema index that finds them, and says so."""
    url = (tmp_path / "store").as_uri()
    a, b = signing.generate(), signing.generate()
    built = _populate(url, a, b)
    with open_store(url) as store:
        store.push_manifest(built["a1"].data, tag="latest")
    res = Publisher(tmp_path / "a", a, [a, b]).gc(url, "--keep", "1")
    assert res.returncode == 0, res.stderr
    assert f"{built['a1'].digest[:19]} is named by another tag of the store: kept" in res.stdout
    assert _state(url, built) == {**dict.fromkeys(built, True), "a2": False}
    with open_store(url) as store:
        assert artifact.signed_by(store, store.manifest("latest"), [a.public]) == a.key_id


def test_an_unnamed_blob_goes_only_once_older_than_the_grace(tmp_path):
    """A layout's blob nothing names (a publish that died before naming it) goes once it is past
    the hour a publish under way may take; a fresh one stays, and so does an old one a build needs."""
    import hashlib
    import time

    url = (tmp_path / "store").as_uri()
    a = signing.generate()
    built = _populate(url, a, signing.generate())
    blobs = tmp_path / "store" / "blobs" / "sha256"
    old, fresh = b"abandoned upload", b"an upload under way"
    for data in (old, fresh):
        (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
    hour_ago = time.time() - 3700
    os.utime(blobs / hashlib.sha256(old).hexdigest(), (hour_ago, hour_ago))
    needed = blobs / built["a3"].layers[0].digest.removeprefix("sha256:")
    os.utime(needed, (hour_ago, hour_ago))
    res = Publisher(tmp_path / "a", a, [a]).gc(url, "--keep", "5")
    assert res.returncode == 0, res.stderr
    assert f"removing unnamed sha256:{hashlib.sha256(old).hexdigest()[:12]}" in res.stdout
    assert not (blobs / hashlib.sha256(old).hexdigest()).exists()
    assert (blobs / hashlib.sha256(fresh).hexdigest()).exists() and needed.exists()
    assert _state(url, built) == dict.fromkeys(built, True)
