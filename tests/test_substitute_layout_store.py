"""substitute/layout_store.py: the OCI image layout as a store on its three carriers, each real —
a directory, a TLS static web server on 127.0.0.1 with a CA made here (read-only), and S3 through
moto's server — with the same round trip: a blob and a tagged manifest in, read back by tag and by
digest, the tag listed, a referrer found through the tag schema, and a layer resumed after the
connection drops.  The directory store's safety: no link followed, no FIFO opened, nothing written
outside it, two publishers at once losing neither's tag."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from moto_s3 import moto_s3, use_s3
from registry_server import make_tls

from rocforge_build.substitute import oci
from rocforge_build.substitute.layout_store import DirectoryStore
from rocforge_build.substitute.oci import Descriptor, NotFound, StoreError
from rocforge_build.substitute.stores import open_store

SUBJECT_TYPE = "application/vnd.example.subject.v1"


def _round_trip(store, tmp_path: Path) -> None:
    """What every writable layout carrier must do (the answers are the OCI image-layout spec's)."""
    layer = os.urandom(300_000)
    config = store.push_blob_bytes(b'{"a":1}', oci.KEY_CONFIG)
    src = tmp_path / "layer.bin"
    src.write_bytes(layer)
    desc = store.push_blob_file(src, oci.BUNDLE_LAYER)
    assert desc.digest == "sha256:" + hashlib.sha256(layer).hexdigest() and desc.size == len(layer)
    data = oci.make_manifest(artifact_type=SUBJECT_TYPE, config=config, layers=[desc])
    man = store.push_manifest(data, tag="v1")
    assert store.manifest("v1").data == data and store.manifest(man.digest).digest == man.digest
    assert "v1" in store.tags()
    out = tmp_path / "out.bin"
    store.fetch_blob(desc, out, cap=1 << 30)
    assert out.read_bytes() == layer
    # a referrer (an OCI 1.1 manifest with a subject) is listed through the referrers tag schema
    empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    ref = store.push_manifest(oci.make_manifest(artifact_type=oci.EVIDENCE_TYPE, config=empty, layers=[],
                                                subject=man.descriptor()))
    assert [d.digest for d in store.referrers(man.digest)] == [ref.digest]
    assert store.referrers(man.digest, oci.SIGNATURE_TYPE) == []
    with pytest.raises(NotFound):
        store.manifest("v2")


def test_directory_store_round_trip_in_the_oci_image_layout(tmp_path):
    root = tmp_path / "store"
    with open_store(root.as_uri()) as store:
        _round_trip(store, tmp_path)
    assert json.loads((root / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((root / "index.json").read_text())
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.INDEX
    names = {m.get("annotations", {}).get(oci.REF_NAME) for m in index["manifests"]}
    assert "v1" in names and any(n and n.startswith("sha256-") for n in names)
    for m in index["manifests"]:  # every manifest the index names is a blob of the layout
        blob = root / "blobs" / "sha256" / m["digest"][7:]
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == m["digest"][7:]


def test_a_blob_changed_on_disk_is_refused_by_its_digest(tmp_path):
    root = tmp_path / "store"
    with open_store(root.as_uri()) as store:
        desc = store.push_blob_bytes(b"x" * 1000, oci.BUNDLE_LAYER)
        (root / "blobs" / "sha256" / desc.digest[7:]).write_bytes(b"y" * 1000)
        with pytest.raises(StoreError, match="do not match its digest"):
            store.fetch_blob(desc, tmp_path / "out", cap=1 << 20)
        assert not (tmp_path / "out").exists()
        with pytest.raises(StoreError, match="past the 10-byte cap"):
            store.fetch_blob(desc, tmp_path / "out2", cap=10)


@pytest.mark.parametrize("where", ["index.json", "blobs", "blobs/sha256"])
def test_a_link_where_a_store_file_should_be_is_refused_and_nothing_goes_through_it(tmp_path, where):
    root = tmp_path / "store"
    with open_store(root.as_uri()) as store:
        store.push_manifest(oci.make_manifest(artifact_type=SUBJECT_TYPE,
                                              config=store.push_blob_bytes(b"{}", oci.EMPTY), layers=[]),
                            tag="v1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "index.json").write_text("theirs")
    path = root / where
    if path.is_dir():
        os.rename(path, tmp_path / "moved")
    else:
        path.unlink()
    os.symlink(outside / "index.json" if where == "index.json" else outside, path)
    before = sorted(p.name for p in outside.iterdir())
    with open_store(root.as_uri()) as store, pytest.raises(StoreError) as err:
        store.push_blob_bytes(b"new", oci.BUNDLE_LAYER) if where != "index.json" else store.tags()
    assert "symbolic link" in err.value.message or "not a" in err.value.message
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "index.json").read_text() == "theirs"


def test_a_fifo_for_index_json_is_refused_without_waiting(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    os.mkfifo(root / "index.json")
    code = ("from rocforge_build.substitute.stores import open_store\n"
            "from rocforge_build.substitute.oci import StoreError\n"
            f"s = open_store({root.as_uri()!r})\n"
            "try:\n    s.tags()\nexcept StoreError as e:\n    print(e.message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0 and "index.json is not a regular file" in out.stdout, out.stderr


def test_two_publishers_at_once_lose_neither_tag(tmp_path):
    root = tmp_path / "store"
    code = ("import sys\nfrom rocforge_build.substitute import oci\n"
            "from rocforge_build.substitute.stores import open_store\n"
            f"s = open_store({root.as_uri()!r})\n"
            "for i in range(20):\n"
            "    c = s.push_blob_bytes(f'{{\"n\":\"{sys.argv[1]}{i}\"}}'.encode(), oci.KEY_CONFIG)\n"
            f"    s.push_manifest(oci.make_manifest(artifact_type={SUBJECT_TYPE!r}, config=c, layers=[]),"
            " tag=f'{sys.argv[1]}-{i}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, name]) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with open_store(root.as_uri()) as store:
        assert {t for t in store.tags()} == {f"{n}-{i}" for n in "ab" for i in range(20)}


def test_a_relative_or_remote_file_url_is_one_line():
    from rocforge_build.errors import UsageError

    with pytest.raises(UsageError, match="on this machine"):
        open_store("file://server/share")
    with pytest.raises(UsageError):
        DirectoryStore(Path("relative"), "file:relative")


# -- HTTPS: a static server over TLS with this test's CA ------------------------------------------

class _Quiet(SimpleHTTPRequestHandler):
    drop_after: dict = {}
    ranges: list = []  # the Range of each ranged GET

    def log_message(self, *a):
        pass

    def do_GET(self):
        cut = self.drop_after.pop(self.path, None)
        if cut is not None:  # send the headers and `cut` bytes of the file, then hang up
            path = Path(self.translate_path(self.path))
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        if "Range" in self.headers:  # a static server's Range, as nginx answers it
            path = Path(self.translate_path(self.path))
            first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
            whole = path.read_bytes()
            start, end = int(first), min(int(last or len(whole) - 1), len(whole) - 1)
            self.ranges.append(self.headers["Range"])
            data = whole[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(whole)}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


@contextlib.contextmanager
def _tls_server(directory: Path, tls) -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(directory)))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert, tls.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_https_store_reads_a_layout_and_resumes_a_dropped_layer(tmp_path, monkeypatch):
    root = tmp_path / "site" / "store"
    root.parent.mkdir()
    with open_store(root.as_uri()) as store:
        layer = os.urandom(2_000_000)
        desc = store.push_blob_bytes(layer, oci.BUNDLE_LAYER)
        data = oci.make_manifest(artifact_type=SUBJECT_TYPE, config=store.push_blob_bytes(b"{}", oci.EMPTY),
                                 layers=[desc])
        man = store.push_manifest(data, tag="v1")
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    with _tls_server(tmp_path / "site", tls) as base:
        with open_store(f"{base}/store", timeout=5) as web:
            assert not web.writable and web.manifest("v1").digest == man.digest
            _Quiet.drop_after[f"/store/blobs/sha256/{desc.digest[7:]}"] = 700_000
            web.fetch_blob(desc, tmp_path / "out", cap=1 << 30)
            assert (tmp_path / "out").read_bytes() == layer
            with pytest.raises(StoreError, match="read-only"):
                web.push_manifest(data, tag="v2")
        monkeypatch.delenv("REQUESTS_CA_BUNDLE")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
        with open_store(f"{base}/store", timeout=5) as web, pytest.raises(oci.StoreUnreachable):
            web.tags()  # a server whose CA is not trusted is not read


def _small_ranges(monkeypatch) -> int:
    """A large layer's parallel ranges (oci._RangedPull) for a blob of a few hundred kB."""
    monkeypatch.setattr(oci, "RANGED_THRESHOLD", 1)
    monkeypatch.setattr(oci, "RANGED_PIECE", 64 << 10)
    monkeypatch.setattr(oci, "RANGED_STREAMS", 3)
    monkeypatch.setattr(oci, "RANGED_ENOUGH", float("inf"))
    return 64 << 10


def test_https_store_pulls_a_large_layer_as_parallel_ranges(tmp_path, monkeypatch):
    piece = _small_ranges(monkeypatch)
    root = tmp_path / "site" / "store"
    root.parent.mkdir()
    layer = os.urandom(300_000)
    with open_store(root.as_uri()) as store:
        desc = store.push_blob_bytes(layer, oci.BUNDLE_LAYER)
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    monkeypatch.setattr(_Quiet, "ranges", [])
    with _tls_server(tmp_path / "site", tls) as base, open_store(f"{base}/store", timeout=5) as web:
        web.fetch_blob(desc, tmp_path / "out", cap=1 << 30)
    assert (tmp_path / "out").read_bytes() == layer
    assert sorted(_Quiet.ranges) == sorted(f"bytes={at}-{min(at + piece, len(layer)) - 1}"
                                           for at in range(piece, len(layer), piece))


# -- S3: moto's server on 127.0.0.1 ---------------------------------------------------------------

@pytest.fixture
def s3_endpoint(monkeypatch):
    with moto_s3("builds") as endpoint:
        use_s3(monkeypatch, endpoint)
        yield endpoint


def test_s3_store_round_trip_through_moto(tmp_path, s3_endpoint):
    with open_store("s3://builds/team/llama") as store:
        _round_trip(store, tmp_path)
    listing = urllib.request.urlopen(f"{s3_endpoint}/builds?prefix=team/llama/", timeout=5).read().decode()
    assert "<Key>team/llama/oci-layout</Key>" in listing and "<Key>team/llama/index.json</Key>" in listing



def test_two_publishers_at_once_into_s3_lose_neither_tag(tmp_path, s3_endpoint):
    """S3 has no lock: index.json is replaced only while it is the one read (a conditional write
    on its ETag), so both publishers' tags survive; a plain overwrite lost some of them here."""
    code = ("import sys\nfrom rocforge_build.substitute import oci\n"
            "from rocforge_build.substitute.stores import open_store\n"
            "s = open_store('s3://builds/race')\n"
            "for i in range(12):\n"
            "    c = s.push_blob_bytes(f'{{\"n\":\"{sys.argv[1]}{i}\"}}'.encode(), oci.KEY_CONFIG)\n"
            f"    s.push_manifest(oci.make_manifest(artifact_type={SUBJECT_TYPE!r}, config=c, layers=[]),"
            " tag=f'{sys.argv[1]}-{i}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, name]) for name in ("a", "b", "c")]
    assert [p.wait(timeout=180) for p in procs] == [0, 0, 0]
    with open_store("s3://builds/race") as store:
        assert set(store.tags()) == {f"{n}-{i}" for n in "abc" for i in range(12)}

def test_a_publisher_that_always_loses_the_index_race_gives_up_on_time_with_one_line(
        tmp_path, s3_endpoint, monkeypatch):
    """Another publisher tags a build before every index write of ours, so each of ours is refused
    (moto's real 412 for the stale If-Match): publishing keeps trying for its patience, not a count
    of losses (three busy publishers lost 6 in a row here), then stops with one line, and the index
    holds every tag the other publisher wrote."""
    from rocforge_build.substitute import layout_store
    from rocforge_build.substitute.oci import StoreUnreachable

    monkeypatch.setattr(layout_store, "INDEX_PATIENCE", 1.5)
    with open_store("s3://builds/busy") as store, open_store("s3://builds/busy") as rival:
        manifest = oci.make_manifest(artifact_type=SUBJECT_TYPE,
                                     config=store.push_blob_bytes(b'{"n":1}', oci.KEY_CONFIG), layers=[])
        real_put = store.client.put_object
        rival_tags = []

        def put_after_a_rival(**kwargs):
            if kwargs["Key"].endswith("index.json"):
                rival_tags.append(f"rival-{len(rival_tags)}")
                rival.push_manifest(manifest, tag=rival_tags[-1])
            return real_put(**kwargs)

        monkeypatch.setattr(store.client, "put_object", put_after_a_rival)
        started = time.monotonic()
        with pytest.raises(StoreUnreachable) as info:
            store.push_manifest(manifest, tag="v1")
        took = time.monotonic() - started
        assert str(info.value).startswith("s3://builds/busy: index.json kept changing under this publish "
                                          "(lost the race ")
        assert len(rival_tags) >= 3 and 0.5 <= took < 1.5 + 2 * layout_store.INDEX_BACKOFF_CAP + 5
        assert sorted(rival.tags()) == sorted(rival_tags)


def test_descriptor_sizes_come_before_bytes(tmp_path):
    """A layer declared past the cap is refused before a byte is read."""
    with open_store((tmp_path / "s").as_uri()) as store:
        huge = Descriptor(oci.BUNDLE_LAYER, "sha256:" + "0" * 64, 1 << 40)
        with pytest.raises(StoreError, match="past the"):
            store.fetch_blob(huge, tmp_path / "out", cap=1 << 30)


def test_a_write_that_fails_mid_layer_is_its_own_error_and_leaves_no_file(tmp_path, monkeypatch):
    """The layer is hashed and written on a thread beside the download: a full disk there (ENOSPC
    from the write) must still reach the caller as that error, and the partial file be removed."""
    import errno

    store = open_store((tmp_path / "store").as_uri())
    desc = store.push_blob_bytes(os.urandom(3 << 20), "application/octet-stream")
    real_write = oci._HashingWriter._drain

    def failing_drain(self):
        def write(chunk):
            raise OSError(errno.ENOSPC, "No space left on device")
        self.out = type("Full", (), {"write": staticmethod(write)})()
        real_write(self)

    monkeypatch.setattr(oci._HashingWriter, "_drain", failing_drain)
    dest = tmp_path / "layer"
    with pytest.raises(OSError) as info:
        store.fetch_blob(desc, dest, cap=1 << 30)
    assert info.value.errno == errno.ENOSPC
    assert not dest.exists()


def test_s3_store_pulls_a_large_layer_as_parallel_ranges(tmp_path, s3_endpoint, monkeypatch):
    _small_ranges(monkeypatch)
    layer = os.urandom(300_000)
    with open_store("s3://builds/team/big") as store:
        desc = store.push_blob_bytes(layer, oci.BUNDLE_LAYER)
        asked = []
        real = store.client.get_object

        def get_object(**kw):
            asked.append(kw.get("Range"))
            return real(**kw)

        monkeypatch.setattr(store.client, "get_object", get_object)
        store.fetch_blob(desc, tmp_path / "out", cap=1 << 30)
        assert (tmp_path / "out").read_bytes() == layer
        assert asked[0] is None and len(asked) == 1 + 4  # one stream for 64 KiB, then 4 ranges
        evil = bytearray(layer)
        evil[-1] ^= 1
        store.client.put_object(Bucket="builds", Key=f"team/big/{store._blob(desc.digest)}", Body=bytes(evil))
        with pytest.raises(StoreError, match="do not match its digest"):
            store.fetch_blob(desc, tmp_path / "evil", cap=1 << 30)
        assert not (tmp_path / "evil").exists()
