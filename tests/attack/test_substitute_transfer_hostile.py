"""A store that answers, but slowly: every read from a substitute store (a manifest, the key
document, a layer, an https layout's index.json, the tags, the referrers) runs under
download_policy's whole deadline and least rate, as every download does, and a store listing
hundreds of referrers naming the trusted key is read only so far.  The right answer each time is
one line naming the store, what was being read and the config key that raises the limit, within
that limit (set small here), never after the bytes x timeout a trickle could otherwise take."""

from __future__ import annotations

import hashlib
import time

import pytest
from registry_server import FakeRegistry, clear_store_environment, make_tls

from rocforge_build.download_policy import RetryPolicy
from rocforge_build.substitute import artifact, oci, signing
from rocforge_build.substitute.oci import StoreUnreachable, TransferExpired
from rocforge_build.substitute.store_registry import RegistryStore
from rocforge_build.substitute.stores import open_store


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    clear_store_environment(monkeypatch)


@pytest.fixture
def fake():
    with FakeRegistry() as registry:
        yield registry


def _policy(**limits) -> RetryPolicy:
    """download_policy's policy with the test's small limits (no rate check unless asked)."""
    return RetryPolicy(**{"min_rate": 0.0, "notify": None, **limits})


def _one_line(exc: Exception) -> str:
    assert "\n" not in exc.message and len(exc.message) < 400, exc.message
    return exc.message


def _trickle(data: bytes, *, step: int = 1, gap: float = 0.05, content_type: str = "application/octet-stream"):
    """A route sending `data` (from a Range's start) `step` bytes every `gap` seconds: each byte
    well within any read timeout, the whole far past the limits the tests set.  It ends when
    the client hangs up (or after 20 s)."""
    def handler(request):
        start = int(request.headers.get("Range", "bytes=0-").removeprefix("bytes=").rstrip("-"))
        h = request.handler
        h.send_response(206 if start else 200)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        ends = time.monotonic() + 20
        try:
            for at in range(start, len(data), step):
                h.wfile.write(data[at:at + step])
                h.wfile.flush()
                time.sleep(gap)
                if time.monotonic() > ends:
                    break
        except OSError:
            pass
        h.close_connection = True
        return "raw", {}, b""

    return handler


def _blob(fake: FakeRegistry, data: bytes, media_type: str = oci.BUNDLE_LAYER) -> oci.Descriptor:
    return oci.Descriptor(media_type, fake.add_blob(data), len(data))


# -- finding 1: a whole deadline and a least rate on every registry read ------------------------------

def test_a_trickled_key_document_stops_at_the_listing_deadline_naming_it(fake):
    """2000 bytes at 20 B/s would take 100 s, each byte inside the 5 s timeout: the whole read
    ends at download.listing_deadline (1 s here), one line naming store, object and key."""
    desc = _blob(fake, b"k" * 2000, oci.KEY_CONFIG)
    fake.route("GET", "/blobs/", _trickle(b"k" * 2000))
    store = RegistryStore(fake.store_url(), timeout=5, policy=_policy(listing_deadline=1.0))
    started = time.monotonic()
    with pytest.raises(TransferExpired) as info:
        store.read_blob(desc, artifact.MAX_DOCUMENT, "key document")
    assert _one_line(info.value) == (f"{fake.store_url()}: key document {desc.digest[:19]}: still "
                                     "receiving at the 1 s limit (download.listing_deadline)")
    assert "rocforge config set download.listing_deadline SECONDS" in info.value.hint
    assert time.monotonic() - started < 3


def test_a_layer_trickled_above_the_least_rate_stops_at_the_whole_deadline_unresumed(fake, tmp_path):
    """5 kB/s passes min_rate 1024 B/s, so only the whole deadline (download.deadline) ends it:
    once, not resumed (a resume would only wait again), the partial file removed."""
    data = bytes(range(256)) * 400
    desc = _blob(fake, data)
    fake.route("GET", "/blobs/", _trickle(data, step=100, gap=0.02))
    store = RegistryStore(fake.store_url(), timeout=5,
                          policy=_policy(deadline=1.5, min_rate=1024.0, rate_window=0.5))
    started = time.monotonic()
    with pytest.raises(TransferExpired) as info:
        store.fetch_blob(desc, tmp_path / "layer", cap=1 << 20)
    assert _one_line(info.value) == (f"{fake.store_url()}: layer {desc.digest[:19]}: still receiving "
                                     "at the 1.5 s limit (download.deadline)")
    assert time.monotonic() - started < 4
    assert len([r for r in fake.requests if "/blobs/" in r.path]) == 1
    assert not (tmp_path / "layer").exists()


def test_a_layer_under_the_least_rate_is_resumed_then_one_line_naming_download_min_rate(fake, tmp_path):
    """200 B/s under min_rate 10 kB/s over a 0.5 s window: each try is dropped and resumed from
    the bytes it got (Range), as a download's are; after the resumes, one line."""
    data = b"z" * 50_000
    desc = _blob(fake, data)
    fake.route("GET", "/blobs/", _trickle(data, step=10, gap=0.05))
    store = RegistryStore(fake.store_url(), timeout=5,
                          policy=_policy(deadline=60.0, min_rate=10_000.0, rate_window=0.5))
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as info:
        store.fetch_blob(desc, tmp_path / "layer", cap=1 << 20, retries=2)
    line = _one_line(info.value)
    assert line.startswith(f"{fake.store_url()}: layer {desc.digest[:19]}: too slow: ")
    assert line.endswith("below download.min_rate 10000"), line
    assert "download.min_rate" in info.value.hint
    ranges = [r.headers.get("Range") for r in fake.requests if "/blobs/" in r.path]
    assert len(ranges) == 3 and ranges[0] is None and all(r and r != "bytes=0-" for r in ranges[1:])
    assert time.monotonic() - started < 4 and not (tmp_path / "layer").exists()


def test_a_trickled_manifest_stops_at_the_listing_deadline(fake):
    manifest = b"{" + b" " * 3000 + b"}"
    fake.route("GET", "/manifests/", _trickle(manifest, content_type=oci.MANIFEST))
    store = RegistryStore(fake.store_url(), timeout=5, policy=_policy(listing_deadline=1.0))
    started = time.monotonic()
    with pytest.raises(TransferExpired) as info:
        store.manifest("slow")
    assert _one_line(info.value) == (f"{fake.store_url()}: manifest slow: still receiving at the "
                                     "1 s limit (download.listing_deadline)")
    assert time.monotonic() - started < 3


def test_a_manifest_under_the_least_rate_is_one_line_naming_download_min_rate(fake):
    fake.route("GET", "/manifests/", _trickle(b"{" + b" " * 3000 + b"}", content_type=oci.MANIFEST))
    store = RegistryStore(fake.store_url(), timeout=5,
                          policy=_policy(listing_deadline=60.0, min_rate=10_000.0, rate_window=0.5))
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as info:
        store.manifest("slow")
    line = _one_line(info.value)
    assert line.startswith(f"{fake.store_url()}: manifest slow: too slow: ") and "download.min_rate" in line
    assert time.monotonic() - started < 3


def test_a_trickled_tags_listing_stops_at_the_listing_deadline(fake):
    fake.route("GET", "/tags/list", _trickle(b'{"tags": [' + b'"a",' * 500 + b'"a"]}',
                                             content_type="application/json"))
    store = RegistryStore(fake.store_url(), timeout=5, policy=_policy(listing_deadline=1.0))
    started = time.monotonic()
    with pytest.raises(TransferExpired) as info:
        store.tags()
    assert _one_line(info.value) == (f"{fake.store_url()}: the tags: still receiving at the 1 s "
                                     "limit (download.listing_deadline)")
    assert time.monotonic() - started < 3


def test_a_silent_wait_is_cut_at_the_deadline_not_at_the_longer_timeout(fake):
    """Headers, then nothing: with the store's timeout 30 s and the deadline 1 s, the read's wait
    ends by the deadline and says so (not 'no answer within 30 s', 30 s later)."""
    desc = _blob(fake, b"x" * 100)

    def silent(request):
        h = request.handler
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.flush()
        h.connection.settimeout(5)
        try:
            h.connection.recv(1)  # until the client hangs up
        except OSError:
            pass
        return "raw", {}, b""

    fake.route("GET", "/blobs/", silent)
    store = RegistryStore(fake.store_url(), timeout=30, policy=_policy(listing_deadline=1.0))
    started = time.monotonic()
    with pytest.raises(TransferExpired) as info:
        store.read_blob(desc)
    assert "still receiving at the 1 s limit (download.listing_deadline)" in _one_line(info.value)
    assert time.monotonic() - started < 3


# -- finding 3: an https:// layout store trickling index.json -----------------------------------------

def test_an_https_layout_store_trickling_index_json_stops_at_the_listing_deadline(tmp_path, monkeypatch):
    """index.json at 20 B/s (3000 bytes: 150 s): one line at download.listing_deadline (a URL with
    credentials is refused before any read: tests/attack/test_substitute_secrets_hostile.py)."""
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    index = oci.make_index([]) + b" " * 3000
    with FakeRegistry(tls) as server:
        server.route("GET", "^/layout/index.json$", _trickle(index, content_type="application/json"))
        store = open_store(f"https://{server.host}/layout", timeout=5,
                           policy=_policy(listing_deadline=1.0))
        started = time.monotonic()
        with pytest.raises(TransferExpired) as info:
            store.manifest("build-1")
        elapsed = time.monotonic() - started
        store.close()
    assert _one_line(info.value) == (f"https://{server.host}/layout: index.json: still receiving at "
                                     "the 1 s limit (download.listing_deadline)")
    assert elapsed < 3


# -- finding 2: referrers naming the trusted key, read only so far -----------------------------------

def _build_with_referrers(fake: FakeRegistry, count: int, artifact_type: str, key_id: str) -> oci.Manifest:
    """A build manifest whose referrers index (the tag schema) lists `count` referrers of
    `artifact_type` annotated with `key_id`, none of which the registry holds."""
    config = _blob(fake, oci.EMPTY_DATA, oci.EMPTY)
    data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config, layers=[])
    build = oci.Manifest.parse(data, "test")
    entries = [oci.Descriptor(oci.MANIFEST, "sha256:" + hashlib.sha256(b"%d" % i).hexdigest(), 400,
                              artifact_type=artifact_type, annotations={artifact.SIGNER: key_id})
               for i in range(count)]
    fake.manifests["idx"] = (oci.make_index(entries), oci.INDEX)
    fake.tag_map[oci.fallback_tag(build.digest)] = "idx"
    return build


def _referrer_gets(fake: FakeRegistry) -> int:
    return len([r for r in fake.requests if "/manifests/sha256:" in r.path])


def test_three_hundred_signature_referrers_naming_the_trusted_key_are_read_only_to_the_cap(fake):
    """Each is read (a manifest, a blob) one by one: 300 would be 300 round trips or more; at
    most MAX_READ_REFERRERS are, and the refusal says in one line how many were skipped."""
    pair = signing.generate()
    build = _build_with_referrers(fake, 300, oci.SIGNATURE_TYPE, pair.key_id)
    store = RegistryStore(fake.store_url(), timeout=5, policy=_policy())
    with pytest.raises(artifact.Refused) as info:
        artifact.signed_by(store, build, [pair.public])
    cap = artifact.MAX_READ_REFERRERS
    assert _one_line(info.value).endswith(
        f"; {300 - cap} of the 300 signature referrers of {build.digest[:19]} naming a trusted key "
        f"were skipped (at most {cap} are read)")
    assert _referrer_gets(fake) == cap


def test_referrers_answered_just_under_the_timeout_stop_at_the_listing_deadline(fake):
    """Each advisory referrer answered after 0.4 s (the timeout is 1 s): the walk, and every
    read in it, ends at download.listing_deadline (1.5 s), and the skipped ones are one note."""
    pair = signing.generate()
    build = _build_with_referrers(fake, 300, oci.ADVISORY_TYPE, pair.key_id)

    def slow(request):
        time.sleep(0.4)
        return None  # then the registry's own 404

    fake.route("GET", "/manifests/sha256:", slow)
    store = RegistryStore(fake.store_url(), timeout=1, policy=_policy(listing_deadline=1.5))
    notes: list[str] = []
    started = time.monotonic()
    good, _ = artifact.attached(store, build, oci.ADVISORY_TYPE, [pair.public], notes)
    elapsed = time.monotonic() - started
    assert good == [] and len(notes) == 1, notes
    read = _referrer_gets(fake)
    assert 1 <= read <= 5 and elapsed < 3
    assert notes[0].startswith(f"{fake.store_url()}: ")
    assert notes[0].endswith("advisory referrers of " + build.digest[:19] + " naming a trusted key were "
                             "skipped (stopped at the 1.5 s limit (download.listing_deadline))"), notes[0]
