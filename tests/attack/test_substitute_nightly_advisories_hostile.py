"""A hostile store's nightly advisories never stop or hang `nightly install`: garbage tags, a
document past the cap, a signature that does not parse, escape sequences in a signed reason, a
store that never answers (substitute.timeout 2).  Each costs one warning line at most; the
listing's newest nightly (none in data/known_bad.toml) is still chosen unless a trusted advisory
that holds names it."""

from __future__ import annotations

import json
import threading
import time

import pytest
from registry_server import FakeRegistry
from therock_tarballs import Mirror, make_tarball

from rocforge_build import cli
from rocforge_build.substitute import advisories, oci, signing
from rocforge_build.substitute.stores import open_store

GOOD, NEWER = "7.15.0a20260702", "7.15.0a20260703"


@pytest.fixture
def site(http_server, tmp_path_factory, capsys):
    work = tmp_path_factory.mktemp("adv-hostile")
    mirror = Mirror(http_server, "/adv-hostile/")
    for i, version in enumerate((GOOD, NEWER)):
        mirror.add_file(make_tarball(work, "gfx1151", version, ["gfx1151"]), 1782000000.0 + i)
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    assert cli.main(["config", "set", "substitute.timeout", "2"]) == 0
    capsys.readouterr()
    return mirror


@pytest.fixture
def fake():
    with FakeRegistry() as registry:
        yield registry


def _configure(capsys, url, pair):
    assert cli.main(["config", "set", "substitute.stores", json.dumps([url])]) == 0
    assert cli.main(["config", "set", "substitute.trusted_keys", json.dumps([pair.public.text])]) == 0
    capsys.readouterr()


def _plan(capsys, tmp_path):
    started = time.monotonic()
    rc = cli.main(["nightly", "install", "--target", "gfx1151", "--prefix", str(tmp_path / "rocm"),
                   "--dry-run", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err and "\x1b" not in err and "\x1b" not in out
    return [layer["version"] for layer in json.loads(out)["layers"]], err, time.monotonic() - started


def _push(store, pair, doc_bytes: bytes, *, sig: bytes | None = None, tag_hex="0123456789abcdef"):
    if sig is None:
        sig = signing.sign(doc_bytes, pair, advisories.comment(oci.sha256_digest(doc_bytes))).encode()
    layers = [store.push_blob_bytes(doc_bytes, oci.JSON_LAYER), store.push_blob_bytes(sig, oci.MINISIGN_LAYER)]
    man = oci.make_manifest(artifact_type=oci.ADVISORY_TYPE,
                            config=store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY), layers=layers,
                            annotations={"dev.rocforge.signer": pair.key_id})
    store.push_manifest(man, tag=advisories.TAG_PREFIX + tag_hex)


def test_junk_beside_a_good_advisory_leaves_the_good_one_working(site, fake, capsys, tmp_path):
    pair = signing.generate()
    url = fake.store_url()
    with open_store(url, timeout=5) as store:
        good = advisories.make_document(NEWER, NEWER, ["gfx1151"], "real", "t")
        advisories.publish(store, good, pair)
        _push(store, pair, b"x" * (1 << 20), tag_hex="aaaaaaaaaaaaaaa1")  # past the 16 KiB cap
        _push(store, pair, b"[]", tag_hex="aaaaaaaaaaaaaaa2")  # signed, not an object
        _push(store, pair, b"{}", sig=b"not a signature", tag_hex="aaaaaaaaaaaaaaa3")
        bad_version = oci.canonical_json({**good, "first": "$(reboot)", "last": "$(reboot)"})
        _push(store, pair, bad_version, tag_hex="aaaaaaaaaaaaaaa4")
    fake.tag_map[advisories.TAG_PREFIX + "fffffffffffffff0"] = "sha256:" + "0" * 64  # a dangling tag
    _configure(capsys, url, pair)
    versions, err, _ = _plan(capsys, tmp_path)
    assert versions == [GOOD]
    assert err.count("advisory left out") == 5, err
    assert "$(reboot)" not in err or "'" in err  # quoted as data, never a command


def test_escape_sequences_in_a_signed_reason_reach_no_terminal(site, fake, capsys, tmp_path):
    pair = signing.generate()
    url = fake.store_url()
    doc = advisories.make_document(NEWER, NEWER, ["gfx1151"], "ok", "t")
    doc["reason"] = "\x1b]0;pwned\x07 red \x1b[31m"
    with open_store(url, timeout=5) as store:
        _push(store, pair, oci.canonical_json(doc))
    _configure(capsys, url, pair)
    versions, err, _ = _plan(capsys, tmp_path)  # _plan asserts no ESC in stdout or stderr
    assert versions == [GOOD]


def test_thousands_of_tags_are_bounded(site, fake, capsys, tmp_path):
    pair = signing.generate()
    for i in range(3000):
        fake.tag_map[f"{advisories.TAG_PREFIX}{i:016x}"] = "sha256:" + "1" * 64
    _configure(capsys, fake.store_url(), pair)
    versions, err, took = _plan(capsys, tmp_path)
    # at most 256 advisories are read, within 3 timeouts (6 s here), and told in a dozen lines
    assert versions == [NEWER] and took < 10, took
    assert "3000 advisories" in err and len(err.splitlines()) <= 12, err


def test_a_store_that_hangs_costs_the_timeout_and_one_line(site, fake, capsys, tmp_path):
    pair = signing.generate()
    release = threading.Event()

    def hang(_request):
        release.wait(30)
        return 200, {}, b'{"tags": []}'
    fake.route("GET", r".*/tags/list", hang)
    _configure(capsys, fake.store_url(), pair)
    try:
        versions, err, took = _plan(capsys, tmp_path)
    finally:
        release.set()
    assert versions == [NEWER] and took < 15, took
    assert err.count("no nightly advisories read") == 1, err
