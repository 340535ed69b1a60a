"""A hostile or broken registry meets the registry store: redirects elsewhere, a registry that
hangs or drops mid-layer, bytes that are not their digest, answers past their caps, garbage JSON.
Each gives one line (or, for a drop, a resumed download), never a hang or a traceback."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import pytest
from registry_server import FakeRegistry, clear_store_environment, make_tls

from rocforge_build.substitute import oci
from rocforge_build.substitute.oci import StoreError, StoreUnreachable
from rocforge_build.substitute.store_registry import RegistryStore

MIB = 1 << 20


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    clear_store_environment(monkeypatch)


@pytest.fixture
def fake():
    with FakeRegistry() as registry:
        yield registry


def _one_line(exc: Exception) -> str:
    assert "\n" not in exc.message and len(exc.message) < 400, exc.message
    return exc.message


def _blob(fake: FakeRegistry, data: bytes) -> oci.Descriptor:
    return oci.Descriptor(oci.BUNDLE_LAYER, fake.add_blob(data), len(data))


def _answer(status: int, headers: dict | None = None, body: bytes = b""):
    return lambda request: (status, headers or {}, body)


# -- redirects -----------------------------------------------------------------------------------

def test_a_redirect_to_another_host_is_refused_naming_both(fake):
    with FakeRegistry() as elsewhere:
        elsewhere.manifests["x"] = (b"{}", oci.MANIFEST)
        fake.route("GET", "/manifests/", _answer(302, {"Location": f"{elsewhere.base}/v2/x/manifests/x"}))
        with pytest.raises(StoreError) as info:
            RegistryStore(fake.store_url(), timeout=5).manifest("build-1")
        message = _one_line(info.value)
        assert f"http://{fake.host} redirects GET to http://{elsewhere.host}" in message
        assert elsewhere.requests == []


def test_a_blob_redirect_to_another_host_over_plain_http_is_refused(fake):
    desc = _blob(fake, b"layer")
    fake.route("GET", "/blobs/", _answer(307, {"Location": "http://203.0.113.9:9/blob"}))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).read_blob(desc)
    assert "203.0.113.9:9" in _one_line(info.value) and fake.host in info.value.message


def test_a_redirect_on_the_registry_itself_is_followed(fake):
    desc = _blob(fake, b"layer bytes")
    moved = {"done": False}

    def once(request):
        if moved["done"]:
            return None
        moved["done"] = True
        return 307, {"Location": request.path}, b""

    fake.route("GET", "/blobs/", once)
    assert RegistryStore(fake.store_url(), timeout=5).read_blob(desc) == b"layer bytes"


def test_a_redirect_loop_stops(fake):
    fake.route("GET", "/manifests/", lambda request: (302, {"Location": request.path}, b""))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).manifest("loop")
    assert "more than 5 redirects" in _one_line(info.value)
    assert len([r for r in fake.requests if "/manifests/" in r.path]) == 6


def test_tls_blob_redirect_to_a_storage_host_drops_the_credentials(tmp_path, monkeypatch):
    """ghcr.io's way: the registry (basic auth) sends a blob GET to another https host; the
    bytes come (their digest checks them) and the storage host never sees the Authorization."""
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", "pw")
    with FakeRegistry(tls) as registry, FakeRegistry(tls, host="localhost") as storage:
        data = b"layer from the storage host"
        desc = oci.Descriptor(oci.BUNDLE_LAYER, storage.add_blob(data), len(data))

        def needs_auth(request):
            if request.headers.get("Authorization") != "Basic Y2k6cHc=":
                return 401, {"WWW-Authenticate": 'Basic realm="test"'}, b""
            return 307, {"Location": f"{storage.base}/v2/s/blobs/{desc.digest}"}, b""

        registry.route("GET", "/blobs/", needs_auth)
        registry.route("HEAD", "/blobs/", needs_auth)  # distribution on S3 redirects HEADs too
        assert storage.host.startswith("localhost:")
        store = RegistryStore(registry.store_url(), timeout=5)
        assert store.has_blob(desc.digest) and store.read_blob(desc) == data
        assert [(r.method, r.headers.get("Authorization")) for r in storage.requests] == [
            ("HEAD", None), ("GET", None)]


def test_tls_blob_redirect_to_plain_http_is_refused(tmp_path, monkeypatch):
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    with FakeRegistry(tls) as registry, FakeRegistry() as plain:
        desc = _blob(plain, b"layer")
        registry.route("GET", "/blobs/", _answer(302, {"Location": f"{plain.base}/v2/s/blobs/{desc.digest}"}))
        with pytest.raises(StoreError) as info:
            RegistryStore(registry.store_url(), timeout=5).read_blob(desc)
        assert f"to http://{plain.host}" in _one_line(info.value) and plain.requests == []


def test_an_upload_location_elsewhere_is_refused(fake):
    fake.route("POST", "/blobs/uploads/", _answer(202, {"Location": "http://203.0.113.9/upload"}))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).push_blob_bytes(b"x", oci.JSON_LAYER)
    assert "203.0.113.9" in _one_line(info.value)


# -- hangs and drops --------------------------------------------------------------------------------

@pytest.fixture
def silent_server():
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_registry_that_hangs_is_one_line_within_the_timeout(silent_server):
    store = RegistryStore(f"oci+http://{silent_server}/team/cache", timeout=2)
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as info:
        store.tags()
    elapsed = time.monotonic() - started
    assert _one_line(info.value) == f"oci+http://{silent_server}/team/cache: no answer within 2 s"
    assert 1.5 < elapsed < 4


def test_a_blob_that_stalls_after_its_headers_is_one_line(fake):
    desc = _blob(fake, b"a" * 1000)

    def stall(request):
        h = request.handler
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b"a" * 10)
        h.wfile.flush()
        time.sleep(4)
        return "raw", {}, b""

    fake.route("GET", "/blobs/", stall)
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(fake.store_url(), timeout=1).read_blob(desc)
    assert "no answer within 1 s" in _one_line(info.value) and time.monotonic() - started < 3


def _dropping(fake: FakeRegistry, after: int, times: int, *, ignore_range: bool = False):
    """A route: the first `times` blob GETs send `after` bytes of what was asked, then close;
    later GETs are answered by the fake (206 to a Range), or with 200 and the whole blob."""
    left = [times]

    def handler(request):
        data = fake.blobs[request.path.rsplit("/", 1)[1]]
        start = int(request.headers.get("Range", "bytes=0-").removeprefix("bytes=").rstrip("-"))
        if ignore_range:
            start = 0
        if left[0] <= 0:
            return (200, {}, data) if ignore_range else None
        left[0] -= 1
        h = request.handler
        h.send_response(206 if start else 200)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        h.wfile.write(data[start:start + after])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)
        return "raw", {}, b""

    return handler


def test_a_layer_dropped_twice_is_resumed(fake, tmp_path):
    data = bytes(range(256)) * 2048
    desc = _blob(fake, data)
    fake.route("GET", "/blobs/", _dropping(fake, 50_000, 2))
    RegistryStore(fake.store_url(), timeout=5).fetch_blob(desc, tmp_path / "out", cap=MIB)
    assert (tmp_path / "out").read_bytes() == data
    assert [r.headers.get("Range") for r in fake.requests] == [None, "bytes=50000-", "bytes=100000-"]


def test_a_registry_that_ignores_range_is_resumed_by_skipping(fake, tmp_path):
    """A 200 (the whole blob) to a ranged GET: the bytes already written are skipped."""
    data = bytes(range(256)) * 2048
    desc = _blob(fake, data)
    fake.route("GET", "/blobs/", _dropping(fake, 70_000, 1, ignore_range=True))
    RegistryStore(fake.store_url(), timeout=5).fetch_blob(desc, tmp_path / "out", cap=MIB)
    assert (tmp_path / "out").read_bytes() == data


def test_a_layer_that_always_drops_is_one_line_after_the_retries(fake, tmp_path):
    desc = _blob(fake, b"q" * 200_000)
    fake.route("GET", "/blobs/", _dropping(fake, 1000, 100))
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(fake.store_url(), timeout=5).fetch_blob(desc, tmp_path / "out", cap=MIB, retries=3)
    _one_line(info.value)
    assert not (tmp_path / "out").exists() and len(fake.requests) == 4


def test_a_resumed_answer_from_the_wrong_offset_is_refused(fake, tmp_path):
    data = b"r" * 10_000
    desc = _blob(fake, data)
    fake.route("GET", "/blobs/", _dropping(fake, 100, 1))
    fake.route("GET", "/blobs/", lambda request: (206, {"Content-Range": f"bytes 0-9999/{len(data)}"}, data)
               if request.headers.get("Range") else None)
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).fetch_blob(desc, tmp_path / "out", cap=MIB)
    assert "asked from byte 100" in _one_line(info.value) and not (tmp_path / "out").exists()


# -- bytes that are not what they say ---------------------------------------------------------------

def test_a_blob_whose_bytes_do_not_match_its_digest_is_refused(fake, tmp_path):
    data = b"the real layer"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    fake.blobs[digest] = b"the evil layer"  # same length, other bytes
    desc = oci.Descriptor(oci.BUNDLE_LAYER, digest, len(data))
    store = RegistryStore(fake.store_url(), timeout=5)
    with pytest.raises(StoreError) as info:
        store.fetch_blob(desc, tmp_path / "out", cap=MIB)
    assert "do not match its digest" in _one_line(info.value) and not (tmp_path / "out").exists()
    with pytest.raises(StoreError):
        store.read_blob(desc)


def test_a_blob_longer_than_its_descriptor_is_refused(fake, tmp_path):
    data = b"exact"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    fake.blobs[digest] = data + b" and more"
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).fetch_blob(
            oci.Descriptor(oci.BUNDLE_LAYER, digest, len(data)), tmp_path / "out", cap=MIB)
    assert "longer than" in _one_line(info.value)


def test_a_manifest_past_the_cap_is_refused(fake):
    fake.route("GET", "/manifests/", _answer(200, {"Content-Type": oci.MANIFEST},
                                             b" " * (4 * MIB + 1)))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).manifest("big")
    # the OCI distribution spec lets a registry refuse manifests past 4 MiB; rocforge reads no more
    assert "an answer past the 4194304-byte cap" in _one_line(info.value)


def test_an_endless_manifest_is_refused_at_the_cap(fake):
    def endless(request):
        h = request.handler
        h.send_response(200)
        h.send_header("Content-Type", oci.MANIFEST)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        block = b"x" * 65536
        try:
            for _ in range(1000):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
        except OSError:
            pass
        return "raw", {}, b""

    fake.route("GET", "/manifests/", endless)
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).manifest("endless")
    assert "cap" in _one_line(info.value)


def test_a_manifest_by_digest_whose_bytes_differ_is_refused(fake):
    wanted = "sha256:" + "a" * 64
    fake.route("GET", "/manifests/", _answer(200, {"Content-Type": oci.MANIFEST}, b'{"schemaVersion":2}'))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).manifest(wanted)
    assert "do not match its digest" in _one_line(info.value)


# -- garbage lists ------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b"[" * 200_000 + b"]" * 200_000,                                  # deep
    b'{"tags": [' + b'"t",' * MIB + b'"t"]}',     # past the cap
    b"\xff\xfe garbage",
    b'{"tags": "latest"}',
    b'{"tags": [1, 2]}',
    b'{"tags": ["../../etc", "ok"]}',
    b'{"tags": ["line\\nbreak"]}',
    b"[]",
])
def test_a_garbage_tags_list_is_one_line(fake, body):
    fake.route("GET", "/tags/list", _answer(200, {"Content-Type": "application/json"}, body))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    _one_line(info.value)


def test_endless_tag_pages_stop(fake, monkeypatch):
    from rocforge_build.substitute import store_registry

    monkeypatch.setattr(store_registry, "MAX_PAGES", 20)
    pages = iter(range(10 ** 6))  # each page links to a new one: only the cap stops it
    fake.route("GET", "/tags/list", lambda request: (
        200, {"Content-Type": "application/json",
              "Link": f'<{request.path}?n=1&last=x{next(pages)}>; rel="next"'},
        b'{"tags": ["a"]}'))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    assert "more than 20 pages" in _one_line(info.value)


def test_a_next_page_link_back_to_a_page_read_stops_at_once(fake):
    fake.route("GET", "/tags/list", lambda request: (
        200, {"Content-Type": "application/json", "Link": f'<{request.path}?n=1&last=x>; rel="next"'},
        b'{"tags": ["a"]}'))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    assert "links back to a page already read" in _one_line(info.value)
    assert sum(1 for r in fake.requests if "tags/list" in r.path) == 2


def test_a_tags_page_on_another_host_is_refused(fake):
    fake.route("GET", "/tags/list", _answer(200, {"Content-Type": "application/json",
                                                  "Link": '<http://203.0.113.9/v2/x/tags/list?n=2>; rel="next"'},
                                            b'{"tags": ["a"]}'))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    assert "203.0.113.9" in _one_line(info.value)


@pytest.mark.parametrize("body", [
    b"[" * 200_000 + b"]" * 200_000,
    b"not json",
    b'{"schemaVersion": 2, "mediaType": "' + oci.INDEX.encode() + b'", "manifests": [{"digest": 1}]}',
    b'{"schemaVersion": 2, "manifests": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
])
def test_a_garbage_referrers_answer_is_one_line(fake, body):
    fake.route("GET", "/referrers/", _answer(200, {"Content-Type": oci.INDEX}, body))
    with pytest.raises(StoreError) as info:
        RegistryStore(fake.store_url(), timeout=5).referrers("sha256:" + "b" * 64)
    _one_line(info.value)


def test_a_referrers_answer_that_is_not_an_index_falls_back_to_the_tag_schema(fake):
    subject = "sha256:" + "c" * 64
    entry = oci.Descriptor(oci.MANIFEST, "sha256:" + "d" * 64, 10, artifact_type=oci.SIGNATURE_TYPE)
    fake.manifests["idx"] = (oci.make_index([entry]), oci.INDEX)
    fake.tag_map[oci.fallback_tag(subject)] = "idx"
    fake.route("GET", "/referrers/", _answer(200, {"Content-Type": "text/html"}, b"<html>hi</html>"))
    assert RegistryStore(fake.store_url(), timeout=5).referrers(subject) == [entry]


def test_a_registry_with_a_referrers_api_is_asked_and_its_push_acknowledgement_kept(fake):
    """An OCI 1.1 registry: the manifest PUT answers OCI-Subject, so no tag-schema index is
    written; the referrers API's answer is what `referrers` returns."""
    store = RegistryStore(fake.store_url(), timeout=5)
    config = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    subject = store.push_manifest(oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config, layers=[]))
    fake.route("PUT", "/manifests/", lambda request: None if b'"subject"' not in request.body else (
        201, {"OCI-Subject": subject.digest}, b""))
    referrer = store.push_manifest(oci.make_manifest(artifact_type=oci.SIGNATURE_TYPE, config=config,
                                                     layers=[], subject=subject.descriptor()))
    assert oci.fallback_tag(subject.digest) not in fake.tag_map
    listed = referrer.descriptor()
    fake.route("GET", "/referrers/", _answer(200, {"Content-Type": oci.INDEX}, oci.make_index([listed])))
    assert store.referrers(subject.digest) == [listed]


# -- authentication answers -------------------------------------------------------------------------

def test_a_token_service_answering_garbage_is_one_line(fake):
    fake.route("GET", "/v2/test/", _answer(401, {
        "WWW-Authenticate": f'Bearer realm="{fake.base}/token",service="fake",scope="repository:test/repo:pull"'}))
    fake.route("GET", "^/token", _answer(200, {"Content-Type": "application/json"}, b"[" * 100_000))
    with pytest.raises((StoreUnreachable, StoreError)) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    _one_line(info.value)


def test_a_bearer_token_is_fetched_and_used(fake):
    fake.route("GET", "/v2/test/", lambda request: None if request.headers.get("Authorization") == "Bearer tok123" else (
        401, {"WWW-Authenticate": f'Bearer realm="{fake.base}/token",service="fake"'}, b""))
    fake.route("GET", "^/token", _answer(200, {"Content-Type": "application/json"}, b'{"token": "tok123"}'))
    assert RegistryStore(fake.store_url(), timeout=5).tags() == []
    assert [r.query.get("service") for r in fake.requests if r.path == "/token"] == [["fake"]]


@pytest.mark.parametrize("challenge", ['Bearer realm="file:///etc/passwd"', "Bearer", "Negotiate abc",
                                       "Bearer realm=\"http://x\r\nEvil: 1\""])
def test_an_odd_challenge_is_one_line(fake, challenge):
    fake.route("GET", "/v2/test/", _answer(401, {"WWW-Authenticate": challenge.replace("\r\n", " ")}))
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    _one_line(info.value)


def test_a_tls_registry_whose_token_realm_is_plain_http_is_refused(tmp_path, monkeypatch):
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", "pw")
    with FakeRegistry(tls) as registry, FakeRegistry() as tokens:
        registry.route("GET", "/v2/", _answer(401, {"WWW-Authenticate": f'Bearer realm="{tokens.base}/token"'}))
        with pytest.raises(StoreUnreachable) as info:
            RegistryStore(registry.store_url(), timeout=5).tags()
        assert "not an https URL" in _one_line(info.value) and tokens.requests == []


def test_a_registry_error_message_stays_on_one_line(fake):
    body = json.dumps({"errors": [{"code": "DENIED", "message": "no\nsuch\r\nthing\x1b[31m"}]}).encode()
    fake.route("GET", "/manifests/", _answer(500, {"Content-Type": "application/json"}, body))
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(fake.store_url(), timeout=5).manifest("x")
    assert _one_line(info.value).endswith("HTTP 500 (DENIED: no such thing [31m)")


@pytest.mark.parametrize(("helper", "expected"), [
    ("sleep 30", "docker-credential-rftest did not answer within 1 s"),
    ("sh -c 'sleep 30 & sleep 30'", "docker-credential-rftest did not answer within 1 s"),
    ("echo '[[[[not json'", "docker-credential-rftest answered something that is not credentials"),
    ("echo '{\"Username\": 1, \"Secret\": []}'", "docker-credential-rftest answered something that is not credentials"),
])
def test_a_credential_helper_that_hangs_or_babbles_is_one_line(fake, tmp_path, monkeypatch, helper, expected):
    import os

    from rocforge_build.errors import ConfigError

    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "docker-credential-rftest"
    program.write_text(f"#!/bin/sh\nexec {helper}\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"credsStore": "rftest"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    fake.route("GET", "/v2/", _answer(401, {"WWW-Authenticate": 'Basic realm="test"'}))
    started = time.monotonic()
    with pytest.raises((StoreUnreachable, ConfigError)) as info:
        RegistryStore(fake.store_url(), timeout=1).tags()
    assert _one_line(info.value).endswith(expected) and time.monotonic() - started < 5


def test_a_credential_helper_name_that_is_a_path_is_refused(fake, tmp_path, monkeypatch):
    from rocforge_build.errors import ConfigError

    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"credsStore": "../../tmp/evil"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    fake.route("GET", "/v2/", _answer(401, {"WWW-Authenticate": 'Basic realm="test"'}))
    with pytest.raises(ConfigError) as info:
        RegistryStore(fake.store_url(), timeout=1).tags()
    assert "not a program name" in _one_line(info.value)


def test_a_garbage_docker_config_is_one_line(fake, tmp_path, monkeypatch):
    from rocforge_build.errors import ConfigError

    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text("{not json")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    fake.route("GET", "/v2/", _answer(401, {"WWW-Authenticate": 'Basic realm="test"'}))
    with pytest.raises(ConfigError) as info:
        RegistryStore(fake.store_url(), timeout=1).tags()
    _one_line(info.value)


def test_a_push_refused_to_an_anonymous_token_says_so(fake):
    """Pulls work with an anonymous token; a push needs more than the token service gives."""
    def guarded(request):
        if request.method in ("GET", "HEAD") and request.headers.get("Authorization") == "Bearer anon":
            return None
        return 401, {"WWW-Authenticate": f'Bearer realm="{fake.base}/token",service="fake"'}, b""

    for method in ("GET", "HEAD", "POST", "PUT"):
        fake.route(method, "^/v2/test/", guarded)
    fake.route("GET", "^/token", _answer(200, {"Content-Type": "application/json"}, b'{"token": "anon"}'))
    store = RegistryStore(fake.store_url(), timeout=5)
    assert store.tags() == []
    with pytest.raises(StoreUnreachable) as info:
        store.push_blob_bytes(b"x", oci.JSON_LAYER)
    assert _one_line(info.value).endswith("the registry refused anonymous access (HTTP 401)")
    assert "ROCFORGE_STORE_USERNAME" in info.value.hint


# -- credentials a registry repeats -------------------------------------------------------------

SECRET = "hunter2-s3cret"
BASIC = "Y2k6aHVudGVyMi1zM2NyZXQ="  # base64 of ci:hunter2-s3cret


@pytest.mark.parametrize("echoed", [
    f"Authorization: Basic {BASIC}",
    "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjaSJ9.c2lnbmF0dXJl",
    f"bad credentials for ci:{SECRET}",
    f"request headers: {{'Authorization': 'Basic {BASIC}'}}",
])
def test_a_403_that_repeats_the_credentials_has_them_redacted(fake, monkeypatch, echoed):
    """A registry's 403 text repeated the Authorization header (and so the password) into the
    error line; every error line goes through the one redaction (credentials.py) where it is raised."""
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", SECRET)

    def refuse(request):
        if request.headers.get("Authorization") != f"Basic {BASIC}":
            return 401, {"WWW-Authenticate": 'Basic realm="test"'}, b""
        body = json.dumps({"errors": [{"code": "DENIED", "message": f"denied: {echoed}"}]}).encode()
        return 403, {"Content-Type": "application/json"}, body

    fake.route("GET", "/tags/list", refuse)
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(fake.store_url(), timeout=5).tags()
    message = _one_line(info.value)
    assert "access refused (HTTP 403) (DENIED: denied: " in message and "[redacted]" in message
    for secret in (SECRET, BASIC, "eyJhbGciOiJSUzI1NiJ9"):
        assert secret not in message and secret not in str(info.value)


def test_the_cli_line_of_a_403_with_a_bearer_echo_holds_no_token(fake, monkeypatch, tmp_path, capsys):
    """The same through `rocforge store list`: the token service's token, repeated in the 403
    body, never reaches the terminal."""
    token = "tok-4f2a9c-0123456789abcdef"
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "data"))

    def guarded(request):
        if request.headers.get("Authorization") != f"Bearer {token}":
            return 401, {"WWW-Authenticate": f'Bearer realm="{fake.base}/token",service="fake"'}, b""
        body = json.dumps({"errors": [{"code": "DENIED", "message": f"token {token} may not read"}]})
        return 403, {"Content-Type": "application/json"}, body.encode()

    fake.route("GET", "/tags/list", guarded)
    fake.route("GET", "^/token", _answer(200, {"Content-Type": "application/json"},
                                        json.dumps({"token": token}).encode()))
    from rocforge_build import cli

    assert cli.main(["store", "list", fake.store_url()]) != 0
    out = capsys.readouterr()
    assert "access refused (HTTP 403)" in out.err and "[redacted]" in out.err, out.err
    assert token not in out.err + out.out
