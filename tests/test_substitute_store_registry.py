"""The registry store against a real registry: Debian's docker-registry (distribution 2.8.2),
which has no referrers API, over plain HTTP and over TLS with a CA made here and htpasswd basic
auth; a drop mid-blob comes from a proxy in front of it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
import requests
from needs import needs, require
from registry_server import FaultProxy, clear_store_environment, make_tls, start_registry

from rocforge_build.errors import UsageError
from rocforge_build.substitute import oci, stores
from rocforge_build.substitute.oci import NotFound, StoreError, StoreUnreachable
from rocforge_build.substitute.store_registry import RegistryStore, parse_url


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    clear_store_environment(monkeypatch)


@pytest.fixture
def registry(tmp_path):
    require("docker-registry")
    with start_registry(tmp_path) as reg:
        yield reg


@pytest.fixture
def tls_registry(tmp_path, monkeypatch):
    """docker-registry over TLS (a CA of this test) with basic auth: user ci, password s3cret."""
    require("docker-registry", "htpasswd")
    tls = make_tls(tmp_path / "tls")
    with start_registry(tmp_path, tls=tls, users={"ci": "s3cret"}) as reg:
        reg.tls = tls
        yield reg


def _one_line(exc: Exception) -> str:
    message = exc.message
    assert "\n" not in message and len(message) < 400, message
    return message


def _build(store: oci.Store, payload: bytes = b"bundle bytes " * 1000, tag: str | None = "build-1"):
    """A rocforge-like artifact: a custom artifactType and config media type, one layer."""
    config = store.push_blob_bytes(b'{"key":"k1"}', oci.KEY_CONFIG)
    layer = store.push_blob_bytes(payload, oci.BUNDLE_LAYER)
    data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config, layers=[layer],
                             annotations={"org.example.note": "first"})
    return store.push_manifest(data, tag=tag), config, layer


def _referrer(store: oci.Store, subject: oci.Manifest, artifact_type: str, body: bytes) -> oci.Manifest:
    empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    layer = store.push_blob_bytes(body, oci.JSON_LAYER)
    return store.push_manifest(oci.make_manifest(artifact_type=artifact_type, config=empty,
                                                 layers=[layer], subject=subject.descriptor()))


# -- URLs ------------------------------------------------------------------------------------

def test_urls_name_scheme_host_and_repository():
    assert parse_url("oci://ghcr.io/org/rocforge-cache") == ("https", "ghcr.io", "org/rocforge-cache")
    assert parse_url("oci+http://127.0.0.1:5000/team/cache") == ("http", "127.0.0.1:5000", "team/cache")
    assert parse_url("oci://Registry.Example:8443/a/b_c/d-e/") == ("https", "registry.example:8443", "a/b_c/d-e")
    assert parse_url("oci://[::1]:5000/x") == ("https", "[::1]:5000", "x")


@pytest.mark.parametrize("url", [
    "oci://ghcr.io/Org/Cache",       # the distribution spec's names are lowercase
    "oci://ghcr.io/",                 # no repository
    "oci://ghcr.io:0/x", "oci://ghcr.io:99999/x", "oci://ghcr.io:http/x",
    "oci://ghcr.io/x?tag=1", "oci://ghcr.io/x#y", "oci://ghcr.io/a b", "oci://gh\ncr.io/x",
    "https://ghcr.io/x", "oci:/ghcr.io/x", "oci://ghcr.io/../x", "oci://ghcr.io/x//y",
    "oci://-bad-.example/x",
])
def test_a_bad_url_is_one_usage_line(url):
    with pytest.raises(UsageError) as info:
        RegistryStore(url, timeout=1)
    _one_line(info.value)


def test_credentials_in_the_url_are_refused_and_never_repeated():
    with pytest.raises(UsageError) as info:
        RegistryStore("oci://ci:hunter2@ghcr.io/org/cache", timeout=1)
    assert "hunter2" not in str(info.value) and "ci:" not in str(info.value)
    assert "ROCFORGE_STORE_USERNAME" in str(info.value)


def test_open_store_gives_a_registry_store_for_both_schemes():
    with stores.open_store("oci+http://127.0.0.1:5000/team/cache", timeout=3) as store:
        assert isinstance(store, RegistryStore) and store.url == "oci+http://127.0.0.1:5000/team/cache"
    with stores.open_store("oci://ghcr.io/org/cache", timeout=3) as store:
        assert store.base == "https://ghcr.io/v2/org/cache"


# -- a real registry over plain HTTP ------------------------------------------------------------

def test_round_trip_through_a_real_registry(registry):
    """Pushed bytes come back identical, by tag and by digest; the registry keeps the custom
    artifactType and config media type; referrers are found through the tag schema (this
    registry answers the referrers API with 404)."""
    assert registry.start_seconds < 5
    with FaultProxy(registry.base) as proxy:  # it counts the requests
        store = RegistryStore(proxy.store_url("team/cache"), timeout=10)
        assert store.tags() == []  # nothing pushed yet: the repository does not exist
        man, config, layer = _build(store)
        by_tag, by_digest = store.manifest("build-1"), store.manifest(man.digest)
        assert by_tag.data == by_digest.data == man.data
        assert by_tag.digest == "sha256:" + hashlib.sha256(man.data).hexdigest()
        assert by_tag.artifact_type == oci.BUILD_TYPE and by_tag.config.media_type == oci.KEY_CONFIG
        assert by_tag.layers == (layer,) and by_tag.annotations == {"org.example.note": "first"}
        assert store.read_blob(config) == b'{"key":"k1"}'
        assert store.has_blob(layer.digest) and not store.has_blob("sha256:" + "0" * 64)

        signature = _referrer(store, man, oci.SIGNATURE_TYPE, b'{"sig":1}')
        evidence = _referrer(store, man, oci.EVIDENCE_TYPE, b'{"ok":true}')
        assert requests.get(f"{registry.base}/v2/team/cache/referrers/{man.digest}", timeout=5).status_code == 404
        listed = store.referrers(man.digest)
        assert [d.digest for d in listed] == [signature.digest, evidence.digest]
        assert [d.artifact_type for d in listed] == [oci.SIGNATURE_TYPE, oci.EVIDENCE_TYPE]
        assert [d.digest for d in store.referrers(man.digest, oci.EVIDENCE_TYPE)] == [evidence.digest]
        assert store.referrers(signature.digest) == []
        # the referrers API was asked once, then the tag schema alone
        assert [p for _, p in proxy.seen if "/referrers/" in p] == [f"/v2/team/cache/referrers/{man.digest}"]
        assert sorted(store.tags()) == ["build-1", oci.fallback_tag(man.digest)]
        # pushing the same referrer again leaves one entry
        _referrer(store, man, oci.SIGNATURE_TYPE, b'{"sig":1}')
        assert len(store.referrers(man.digest)) == 2


def test_misses_are_not_found(registry):
    store = RegistryStore(registry.store_url("team/cache"), timeout=10)
    _build(store)
    with pytest.raises(NotFound) as info:
        store.manifest("no-such-tag")
    assert _one_line(info.value) == f"{store.url}: no manifest no-such-tag"
    with pytest.raises(NotFound):
        store.read_blob(oci.Descriptor(oci.JSON_LAYER, "sha256:" + "1" * 64, 3))


def test_tags_come_in_pages(registry, monkeypatch):
    """The registry pages its tags list (Link rel="next") when asked for pages of 2."""
    from rocforge_build.substitute import store_registry

    monkeypatch.setattr(store_registry, "TAGS_PAGE", 2)
    store = RegistryStore(registry.store_url("team/cache"), timeout=10)
    man, _, _ = _build(store)
    for tag in ("b", "c", "d", "e"):
        store.push_manifest(man.data, tag=tag)
    assert sorted(store.tags()) == ["b", "build-1", "c", "d", "e"]


def test_a_blob_dropped_mid_layer_is_resumed(registry, tmp_path):
    """The proxy cuts the first GET after 100000 bytes; the second GET asks from there."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    with FaultProxy(registry.base) as proxy:
        store = RegistryStore(proxy.store_url("team/cache"), timeout=10)
        _, _, layer = _build(store, payload)
        proxy.drop_blobs_after(100_000, times=1)
        store.fetch_blob(layer, tmp_path / "layer", cap=1 << 30)
        assert (tmp_path / "layer").read_bytes() == payload
        assert [h.get("Range") for h in proxy.blob_gets] == [None, "bytes=100000-"]


def test_a_large_layer_comes_as_parallel_ranges_resumed_where_one_drops(registry, tmp_path, monkeypatch):
    """Above the threshold (forced low) and slower than RANGED_ENOUGH (forced high), the real
    registry answers 256 KiB ranges on 3 streams after the first 256 KiB as one stream, which
    the proxy cuts after 1000 bytes and which is resumed from there."""
    monkeypatch.setattr(oci, "RANGED_THRESHOLD", 1)
    monkeypatch.setattr(oci, "RANGED_PIECE", 256 << 10)
    monkeypatch.setattr(oci, "RANGED_STREAMS", 3)
    monkeypatch.setattr(oci, "RANGED_ENOUGH", float("inf"))  # loopback is fast: ranges all the same
    payload = hashlib.sha256(b"seed").digest() * (33 * 1024) + b"end"  # 1,081,347 bytes: 5 ranges
    with FaultProxy(registry.base) as proxy:
        store = RegistryStore(proxy.store_url("team/cache"), timeout=10)
        _, _, layer = _build(store, payload)
        proxy.drop_blobs_after(1000, times=1)
        store.fetch_blob(layer, tmp_path / "layer", cap=1 << 30)
        assert (tmp_path / "layer").read_bytes() == payload
        first, resumed, *ranged = [h.get("Range") for h in proxy.blob_gets]
        assert (first, resumed) == (None, "bytes=1000-")  # one stream for the first 256 KiB
        assert sorted(ranged) == sorted(f"bytes={at}-{min(at + (256 << 10), len(payload)) - 1}"
                                        for at in range(256 << 10, len(payload), 256 << 10))


def test_a_blob_that_keeps_dropping_is_one_line_after_the_retries(registry, tmp_path):
    payload = b"z" * 300_000
    with FaultProxy(registry.base) as proxy:
        store = RegistryStore(proxy.store_url("team/cache"), timeout=10)
        _, _, layer = _build(store, payload)
        proxy.drop_blobs_after(1000, times=10)
        with pytest.raises(StoreUnreachable) as info:
            store.fetch_blob(layer, tmp_path / "layer", cap=1 << 30, retries=3)
        assert "team/cache" in _one_line(info.value)
        assert not (tmp_path / "layer").exists()
        assert len(proxy.blob_gets) == 4  # the first GET and three resumes


# -- a real registry over TLS with basic auth ---------------------------------------------------

def test_tls_and_the_right_password(tls_registry, monkeypatch, capfd):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", "s3cret")
    store = RegistryStore(tls_registry.store_url("team/cache"), timeout=10)
    assert store.url.startswith("oci://127.0.0.1:")
    man, _, _ = _build(store)
    assert store.manifest("build-1").data == man.data
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("password", ["wrong", "s3cret\n"])
def test_tls_and_a_wrong_password_is_one_line(tls_registry, monkeypatch, capfd, password):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", password)
    store = RegistryStore(tls_registry.store_url("team/cache"), timeout=10)
    with pytest.raises(StoreUnreachable) as info:
        store.tags()
    message = _one_line(info.value)
    assert message.endswith("refused the credentials (HTTP 401)") and password.strip() not in message
    assert capfd.readouterr() == ("", "")  # oras-py's own log lines are not shown


def test_tls_without_credentials_says_how_to_give_them(tls_registry, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags()
    assert "asks for a username and password" in _one_line(info.value)
    assert "ROCFORGE_STORE_USERNAME" in info.value.hint


def test_docker_config_credentials_are_used(tls_registry, monkeypatch, tmp_path):
    config = tmp_path / "docker"
    config.mkdir()
    auth = base64.b64encode(b"ci:s3cret").decode()
    (config / "config.json").write_text(json.dumps({"auths": {tls_registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    assert RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags() == []



def test_docker_config_set_means_only_that_file(tls_registry, monkeypatch, tmp_path):
    """docker reads $DOCKER_CONFIG/config.json alone when the variable is set (docs.docker.com,
    docker CLI configuration): credentials in ~/.docker/config.json must not be sent then."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_docker = Path(os.path.expanduser("~")) / ".docker"
    home_docker.mkdir(parents=True)
    auth = base64.b64encode(b"ci:s3cret").decode()
    (home_docker / "config.json").write_text(json.dumps({"auths": {tls_registry.host: {"auth": auth}}}))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    assert RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags() == []  # the default file
    elsewhere = tmp_path / "docker-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text(json.dumps({"auths": {}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(elsewhere))
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags()
    assert "asks for a username and password" in _one_line(info.value)

def test_an_unknown_ca_is_one_tls_line(tls_registry, monkeypatch):
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", "s3cret")
    with pytest.raises(StoreUnreachable) as info:
        RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags()
    assert "TLS failed" in _one_line(info.value) and "certificate verify failed" in info.value.message
    assert "REQUESTS_CA_BUNDLE" in info.value.hint


def test_ssl_cert_file_names_a_private_ca(tls_registry, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_registry.tls.ca))
    monkeypatch.setenv("ROCFORGE_STORE_USERNAME", "ci")
    monkeypatch.setenv("ROCFORGE_STORE_PASSWORD", "s3cret")
    assert RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags() == []


@needs("docker-registry")
def test_plain_http_to_a_tls_registry_is_one_line(tmp_path):
    tls = make_tls(tmp_path / "tls")
    with start_registry(tmp_path, tls=tls) as reg:
        with pytest.raises(StoreError) as info:
            RegistryStore(f"oci+http://{reg.host}/team/cache", timeout=5).tags()
    assert _one_line(info.value).endswith("tags: HTTP 400")
    assert info.value.hint == "the registry speaks TLS: oci://HOST[:PORT]/REPO"


def _credential_helper(directory, body: str):
    """A docker credential helper `docker-credential-rftest` on PATH whose `get` runs `body`."""
    directory.mkdir(exist_ok=True)
    helper = directory / "docker-credential-rftest"
    helper.write_text(f"#!/bin/sh\nread host\n{body}\n")
    helper.chmod(0o755)
    return helper


def test_a_docker_credential_helper_is_asked(tls_registry, monkeypatch, tmp_path):
    _credential_helper(tmp_path / "bin", """[ "$1" = get ] || exit 2
case "$host" in 127.0.0.1:*) printf '{"ServerURL":"%s","Username":"ci","Secret":"s3cret"}' "$host";;
*) echo "credentials not found" >&2; exit 1;; esac""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"credHelpers": {tls_registry.host: "rftest"}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_registry.tls.ca))
    assert RegistryStore(tls_registry.store_url("team/cache"), timeout=10).tags() == []
