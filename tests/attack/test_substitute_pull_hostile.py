"""A second machine pulling from a hostile substitute store, through the real CLI: a first machine
builds the fixture recipe and publishes it signed; each test forges the store (its bytes, its
manifests, its referrers, its files) and the second machine, which trusts only the publisher's
key, builds with --substitute-only over a previous build of its own.  The right answer each time
is one `rocforge: error:` line (or an untrusted attachment ignored), no traceback, no hang, and
the previous build and everything outside the prefix's directory untouched."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from trust_helpers import one_error, python, rocforge, snapshot

from rocforge_build.substitute import artifact, oci, publishers, signing
from rocforge_build.substitute.stores import open_store


class Machine:
    """One machine's own config, cache and data dirs, run through the CLI in a child process."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {"ROCFORGE_CONFIG_DIR": str(root / "config"), "ROCFORGE_CACHE_DIR": str(root / "cache"),
                    "ROCFORGE_DATA_DIR": str(root / "data"), "HOME": str(root)}
        (root / "config").mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, timeout: int = 60):
        return rocforge(*args, env=self.env, timeout=timeout)

    def run_wrapped(self, wrap: tuple[str, ...], *args: str, timeout: int = 60):
        return rocforge(*args, env=self.env, wrap=wrap, timeout=timeout)

    def configure(self, **substitute: object) -> None:
        lines = ["[substitute]"] + [f"{k} = {json.dumps(v)}" for k, v in substitute.items()]
        (self.root / "config" / "config.toml").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The first machine's published build: (store dir, recipe, public key line, secret key path, tag)."""
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    top = tmp_path_factory.mktemp("first")
    repo = git_repo(top / "repo")
    recipe = recipe_copy(top / "r", **{"file:///nonexistent/fixture.git": f"file://{repo}"})
    a = Machine(top / "a")
    built = a("build", str(recipe), "--backend", "cpu", "--no-substitutes", "--prefix", str(top / "a" / "pfx"))
    assert built.returncode == 0, built.stderr
    generated = a("key", "generate")
    assert generated.returncode == 0, generated.stderr
    public = generated.stdout.split()[0]
    store = top / "store"
    published = a("publish", str(top / "a" / "pfx"), "--to", f"file://{store}", "--unverified")
    assert published.returncode == 0, published.stderr
    tag = published.stdout.split()[0]
    return store, recipe, public, top / "a" / "config" / "keys" / "rocforge.key", tag


class Second:
    """The second machine with a previous build at its prefix (pulled from the untouched store),
    and a copy of the store for the test to forge."""

    def __init__(self, tmp_path: Path, first):
        pristine, self.recipe, self.public, self.secret, self.tag = first
        self.store = tmp_path / "store"
        shutil.copytree(pristine, self.store)
        self.url = f"file://{self.store}"
        self.machine = Machine(tmp_path / "b")
        self.prefix = tmp_path / "b" / "builds" / "fixture"
        self.machine.configure(stores=[self.url], trusted_keys=[self.public], timeout=5)
        done = self.build()
        assert done.returncode == 0 and "installed" in done.stderr, done.stderr
        self.before = snapshot(self.prefix)
        self.siblings = sorted(p.name for p in self.prefix.parent.iterdir())
        self.tmp_path = tmp_path
        self.outside = self._outside()

    def build(self, *extra: str, timeout: int = 60):
        return self.machine("build", str(self.recipe), "--backend", "cpu", "--substitute-only", "--force",
                            "--prefix", str(self.prefix), *extra, timeout=timeout)

    def refused(self, *extra: str, timeout: int = 60) -> str:
        """The one error line of a --substitute-only build, the previous build left as it was."""
        res = self.build(*extra, timeout=timeout)
        line = one_error(res, 9)
        self.untouched()
        return line

    def _outside(self) -> list[str]:
        """Every path of the test's directory but the forged store's and the second machine's
        own config, cache and data (where a pull is allowed to write)."""
        return sorted(rel for rel, _ in _walk(self.tmp_path)
                      if not rel.startswith(("store/", "b/config/", "b/cache/", "b/data/", "b/builds/fixture/")))

    def untouched(self) -> None:
        assert snapshot(self.prefix) == self.before
        assert sorted(p.name for p in self.prefix.parent.iterdir()) == self.siblings
        assert self._outside() == self.outside

    def open(self) -> oci.Store:
        return open_store(self.url)

    def build_manifest(self, store: oci.Store) -> oci.Manifest:
        return store.manifest(self.tag)

    def blob_path(self, digest: str) -> Path:
        return self.store / "blobs" / "sha256" / digest.removeprefix("sha256:")

    def pair(self) -> signing.KeyPair:
        return signing.read_secret_key(self.secret)

    def drop_referrers(self, store: oci.Store, man: oci.Manifest) -> None:
        """The build's referrers index emptied (its signature and evidence gone)."""
        store._put_manifest(oci.make_index([]), oci.INDEX, oci.fallback_tag(man.digest))

    def hide_indexes(self, store: oci.Store) -> None:
        """The publishers' signed indexes of the build removed from index.json (whoever writes to
        a store can hide what it holds), so only what the single tag names is left to pull."""
        store._update_index(lambda entries: [e for e in entries if not (publishers.parse_tag(
            e.annotations.get(oci.REF_NAME, "")) or ("", None))[1]])

    def republish(self, store: oci.Store, man: oci.Manifest, layer: bytes, pair: signing.KeyPair | None) -> oci.Manifest:
        """Under the build's tag, a manifest of the same key with `layer` as its bundle, signed by
        `pair`, the publishers' indexes (which still list the published build) hidden."""
        self.hide_indexes(store)
        desc = store.push_blob_bytes(layer, oci.BUNDLE_LAYER)
        data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=man.config, layers=[desc],
                                 annotations=dict(man.annotations))
        new = store.push_manifest(data, tag=self.tag)
        if pair is not None:
            artifact.attach(store, new, oci.SIGNATURE_TYPE, None, pair)
        return new


def _walk(top: Path):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            yield str(p.relative_to(top)), p


@pytest.fixture
def second(tmp_path, first):
    return Second(tmp_path, first)


def _bundle_with(original: bytes, add) -> bytes:
    """The published bundle re-made with `add(tar, top)` adding hostile members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(original), mode="r:gz") as src, \
            tarfile.open(fileobj=out, mode="w:gz") as dst:
        members = src.getmembers()
        top = members[0].name.split("/")[0]
        for m in members:
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        add(dst, top)
    return out.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"owned\n") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link(tar: tarfile.TarFile, name: str, target: str, hard: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    tar.addfile(info)


# -- bytes and manifests -------------------------------------------------------------------------

def test_a_layer_whose_bytes_do_not_match_its_digest_is_refused(second):
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    path = second.blob_path(layer.digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    line = second.refused()
    assert "do not match its digest" in line


def test_a_manifest_naming_another_artifacts_layer_is_not_signed_by_anyone_trusted(second):
    """The tag moved to a manifest of the same key whose layer is other bytes: the trusted
    signature covers the old manifest's bytes, so nothing trusted signs the new one."""
    with second.open() as store:
        man = second.build_manifest(store)
        other = _bundle_with(store.read_blob(man.layers[0], 1 << 30), lambda t, top: _file(t, f"{top}/bin/extra"))
        new = second.republish(store, man, other, None)
        # the old signature replayed as a referrer of the new manifest
        sig_ref = store.referrers(man.digest, oci.SIGNATURE_TYPE)[0]
        old_sig = store.manifest(sig_ref.digest)
        data = oci.make_manifest(artifact_type=oci.SIGNATURE_TYPE, config=old_sig.config,
                                 layers=list(old_sig.layers), subject=new.descriptor())
        store.push_manifest(data)
    line = second.refused()
    assert "no trusted signature" in line or "not signed" in line


def test_a_valid_signature_by_an_untrusted_key_is_refused(second):
    with second.open() as store:
        man = second.build_manifest(store)
        second.drop_referrers(store, man)
        artifact.attach(store, man, oci.SIGNATURE_TYPE, None, signing.generate())
    line = second.refused()
    assert "no trusted signature" in line


def test_a_signature_replayed_from_another_build_is_refused(second):
    """A signature the trusted key made of another build's manifest, attached to this one."""
    with second.open() as store:
        man = second.build_manifest(store)
        other = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=man.config, layers=list(man.layers),
                                  annotations={"replayed": "yes"})
        other_man = oci.Manifest.parse(other, "other")
        sig_text = signing.sign(other, second.pair(), artifact.signature_comment("build", other_man.digest))
        second.drop_referrers(store, man)
        empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
        sig = store.push_blob_bytes(sig_text.encode(), oci.MINISIGN_LAYER)
        store.push_manifest(oci.make_manifest(artifact_type=oci.SIGNATURE_TYPE, config=empty, layers=[sig],
                                              subject=man.descriptor()))
    line = second.refused()
    assert "no trusted signature" in line


def test_an_old_artifact_re_tagged_under_another_keys_tag_is_refused(second):
    """A trusted, signed build of other inputs (another key) moved under this key's tag."""
    with second.open() as store:
        man = second.build_manifest(store)
        doc = json.loads(store.read_blob(man.config))
        doc["target"] = "gfx9999"
        other_key = store.push_blob_bytes(oci.canonical_json(doc), oci.KEY_CONFIG)
        data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=other_key, layers=list(man.layers),
                                 annotations=dict(man.annotations))
        other = store.push_manifest(data, tag=second.tag)
        artifact.attach(store, other, oci.SIGNATURE_TYPE, None, second.pair())
        second.hide_indexes(store)
    line = second.refused()
    assert "made for another key" in line


def test_a_key_document_edited_in_place_is_refused(second):
    """The key document's blob changed under the same digest, at the same length (its backend
    cpu -> hip, as a key for another toolchain would read), so only the digest check stops it."""
    with second.open() as store:
        man = second.build_manifest(store)
        data = store.read_blob(man.config)
    assert b'"cpu"' in data
    path = second.blob_path(man.config.digest)
    os.chmod(path, 0o644)
    path.write_bytes(data.replace(b'"cpu"', b'"hip"', 1))
    line = second.refused()
    assert "do not match" in line


def test_a_layer_past_max_layer_bytes_is_refused_before_it_is_read(second):
    second.machine.configure(stores=[second.url], trusted_keys=[second.public], max_layer_bytes=100)
    line = second.refused()
    assert "substitute.max_layer_bytes" in line


def test_without_substitute_only_a_refused_substitute_falls_back_to_compiling_with_a_note(second):
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    path = second.blob_path(layer.digest)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    res = second.machine("build", str(second.recipe), "--backend", "cpu", "--force",
                         "--prefix", str(second.prefix))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    notes = [line for line in res.stderr.splitlines() if line.startswith("substitute: none used")]
    assert len(notes) == 1 and "do not match its digest" in notes[0] and notes[0].endswith("compiling")
    assert "[substituted]" not in (second.prefix / "rocforge-manifest.toml").read_text()  # compiled here


# -- the bundle's own rules ------------------------------------------------------------------------

@pytest.mark.parametrize("hostile", [
    pytest.param(lambda t, top: _file(t, f"{top}/../escaped"), id="dotdot"),
    pytest.param(lambda t, top: _file(t, "/tmp/rocforge-absolute-escape"), id="absolute"),
    pytest.param(lambda t, top: _link(t, f"{top}/lib/out", "/etc"), id="symlink-absolute"),
    pytest.param(lambda t, top: _link(t, f"{top}/lib/up", "../../.."), id="symlink-up"),
    pytest.param(lambda t, top: (_link(t, f"{top}/lib/via", "/tmp"), _file(t, f"{top}/lib/via/rocforge-via")),
                 id="write-through-link"),
    pytest.param(lambda t, top: _link(t, f"{top}/lib/hard", "/etc/passwd", hard=True), id="hardlink-out"),
])
def test_a_bundle_member_out_of_the_tree_signed_by_the_trusted_key_is_refused(second, hostile):
    with second.open() as store:
        man = second.build_manifest(store)
        evil = _bundle_with(store.read_blob(man.layers[0], 1 << 30), hostile)
        second.drop_referrers(store, man)
        second.republish(store, man, evil, second.pair())
    line = second.refused()
    assert "rocforge: error:" in line
    assert not Path("/tmp/rocforge-absolute-escape").exists()
    assert not Path("/tmp/rocforge-via").exists()
    assert not (second.prefix.parent.parent / "escaped").exists()


class _Zeros(io.RawIOBase):
    """`size` zero bytes, read without holding them."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def test_a_small_layer_that_unpacks_to_a_huge_unlisted_member_is_refused_before_it_is_written(second):
    """A 256 KiB layer holding a 256 MiB member bundle.toml does not list: the bundle's rules
    refuse it, and must do so before writing it (a 100 MB layer would write 100 GB otherwise).
    The evidence: the pull runs under a 64 MiB file-size limit, which writing the member breaks."""
    size = 256 << 20

    def bomb(tar, top):
        info = tarfile.TarInfo(f"{top}/bin/huge")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size)))

    with second.open() as store:
        man = second.build_manifest(store)
        evil = _bundle_with(store.read_blob(man.layers[0], 1 << 30), bomb)
        second.drop_referrers(store, man)
        second.republish(store, man, evil, second.pair())
    assert len(evil) < 2 << 20
    res = second.machine.run_wrapped(("prlimit", f"--fsize={64 << 20}"), "build", str(second.recipe),
                                     "--backend", "cpu", "--substitute-only", "--force",
                                     "--prefix", str(second.prefix))
    line = one_error(res, 9)
    assert "bundle.toml" in line
    second.untouched()


# -- a directory store's files ----------------------------------------------------------------------

@pytest.mark.parametrize("what", ["layer", "index"])
def test_a_fifo_where_a_file_should_be_is_refused_without_a_hang(second, what):
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    path = second.blob_path(layer.digest) if what == "layer" else second.store / "index.json"
    path.unlink()
    os.mkfifo(path)
    t0 = time.monotonic()
    second.refused(timeout=30)
    assert time.monotonic() - t0 < 20


def test_a_symlink_where_the_layer_should_be_is_refused(second, tmp_path):
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    path = second.blob_path(layer.digest)
    real = tmp_path / "elsewhere.bin"
    shutil.copy(path, real)
    path.unlink()
    path.symlink_to(real)
    second.outside = second._outside()
    line = second.refused()
    assert "symbolic link" in line


# -- attachments --------------------------------------------------------------------------------

def test_an_advisory_signed_by_an_untrusted_key_is_ignored(second):
    with second.open() as store:
        man = second.build_manifest(store)
        artifact.attach(store, man, oci.ADVISORY_TYPE, {"kind": "advisory", "key": man.config.digest,
                                                        "reason": "forged"}, signing.generate())
    res = second.build()
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "forged" not in res.stderr + res.stdout


def test_an_advisory_signed_by_the_trusted_key_stops_pull_and_compile(second):
    with second.open() as store:
        man = second.build_manifest(store)
        artifact.attach(store, man, oci.ADVISORY_TYPE, {"kind": "advisory", "key": man.config.digest,
                                                        "reason": "miscompiles"}, second.pair())
    line = second.refused()
    assert "miscompiles" in line


def test_evidence_signed_by_an_untrusted_key_is_not_shown_as_trusted(second):
    with second.open() as store:
        man = second.build_manifest(store)
        artifact.attach(store, man, oci.EVIDENCE_TYPE, {"kind": "verify", "key": man.config.digest,
                                                        "passed": True, "host": {"hostname": "forged-host"}},
                        signing.generate())
    res = second.machine("store", "show", second.url, second.tag, "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    shown = json.loads(res.stdout)
    text = json.dumps(shown)
    if "forged-host" in text:  # shown only as untrusted, never among the trusted attestations
        assert "untrusted" in text.lower()
    res = second.build()
    assert res.returncode == 0 and "1 attestation(s)" in res.stderr, res.stderr


def test_a_huge_referrer_list_is_refused_in_one_line_and_fast(second):
    with second.open() as store:
        man = second.build_manifest(store)
        entries = store.referrers(man.digest)
        junk = [oci.Descriptor(oci.MANIFEST, "sha256:" + f"{i:064x}", 100, artifact_type=oci.SIGNATURE_TYPE)
                for i in range(5000)]
        store._put_manifest(oci.make_index([*junk, *entries]), oci.INDEX, oci.fallback_tag(man.digest))
    t0 = time.monotonic()
    second.refused()
    assert time.monotonic() - t0 < 10


def test_signature_referrers_crowding_out_the_good_one_still_let_it_be_found(second):
    """70 junk signatures listed before the publisher's: the trusted one is still found (a store
    writer can add referrers, and must not be able to hide a good signature by doing so)."""
    with second.open() as store:
        man = second.build_manifest(store)
        entries = store.referrers(man.digest)
        junk = [oci.Descriptor(oci.MANIFEST, "sha256:" + f"{i:064x}", 100, artifact_type=oci.SIGNATURE_TYPE)
                for i in range(70)]
        store._put_manifest(oci.make_index([*junk, *entries]), oci.INDEX, oci.fallback_tag(man.digest))
    res = second.build()
    assert res.returncode == 0, res.stderr


# -- what `store list/show` print --------------------------------------------------------------------

def test_terminal_control_characters_in_annotations_and_evidence_are_not_printed(second):
    evil = "\x1b]0;owned\x07\x1b[2J\r\x08\x9b31m"
    with second.open() as store:
        man = second.build_manifest(store)
        annotations = {**man.annotations, "org.opencontainers.image.description": evil,
                       "dev.rocforge.recipe": "fixture" + evil}
        data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=man.config, layers=list(man.layers),
                                 annotations=annotations)
        new = store.push_manifest(data, tag=second.tag)
        artifact.attach(store, new, oci.SIGNATURE_TYPE, None, second.pair())
        artifact.attach(store, new, oci.EVIDENCE_TYPE, {"kind": "verify", "key": man.config.digest,
                                                        "passed": True, "note": evil,
                                                        "host": {"hostname": "h" + evil, "kernel": evil}},
                        second.pair(), annotations={"dev.rocforge.kind": "verify" + evil})
    for args in (("store", "list", second.url), ("store", "show", second.url, second.tag)):
        res = second.machine(*args)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        shown = res.stdout + res.stderr
        assert not any(c in shown for c in "\x1b\x07\x08\x9b\r"), repr(shown)


# -- registries ------------------------------------------------------------------------------------

@pytest.fixture
def fake_registry():
    from registry_server import FakeRegistry

    with FakeRegistry() as reg:
        yield reg


def _publish_to(second: Second, url: str) -> None:
    """The pristine store's build and its referrers copied into `url`."""
    _copy_build(second.url, url, second.tag)


def test_a_registry_redirecting_a_blob_to_another_host_over_http_is_refused(second, fake_registry):
    from registry_server import FakeRegistry

    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    with FakeRegistry(host="localhost") as other:
        other.blobs[layer.digest] = fake_registry.blobs[layer.digest]
        fake_registry.route("GET", "/blobs/" + layer.digest, lambda r: (
            307, {"Location": f"{other.base}/v2/test/repo/blobs/{layer.digest}"}, b""))
        second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
        line = second.refused()
        assert not [r for r in other.requests if "Authorization" in r.headers]
    assert "redirect" in line.lower() or "another host" in line.lower()


def test_a_registry_that_hangs_mid_layer_gives_one_line_within_the_timeout(second, fake_registry):
    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    data = fake_registry.blobs[layer.digest]

    def hang(r):
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        time.sleep(8)
        return ("raw", {}, b"")

    fake_registry.route("GET", "/blobs/" + layer.digest, hang)
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=1)
    t0 = time.monotonic()
    second.refused(timeout=30)
    assert time.monotonic() - t0 < 20


def test_a_registry_that_drops_the_connection_mid_layer_is_resumed(second, fake_registry):
    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    data = fake_registry.blobs[layer.digest]
    dropped = []

    def drop_once(r):
        if dropped or r.headers.get("Range"):
            return None
        dropped.append(1)
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(2)
        return ("raw", {}, b"")

    fake_registry.route("GET", "/blobs/" + layer.digest, drop_once)
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
    res = second.build()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert dropped


def test_a_registry_streaming_an_endless_manifest_is_cut_off_in_one_line(second, fake_registry):
    url = fake_registry.store_url()

    def endless(r):
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Type", oci.MANIFEST)
        h.send_header("Connection", "close")
        h.end_headers()
        try:
            for _ in range(64):  # 64 MiB, past any manifest cap
                h.wfile.write(b" " * (1 << 20))
        except OSError:
            pass
        h.close_connection = True
        return ("raw", {}, b"")

    fake_registry.route("GET", "/manifests/", endless)
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
    t0 = time.monotonic()
    line = second.refused(timeout=60)
    assert time.monotonic() - t0 < 20 and "cap" in line


# -- documents signed by the trusted key are still data --------------------------------------------

def test_a_trusted_advisory_reason_with_newlines_and_escapes_gives_one_clean_error_line(second):
    """`store advise` refuses such a reason, but the store holds whatever was signed: the
    advisory's reason reaches the error line, which must stay one line a terminal only prints."""
    with second.open() as store:
        man = second.build_manifest(store)
        artifact.attach(store, man, oci.ADVISORY_TYPE,
                        {"key": man.config.digest, "reason": "bad\nrocforge: error: forged second line\x1b]0;owned\x07\x1b[2J"},
                        second.pair())
    res = second.build()
    assert not any(c in res.stderr + res.stdout for c in "\x1b\x07"), repr(res.stderr)
    line = one_error(res, 9)
    assert "known bad" in line
    # the store's newline must not start a line of its own that reads as a second error
    assert [x for x in res.stderr.splitlines() if x.strip().startswith("rocforge: error:")] == [line]
    second.untouched()


def test_trusted_evidence_shapes_and_figures_cannot_drive_the_terminal_in_store_show(second):
    evil = "\x1b]0;owned\x07\x1b[2J"
    with second.open() as store:
        man = second.build_manifest(store)
        artifact.attach(store, man, oci.EVIDENCE_TYPE,
                        {"key": man.config.digest, "kind": "verify", "passed": True,
                         "verify": [{"checks": [{"ctx": evil, "ubatch": evil, "fa": evil, "ngl": evil,
                                                 "passed": True, "kld_mean": evil, "top1": evil}]}],
                         "own_figures": [{"ctx": evil, "fa": evil, "ppl": evil}]},
                        second.pair())
    res = second.machine("store", "show", second.url, second.tag)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert not any(c in res.stdout + res.stderr for c in "\x1b\x07"), repr(res.stdout)


@pytest.mark.parametrize("field", ["verify", "own_figures", "gpus"])
def test_trusted_evidence_of_the_wrong_shape_is_shown_or_left_out_without_a_traceback(second, field):
    with second.open() as store:
        man = second.build_manifest(store)
        doc = {"key": man.config.digest, "kind": "verify", "passed": True}
        if field == "gpus":
            doc["host"] = {"gpus": 5}
        else:
            doc[field] = 5
        artifact.attach(store, man, oci.EVIDENCE_TYPE, doc, second.pair())
    for extra in ((), ("--json",)):
        res = second.machine("store", "show", second.url, second.tag, *extra)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_control_characters_in_a_layout_stores_tag_names_are_not_printed_by_store_list(second):
    """index.json names tags with any string; `store list` prints keys taken from them."""
    index = json.loads((second.store / "index.json").read_text())
    entry = dict(index["manifests"][0])
    entry["annotations"] = {oci.REF_NAME: "rocforge-\x1b]0;owned\x07\x1b[2Jabc"}
    index["manifests"].append(entry)
    (second.store / "index.json").write_text(json.dumps(index))
    res = second.machine("store", "list", second.url)
    assert "Traceback" not in res.stderr, res.stderr
    assert not any(c in res.stdout + res.stderr for c in "\x1b\x07"), repr(res.stdout)


def test_a_tls_registrys_blob_redirect_to_another_https_host_gets_no_credentials(second, tmp_path):
    """ghcr.io's way: a blob served from another HTTPS host.  The credentials given to the
    registry never go there, and that host's bytes are still checked against the digest."""
    import base64

    from registry_server import FakeRegistry, make_tls

    tls = make_tls(tmp_path / "tls")
    second.outside = second._outside()
    with FakeRegistry(tls) as reg, FakeRegistry(tls, host="localhost") as other:
        url = reg.store_url()
        secret = base64.b64encode(b"alice:s3cret").decode()

        def challenge(r):
            if r.headers.get("Authorization") != f"Basic {secret}":
                return 401, {"WWW-Authenticate": 'Basic realm="test"'}, b""
            return None

        second.machine.env["REQUESTS_CA_BUNDLE"] = str(tls.ca)
        second.machine.env["SSL_CERT_FILE"] = str(tls.ca)
        second.machine.env.update(ROCFORGE_STORE_USERNAME="alice", ROCFORGE_STORE_PASSWORD="s3cret")
        _publish_to_with(second, url, second.machine.env)
        with second.open() as store:
            layer = second.build_manifest(store).layers[0]
        good = reg.blobs[layer.digest]
        other.blobs[layer.digest] = good[:-1] + bytes([good[-1] ^ 1])  # the other host lies
        reg.route("GET", "/blobs/" + layer.digest, lambda r: challenge(r) or (
            307, {"Location": f"{other.base}/cdn/{layer.digest}"}, b""))
        other.route("GET", "/cdn/", lambda r: (200, {}, other.blobs[layer.digest]))
        for method in ("GET", "HEAD", "PUT", "POST", "PATCH"):
            reg.route(method, "^/v2/", challenge)
        second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
        line = second.refused()
        assert "do not match its digest" in line
        assert [r for r in other.requests if r.path.startswith("/cdn/")], "the redirect was not followed"
        assert not [r for r in other.requests if "Authorization" in r.headers]
        assert "s3cret" not in line


def _publish_to_with(second: Second, url: str, env: dict) -> None:
    """The pristine store's build copied into `url` in a child process with `env` (its CA and
    credentials)."""
    code = ("import sys; sys.path[:0] = [sys.argv[3], sys.argv[4]]\n"
            "from test_substitute_pull_hostile import _copy_build\n"
            "_copy_build(sys.argv[1], sys.argv[2], sys.argv[5])\n")
    here = Path(__file__).resolve().parent
    res = python(code, second.url, url, str(here), str(here.parent), second.tag, env=env)
    assert res.returncode == 0, res.stderr


def _copy_build(src_url: str, dst_url: str, tag: str) -> None:
    with open_store(src_url) as src, open_store(dst_url, timeout=5) as dst:
        man = src.manifest(tag)
        for d in (man.config, *man.layers):
            dst.push_blob_bytes(src.read_blob(d, 1 << 30), d.media_type)
        dst.push_manifest(man.data, tag=tag)
        for ref in src.referrers(man.digest):
            r = src.manifest(ref.digest)
            for d in (r.config, *r.layers):
                dst.push_blob_bytes(src.read_blob(d, 1 << 30), d.media_type)
            dst.push_manifest(r.data)


def test_store_list_against_an_endless_tags_list_stops_in_one_line(second, fake_registry):
    url = fake_registry.store_url()

    def endless(r):
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        try:
            h.wfile.write(b'{"tags":["')
            for _ in range(16):  # 16 MiB, past any tags list cap
                h.wfile.write(b"a" * (1 << 20))
        except OSError:
            pass
        h.close_connection = True
        return ("raw", {}, b"")

    fake_registry.route("GET", "/tags/list", endless)
    t0 = time.monotonic()
    res = second.machine("store", "list", url, timeout=60)
    one_error(res, 7)
    assert time.monotonic() - t0 < 20


def test_store_list_against_a_next_link_to_itself_stops_in_one_line(second, fake_registry):
    """The same next page over and over: stopped at the first repeat."""
    url = fake_registry.store_url()
    fake_registry.route("GET", "/tags/list", lambda r: (
        200, {"Content-Type": "application/json",
              "Link": '</v2/test/repo/tags/list?n=100&last=x>; rel="next"'}, b'{"tags":["x"]}'))
    t0 = time.monotonic()
    res = second.machine("store", "list", url, timeout=60)
    assert "links back to a page already read" in one_error(res, 7)
    assert time.monotonic() - t0 < 20


def _drop_first_then(fake_registry, layer_digest: str, data: bytes, on_range) -> list:
    """The blob's first GET cut off half-way; a later Range GET answered by `on_range(start)`."""
    seen: list = []

    def answer(r):
        wanted = r.headers.get("Range")
        seen.append(wanted)
        if wanted:
            return on_range(int(wanted.removeprefix("bytes=").split("-")[0]))
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(2)
        return ("raw", {}, b"")

    fake_registry.route("GET", "/blobs/" + layer_digest, answer)
    return seen


def test_a_resume_answered_with_the_whole_blob_restarts_or_is_refused_in_one_line(second, fake_registry):
    """HTTP lets a server ignore Range and answer 200 with the whole body: appending that to
    the half already read must not happen (it would then fail the digest and blame the store's
    bytes); the right answer is the build, the body taken from its start."""
    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    data = fake_registry.blobs[layer.digest]
    seen = _drop_first_then(fake_registry, layer.digest, data, lambda start: (200, {}, data))
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
    res = second.build()
    assert any(seen[1:]), seen  # it did try to resume
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_a_resume_answered_from_another_offset_is_refused_or_handled(second, fake_registry):
    """A 206 whose Content-Range starts elsewhere than asked: its bytes do not belong there."""
    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    data = fake_registry.blobs[layer.digest]
    seen = _drop_first_then(fake_registry, layer.digest, data, lambda start: (
        206, {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}, data))
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
    res = second.build()
    assert any(seen[1:]), seen
    if res.returncode != 0:
        line = one_error(res, 9)
        assert "asked from byte" in line, line
        second.untouched()


def test_a_symlinked_blobs_directory_or_an_oversized_index_is_refused(second, tmp_path):
    moved = tmp_path / "blobs-elsewhere"
    (second.store / "blobs").rename(moved)
    (second.store / "blobs").symlink_to(moved)
    second.outside = second._outside()
    line = second.refused()
    assert "symbolic link" in line or "not a directory" in line, line
    (second.store / "blobs").unlink()
    moved.rename(second.store / "blobs")
    second.outside = second._outside()
    index = json.loads((second.store / "index.json").read_text())
    index["padding"] = "x" * (20 << 20)
    (second.store / "index.json").write_text(json.dumps(index))
    line = second.refused()
    assert "cap" in line, line


def test_ctrl_c_during_a_hung_pull_leaves_the_previous_build_and_no_staging(second, fake_registry):
    import signal
    import subprocess

    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        layer = second.build_manifest(store).layers[0]
    data = fake_registry.blobs[layer.digest]

    def hang(r):
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[:100])
        h.wfile.flush()
        time.sleep(6)
        return ("raw", {}, b"")

    fake_registry.route("GET", "/blobs/" + layer.digest, hang)
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=30)
    child = subprocess.Popen([sys.executable, "-m", "rocforge_build", "build", str(second.recipe), "--backend", "cpu",
                              "--substitute-only", "--force", "--prefix", str(second.prefix)],
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **second.machine.env,
                                                                     "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(r.path.endswith(layer.digest) for r in fake_registry.requests):
        time.sleep(0.05)
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode != 0 and "Traceback" not in err, err
    second.untouched()


@pytest.mark.parametrize("value", ["abc", "sha256:" + "g" * 64, "0123456789ab\nrocforge: fake", "../" * 20, "-" * 300])
def test_a_withdraw_value_that_is_no_digest_is_one_line_before_any_store_or_key_is_read(tmp_path, value):
    res = rocforge("store", "advise", (tmp_path / "no-store").as_uri(), "0123456789abcdef", f"--withdraw={value}",
                   "--reason", "taken back", env={"ROCFORGE_CONFIG_DIR": str(tmp_path / "c")})
    assert "is not an advisory's digest" in one_error(res, code=2)
    assert not (tmp_path / "no-store").exists()


# -- this machine's disk failing mid-pull ------------------------------------------------------------

# A pull in a child process with one OS error injected where rocforge really meets it: the
# rename of the unpacked tree into the staging dir (os.replace), the swap of the staged tree into
# the prefix (replace.exchange, renameat2), or the write of the layer's bytes (the blob writer).
_INJECT = r"""
import errno, os, sys
from rocforge_build import cli, replace
from rocforge_build.substitute import oci

where, code = sys.argv[1], getattr(errno, sys.argv[2])
if where == "staging":
    real_replace = os.replace
    def failing_replace(src, dst, *args, **kwargs):
        if str(dst).endswith(".rocforge-new"):
            raise OSError(code, os.strerror(code), str(src), None, str(dst))
        return real_replace(src, dst, *args, **kwargs)
    os.replace = failing_replace
elif where == "swap":
    def failing_exchange(a, b):
        raise OSError(code, os.strerror(code), str(a), None, str(b))
    replace.exchange = failing_exchange
elif where == "layer":
    real_drain = oci._HashingWriter._drain
    class Failing:
        def write(self, chunk):
            raise OSError(code, os.strerror(code))
    def failing_drain(self):
        self.out = Failing()
        real_drain(self)
    oci._HashingWriter._drain = failing_drain
sys.exit(cli.main(sys.argv[3:]))
"""


def _bytes_of(top: Path) -> dict[str, str]:
    """Every file below `top` by its bytes' sha256 (links by their target)."""
    import hashlib

    return {rel: (os.readlink(p) if p.is_symlink() else "dir" if p.is_dir()
                  else hashlib.sha256(p.read_bytes()).hexdigest()) for rel, p in _walk(top)}


@pytest.mark.parametrize(("where", "name", "code", "words"), [
    ("staging", "EIO", 2, "Input/output error"),
    ("staging", "EXDEV", 2, "Invalid cross-device link"),
    ("staging", "EACCES", 2, "Permission denied"),
    ("swap", "EIO", 2, "Input/output error"),
    ("staging", "ENOSPC", 10, "no space left on the device"),
    ("swap", "ENOSPC", 10, "no space left on the device"),
    ("layer", "ENOSPC", 10, "no space left on the device"),
])
def test_an_os_error_on_this_machines_disk_mid_pull_is_one_line_the_old_build_kept(second, where, name, code, words):
    """An I/O error on a rename is the disk's, not a bug (it was exit 70, 'internal error'): one
    line with the path and the OS's reason; a full disk is exit 10.  Either way the old build
    stays byte for byte and no staging tree (`*.rocforge-new`, the layer's holder) is left."""
    before = _bytes_of(second.prefix)
    res = python(_INJECT, where, name, "build", str(second.recipe), "--backend", "cpu", "--substitute-only",
                 "--force", "--prefix", str(second.prefix), env=second.machine.env)
    line = one_error(res, code)
    assert words in line, line
    assert str(second.prefix) in line, line  # the path: the staging dir, the prefix or the layer
    second.untouched()
    assert _bytes_of(second.prefix) == before
    assert not list(second.prefix.parent.glob("*.rocforge-*")), list(second.prefix.parent.iterdir())


# -- a registry that answers, but slowly -------------------------------------------------------------

def _with_download_limits(second: Second, url: str, **limits: float) -> None:
    second.machine.configure(stores=[url], trusted_keys=[second.public], timeout=5)
    with open(second.machine.root / "config" / "config.toml", "a") as fh:
        fh.write("[download]\n" + "".join(f"{k} = {v!r}\n" for k, v in limits.items()))


def test_a_registry_trickling_the_key_document_stops_the_build_at_the_listing_deadline(second, fake_registry):
    """Each byte of the key document inside the 5 s timeout, the whole at 20 B/s: the build stops
    at download.listing_deadline (2 s here) with the store, the object and the key in its line."""
    url = fake_registry.store_url()
    _publish_to(second, url)
    with second.open() as store:
        config = second.build_manifest(store).config
    data = fake_registry.blobs[config.digest]

    def trickle(r):
        h = r.handler
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        try:
            for i in range(min(len(data), 400)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        return ("raw", {}, b"")

    fake_registry.route("GET", "/blobs/" + config.digest, trickle)
    _with_download_limits(second, url, listing_deadline=2.0, min_rate=0.0)
    t0 = time.monotonic()
    line = second.refused()
    assert f"{url}: key document {config.digest[:19]}: still receiving at the 2 s limit " \
           "(download.listing_deadline)" in line, line
    assert time.monotonic() - t0 < 10


def test_forty_forged_advisories_naming_the_trusted_key_are_read_to_the_cap_and_the_rest_named_in_one_line(second):
    """Forged advisory referrers (nothing behind them) carry the trusted key's id: the pull reads
    at most artifact.MAX_READ_REFERRERS of them, installs, and says once what it skipped."""
    cap = artifact.MAX_READ_REFERRERS
    with second.open() as store:
        man = second.build_manifest(store)
        entries = store.referrers(man.digest)
        forged = [oci.Descriptor(oci.MANIFEST, "sha256:" + f"{i:064x}", 100, artifact_type=oci.ADVISORY_TYPE,
                                 annotations={artifact.SIGNER: second.pair().key_id}) for i in range(cap + 8)]
        store._put_manifest(oci.make_index([*entries, *forged]), oci.INDEX, oci.fallback_tag(man.digest))
    res = second.build()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    skipped = [line for line in res.stderr.splitlines() if "were skipped" in line]
    assert len(skipped) == 1, res.stderr
    assert f"8 of the {cap + 8} advisory referrers of {man.digest[:19]} naming a trusted key were skipped " \
           f"(at most {cap} are read)" in skipped[0]


def test_the_single_tag_moved_to_an_untrusted_publishers_build_hides_nothing(second):
    """A publisher this machine does not trust moves the single tag of earlier stores to its own
    artifact of the key: the trusted publisher's signed index still names its build, which is
    pulled, and one line says what was passed over."""
    stranger = signing.generate()
    with second.open() as store:
        man = second.build_manifest(store)
        data = oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=man.config, layers=list(man.layers),
                                 annotations={**man.annotations, "dev.rocforge.publisher": stranger.key_id})
        other = store.push_manifest(data, tag=second.tag)
        artifact.attach(store, other, oci.SIGNATURE_TYPE, None, stranger)
    res = second.build()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert [line for line in res.stderr.splitlines() if "passed over" in line and "not trusted" in line]


def test_an_unsigned_index_under_the_trusted_keys_tag_is_ignored_in_one_line(second):
    key = "sha256:" + second.tag.removeprefix("rocforge-")
    with second.open() as store:
        store._put_manifest(oci.make_index([], artifact_type=publishers.INDEX_TYPE), oci.INDEX,
                            publishers.publisher_tag(key, signing.PublicKey.parse(second.public).key_id))
    res = second.build()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert len([line for line in res.stderr.splitlines() if line.endswith("is not signed: ignored")]) == 1


def test_a_store_as_earlier_rocforge_left_it_single_tag_no_index_is_still_pulled(second):
    with second.open() as store:
        second.hide_indexes(store)
        assert not [t for t in store.tags() if (publishers.parse_tag(t) or ("", None))[1]]
    res = second.build()
    assert res.returncode == 0 and "installed" in res.stderr and "Traceback" not in res.stderr, res.stderr
