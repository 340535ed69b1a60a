"""The OCI pieces every substitute store shares: media types, descriptors, bounded and
digest-checked reads of what a store returns, and the store interface with the referrers tag
schema of the OCI distribution spec (v1.1, "Referrers Tag Schema") for stores that have no
referrers API: an OCI image layout, a plain HTTP server, S3, or a registry such as distribution
2.8.  A store's bytes are data: each read is capped, each blob checked against its digest before
anything uses it, and each manifest parsed into typed values or refused with one line."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from rocforge_build.download_policy import Deadline, Pace, RetryPolicy, policy_or_config
from rocforge_build.errors import IntegrityError, NetworkError

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_DATA = b"{}"

BUILD_TYPE = "application/vnd.rocforge.build.v1"
KEY_CONFIG = "application/vnd.rocforge.key.v1+json"
BUNDLE_LAYER = "application/vnd.rocforge.bundle.v1.tar+gzip"
SIGNATURE_TYPE = "application/vnd.rocforge.signature.v1"
EVIDENCE_TYPE = "application/vnd.rocforge.evidence.v1"
ADVISORY_TYPE = "application/vnd.rocforge.advisory.v1"
WITHDRAWAL_TYPE = "application/vnd.rocforge.advisory-withdrawal.v1"  # its own type: older readers ignore it
JSON_LAYER = "application/json"
MINISIGN_LAYER = "application/vnd.rocforge.minisign.v1"

REF_NAME = "org.opencontainers.image.ref.name"
MAX_MANIFEST = 4 << 20  # the OCI distribution spec lets a registry refuse manifests past 4 MiB
MAX_SMALL_BLOB = 16 << 20  # a key document, a signature or an evidence record
MAX_REFERRERS = 4096
CHUNK = 1 << 20
FALLBACK_TRIES = 6  # a tag-schema referrers index written, read back, and written again if lost
# a layer this large from a store that answers ranges (`ranged`) may come as RANGED_STREAMS
# parallel range requests of RANGED_PIECE bytes each (Store.fetch_blob)
RANGED_THRESHOLD = 64 << 20
RANGED_STREAMS = 4
RANGED_PIECE = 8 << 20
# a large layer begins as one stream; one whose first RANGED_PIECE bytes came at least this fast
# (bytes/s) goes on as it is, a slower one is closed and the rest comes as parallel ranges (on
# loopback on 2 cores parallel ranges cost CPU the sha256 needs) -- except on a machine of at least
# RANGED_CORES cores, where the ranges' threads do not take the hashing core's time and four ranges
# outran one stream at every size from 512 MB (16 cores: 1.07 against 0.89 GB/s at 2 GB;
# docs/measurements/large-pulls.md)
RANGED_ENOUGH = 200e6
RANGED_CORES = 8

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")



class _HashingWriter:
    """Hashes and writes a blob's chunks on a thread of its own while the caller receives the
    next, so checking the digest costs no time on the wire (hashlib and file writes release the
    GIL); at most QUEUED chunks wait, and a write's error reaches the caller at its next chunk."""

    QUEUED = 8

    def __init__(self, out: BinaryIO):
        self.out = out
        self.hash = hashlib.sha256()
        self.error: OSError | None = None
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=self.QUEUED)
        self.thread = threading.Thread(target=self._drain, name="rocforge-blob-writer", daemon=True)
        self.stopped = False

    def __enter__(self) -> _HashingWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _drain(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            if self.error is None:
                try:
                    self.hash.update(chunk)
                    self.out.write(chunk)
                except OSError as exc:
                    self.error = exc
            self.chunks.task_done()

    def put(self, chunk: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.chunks.put(chunk)

    def drain(self) -> None:
        """Every chunk put so far hashed and written (the thread goes on for more)."""
        self.chunks.join()
        if self.error is not None:
            raise self.error

    def _stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.chunks.put(None)
            self.thread.join()

    def finish(self) -> str:
        """Every chunk hashed and written: the blob's digest."""
        self._stop()
        if self.error is not None:
            raise self.error
        return "sha256:" + self.hash.hexdigest()


class StoreError(IntegrityError):
    """A store's answer that rocforge refuses: a digest that does not match, a size past the
    cap, a manifest that is not what it says; one line naming the store and the object."""


class RangeRefused(StoreError):
    """A store that answered a range request with the whole blob (HTTP 200): a ranged pull goes
    on as one stream from the bytes it has checked."""


def check_range(content_range: str, content_length: str | None, start: int, end: int, size: int,
                where: str) -> None:
    """A 206's Content-Range and Content-Length are exactly bytes `start`-`end` (inclusive) of a
    blob of `size` bytes (its descriptor's), or one StoreError line."""
    found = re.fullmatch(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)", content_range.strip())
    if found is None or (int(found.group(1)), int(found.group(2))) != (start, end):
        raise StoreError(f"{where}: asked for bytes {start}-{end}, answered "
                         f"{content_range.strip()[:60]!r}")
    if found.group(3) != "*" and int(found.group(3)) != size:
        raise StoreError(f"{where}: the store says the blob is {found.group(3)[:20]} bytes, its "
                         f"descriptor {size}")
    if content_length is not None and content_length.strip() != str(end - start + 1):
        raise StoreError(f"{where}: {content_length.strip()[:20]!r} bytes for a range of "
                         f"{end - start + 1}")


class StoreUnreachable(NetworkError):
    """A store that did not answer, dropped the connection or refused the credentials."""


class TransferExpired(StoreUnreachable):
    """A store read still going at its whole deadline: not resumed, not retried."""


def shown_url(url: str) -> str:
    """A store URL for a message: any user:password@ left out."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}" if sep else url


def socket_of(raw) -> object | None:
    """The socket under a streaming urllib3 response (2.x), or None where the layout differs."""
    sock = getattr(getattr(raw, "_connection", None), "sock", None)
    return sock if hasattr(sock, "settimeout") else None


class Transfer:
    """One read from a store (a manifest, a blob, index.json, a listing) under download_policy's
    rules, as every download: a whole deadline (`download.deadline` for a layer,
    `download.listing_deadline` for everything small) and `download.min_rate` over
    `download.rate_window`.  One begun inside another ends by the outer one's deadline too."""

    def __init__(self, url: str, what: str, deadline: Deadline, policy: RetryPolicy):
        self.url, self.what, self.deadline, self.policy = shown_url(url), what, deadline, policy

    def expired(self) -> bool:
        return self.deadline.left() <= 0

    def timeout(self, seconds: float) -> float:
        """A wait of `seconds` (the store's timeout), shortened to end by the deadline."""
        return self.deadline.timeout(seconds)

    def pace(self) -> Pace:
        return Pace(self.policy, self.deadline)

    def stop(self, why: str) -> StoreUnreachable:
        """The one line for a read stopped by the policy: the store, what, and the key to raise."""
        if why.startswith("too slow"):
            return StoreUnreachable(f"{self.url}: {self.what}: {why}",
                                    "the store or the link is slow; a slow link may lower the "
                                    "least rate: rocforge config set download.min_rate BYTES_PER_S "
                                    "(0 turns the check off)")
        return TransferExpired(f"{self.url}: {self.what}: {why}",
                               "the store or the link is slow; a slow link may raise the limit: "
                               f"rocforge config set {self.deadline.key} SECONDS")

    def expired_error(self) -> TransferExpired:
        return self.stop(f"still receiving at {self.deadline.words()}")  # type: ignore[return-value]

    def paced(self, fh: BinaryIO) -> _PacedReader:
        return _PacedReader(fh, self)


class _PacedReader:
    """A store's byte stream read under a Transfer: each read's wait ends by the deadline (where
    the stream lets its socket be told), and each chunk is counted against the pace."""

    def __init__(self, fh: BinaryIO, transfer: Transfer, pace: Pace | _SharedPace | None = None):
        self.fh, self.transfer, self.pace = fh, transfer, pace or transfer.pace()
        if hasattr(fh, "deadline"):
            fh.deadline = transfer.deadline

    def read(self, size: int = CHUNK) -> bytes:
        return self._paced(lambda: self.fh.read(size), len)

    def readinto(self, buffer: memoryview) -> int:
        """As `read`, into `buffer` (the stream's own readinto: no bytes object per read)."""
        return self._paced(lambda: self.fh.readinto(buffer), int)

    def _paced(self, reading, counted):
        """One read of the stream within the transfer's deadline, its bytes counted to its pace."""
        if self.transfer.expired():
            raise self.transfer.expired_error()
        try:
            got = reading()
        except StoreUnreachable:
            if self.transfer.expired():
                raise self.transfer.expired_error() from None
            raise
        if got:
            why = self.pace.add(counted(got))
            if why is not None:
                raise self.transfer.stop(why)
        return got


class _SharedPace:
    """One Pace for the parallel streams of one transfer: the least rate and the deadline judge
    the bytes of all of them together."""

    def __init__(self, pace: Pace):
        self.pace, self.lock = pace, threading.Lock()

    def add(self, count: int) -> str | None:
        with self.lock:
            return self.pace.add(count)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(value: object, where: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise StoreError(f"{where}: not a sha256 digest: {str(value)[:80]!r}")
    return value


def check_tag(value: str, where: str) -> str:
    if not TAG.fullmatch(value):
        raise StoreError(f"{where}: not an OCI tag: {value[:80]!r}")
    return value


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for a subject: `sha256-<hex>`."""
    return check_digest(digest, "referrers subject").replace(":", "-")


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: what a manifest or index says of one blob or manifest."""

    media_type: str
    digest: str
    size: int
    artifact_type: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        d: dict = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            d["artifactType"] = self.artifact_type
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        return d

    @classmethod
    def of(cls, value: object, where: str) -> Descriptor:
        if not isinstance(value, dict):
            raise StoreError(f"{where}: a descriptor is not a JSON object")
        media_type = value.get("mediaType")
        if not isinstance(media_type, str) or not _MEDIA_TYPE.fullmatch(media_type):
            raise StoreError(f"{where}: bad mediaType {str(media_type)[:80]!r}")
        size = value.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 1 << 50:
            raise StoreError(f"{where}: bad size {str(size)[:40]!r}")
        artifact_type = value.get("artifactType")
        if artifact_type is not None and (not isinstance(artifact_type, str)
                                          or not _MEDIA_TYPE.fullmatch(artifact_type)):
            raise StoreError(f"{where}: bad artifactType {str(artifact_type)[:80]!r}")
        annotations = value.get("annotations") or {}
        if not isinstance(annotations, dict) or len(annotations) > 64 or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 4096
                for k, v in annotations.items()):
            raise StoreError(f"{where}: bad annotations")
        return cls(media_type, check_digest(value.get("digest"), where), size, artifact_type,
                   dict(annotations))

    @classmethod
    def for_bytes(cls, media_type: str, data: bytes, **kw) -> Descriptor:
        return cls(media_type, sha256_digest(data), len(data), **kw)


@dataclass(frozen=True)
class Manifest:
    """An OCI image manifest as rocforge reads it: its exact bytes (what signatures cover) and
    the typed fields of those bytes."""

    data: bytes
    digest: str
    artifact_type: str | None
    config: Descriptor
    layers: tuple[Descriptor, ...]
    subject: Descriptor | None
    annotations: dict[str, str]

    @classmethod
    def parse(cls, data: bytes, where: str, *, digest: str | None = None) -> Manifest:
        actual = sha256_digest(data)
        if digest is not None and actual != digest:
            raise StoreError(f"{where}: the manifest's bytes do not match its digest {digest}")
        doc = json_object(data, where)
        if doc.get("schemaVersion") != 2 or doc.get("mediaType", MANIFEST) != MANIFEST:
            raise StoreError(f"{where}: not an OCI image manifest")
        layers = doc.get("layers")
        if not isinstance(layers, list) or len(layers) > 256:
            raise StoreError(f"{where}: bad layers")
        subject = doc.get("subject")
        annotations = Descriptor.of({"mediaType": "a/b", "digest": "sha256:" + "0" * 64, "size": 0,
                                     "annotations": doc.get("annotations") or {}}, where).annotations
        artifact_type = doc.get("artifactType")
        if artifact_type is not None and (not isinstance(artifact_type, str)
                                          or not _MEDIA_TYPE.fullmatch(artifact_type)):
            raise StoreError(f"{where}: bad artifactType")
        config = Descriptor.of(doc.get("config"), f"{where} config")
        return cls(data, actual, artifact_type or config.media_type, config,
                   tuple(Descriptor.of(v, f"{where} layer {i}") for i, v in enumerate(layers)),
                   None if subject is None else Descriptor.of(subject, f"{where} subject"),
                   annotations)

    def descriptor(self, **kw) -> Descriptor:
        return Descriptor(MANIFEST, self.digest, len(self.data), artifact_type=self.artifact_type, **kw)


def make_manifest(*, artifact_type: str, config: Descriptor, layers: list[Descriptor],
                  subject: Descriptor | None = None, annotations: dict[str, str] | None = None) -> bytes:
    """An OCI 1.1 artifact manifest's bytes, canonical (sorted keys, no spaces) so that the same
    artifact made twice has one digest."""
    doc: dict = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": artifact_type,
                 "config": config.to_json(), "layers": [d.to_json() for d in layers]}
    if subject is not None:
        doc["subject"] = Descriptor(subject.media_type, subject.digest, subject.size).to_json()
    if annotations:
        doc["annotations"] = dict(annotations)
    return canonical_json(doc)


def make_index(manifests: list[Descriptor], *, artifact_type: str | None = None,
               annotations: dict[str, str] | None = None) -> bytes:
    doc: dict = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [d.to_json() for d in manifests]}
    if artifact_type:
        doc["artifactType"] = artifact_type
    if annotations:
        doc["annotations"] = dict(annotations)
    return canonical_json(doc)


def parse_index(data: bytes, where: str) -> list[Descriptor]:
    return parse_index_doc(data, where)[0]


def parse_index_doc(data: bytes, where: str) -> tuple[list[Descriptor], str | None, dict[str, str]]:
    """An OCI image index's entries, its artifactType and its annotations, each checked."""
    doc = json_object(data, where)
    if doc.get("schemaVersion") != 2 or doc.get("mediaType", INDEX) != INDEX:
        raise StoreError(f"{where}: not an OCI image index")
    items = doc.get("manifests")
    if not isinstance(items, list) or len(items) > MAX_REFERRERS * 4:
        raise StoreError(f"{where}: bad manifests list")
    artifact_type = doc.get("artifactType")
    if artifact_type is not None and (not isinstance(artifact_type, str)
                                      or not _MEDIA_TYPE.fullmatch(artifact_type)):
        raise StoreError(f"{where}: bad artifactType")
    annotations = Descriptor.of({"mediaType": "a/b", "digest": "sha256:" + "0" * 64, "size": 0,
                                 "annotations": doc.get("annotations") or {}}, where).annotations
    return ([Descriptor.of(v, f"{where} entry {i}") for i, v in enumerate(items)], artifact_type,
            annotations)


def canonical_json(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def json_object(data: bytes, where: str) -> dict:
    """A store's JSON answer (at most MAX_MANIFEST bytes) as an object, or one StoreError line."""
    if len(data) > MAX_MANIFEST:
        raise StoreError(f"{where}: {len(data)} bytes, past the {MAX_MANIFEST}-byte cap")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StoreError(f"{where}: not JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{where}: not a JSON object")
    return doc


class Store:
    """What a substitute store does.  Subclasses move bytes (`_open_blob`, `_put_blob`,
    `_get_manifest`, `_put_manifest`, `tags`); this class checks every byte they return and
    keeps referrers through the tag schema unless the subclass has a referrers API."""

    url: str = ""          # for people: never holds a credential
    writable: bool = True
    _policy: RetryPolicy | None = None  # None: the configuration's [download]
    _transfer: Transfer | None = None  # the read under way (`transfer`)

    @property
    def policy(self) -> RetryPolicy:
        if self._policy is None:
            self._policy = policy_or_config(None)
        return self._policy

    @policy.setter
    def policy(self, value: RetryPolicy | None) -> None:
        self._policy = value

    def new_transfer(self, what: str, *, large: bool = False) -> Transfer:
        """A transfer of its own (`download.deadline` for a layer, else
        `download.listing_deadline`), ending by the one under way if that ends sooner."""
        policy = self.policy
        own = (Deadline.start(policy.deadline, "download.deadline") if large
               else Deadline.start(policy.listing_deadline, "download.listing_deadline"))
        outer = self._transfer
        deadline = own if outer is None or own.at <= outer.deadline.at else outer.deadline
        return Transfer(self.url, what, deadline, policy)

    @contextlib.contextmanager
    def transfer(self, what: str, *, large: bool = False) -> Iterator[Transfer]:
        """Every read inside runs under this transfer (see Transfer)."""
        outer = self._transfer
        self._transfer = current = self.new_transfer(what, large=large)
        try:
            yield current
        finally:
            self._transfer = outer

    def current_transfer(self, what: str) -> Transfer:
        """The transfer under way, or one of its own for a read outside any (a push's answer)."""
        return self._transfer or self.new_transfer(what)

    # -- what a subclass implements --------------------------------------------------------
    ranged = False  # whether `_open_range` answers byte ranges (a large layer's parallel pull)

    def _open_blob(self, digest: str, start: int = 0) -> contextlib.AbstractContextManager[BinaryIO]:
        raise NotImplementedError

    def _open_range(self, digest: str, start: int, end: int,
                    size: int) -> contextlib.AbstractContextManager[BinaryIO]:
        """Bytes `start`-`end` (inclusive) of a blob of `size` bytes as a stream with `readinto`
        (and `abort`, which ends a read under way from another thread); RangeRefused where the
        store answered with the whole blob, StoreError (`check_range`) for any other range."""
        raise NotImplementedError

    def has_blob(self, digest: str) -> bool:
        raise NotImplementedError

    def _put_blob(self, fh: BinaryIO, desc: Descriptor) -> None:
        raise NotImplementedError

    def _get_manifest(self, ref: str) -> tuple[bytes, str]:
        """(bytes, media type) of the manifest or index a tag or digest names; at most
        MAX_MANIFEST + 1 bytes read; StoreError "not found" when there is none."""
        raise NotImplementedError

    def _put_manifest(self, data: bytes, media_type: str, ref: str) -> None:
        raise NotImplementedError

    def _tags(self) -> list[str]:
        raise NotImplementedError

    def _native_referrers(self, digest: str) -> list[Descriptor] | None:
        """The referrers API's answer, or None where the store has none (the tag schema)."""
        return None

    def close(self) -> None:
        pass

    # -- checked operations ------------------------------------------------------------------
    def not_found(self, what: str) -> StoreError:
        return NotFound(f"{self.url}: no {what}")

    def tags(self) -> list[str]:
        with self.transfer("the tags"):
            return self._tags()

    def manifest(self, ref: str) -> Manifest:
        digest = ref if ref.startswith("sha256:") else None
        if digest:
            check_digest(digest, self.url)
        else:
            check_tag(ref, self.url)
        with self.transfer(f"manifest {ref[:80]}"):
            data, media_type = self._get_manifest(ref)
        if media_type != MANIFEST:
            raise StoreError(f"{self.url}: {ref} is a {media_type[:60]}, not an OCI image manifest")
        return Manifest.parse(data, f"{self.url} {ref}", digest=digest)

    def index(self, ref: str) -> list[Descriptor]:
        return self.index_doc(ref)[0]

    def index_doc(self, ref: str) -> tuple[list[Descriptor], str | None, dict[str, str], bytes]:
        """An index's entries, artifactType, annotations and exact bytes (`ref`: a tag or digest)."""
        if ref.startswith("sha256:"):
            check_digest(ref, self.url)
        else:
            check_tag(ref, self.url)
        with self.transfer(f"index {ref[:80]}"):
            data, media_type = self._get_manifest(ref)
        if media_type != INDEX:
            raise StoreError(f"{self.url}: {ref[:80]} is a {media_type[:60]}, not an OCI image index")
        if ref.startswith("sha256:") and sha256_digest(data) != ref:
            raise StoreError(f"{self.url}: the index's bytes do not match its digest {ref}")
        return (*parse_index_doc(data, f"{self.url} {ref[:80]}"), data)

    def push_index(self, data: bytes, *, tag: str) -> str:
        """Store an index under its digest and `tag`; its digest."""
        if not self.writable:
            raise StoreError(f"{self.url} is read-only")
        parse_index_doc(data, f"{self.url} new index")
        self._put_manifest(data, INDEX, check_tag(tag, self.url))
        return sha256_digest(data)

    # -- removal (`rocforge store gc`): what a subclass implements --------------------------------
    def delete_manifest(self, digest: str, size: int) -> None:
        """Remove a manifest or index by digest, and every tag naming it."""
        raise StoreError(f"{self.url}: this store cannot remove what it holds")

    def delete_blob(self, digest: str) -> None:
        raise StoreError(f"{self.url}: this store cannot remove what it holds")

    def delete_tag(self, tag: str) -> None:
        raise StoreError(f"{self.url}: this store cannot remove what it holds")

    def read_blob(self, desc: Descriptor, cap: int = MAX_SMALL_BLOB, what: str = "blob") -> bytes:
        """A small blob's bytes (`what`: its name in a message, "key document"), checked against
        its descriptor (size first, then digest), read within one transfer."""
        if desc.size > cap:
            raise StoreError(f"{self.url}: blob {desc.digest[:19]} is {desc.size} bytes, past the "
                             f"{cap}-byte cap")
        with self.transfer(f"{what} {desc.digest[:19]}") as transfer, \
                self._open_blob(desc.digest) as fh:
            data = _read_exact(transfer.paced(fh), desc.size, f"{self.url}: blob {desc.digest[:19]}")
        if sha256_digest(data) != desc.digest:
            raise StoreError(f"{self.url}: blob {desc.digest[:19]}'s bytes do not match its digest")
        return data

    def fetch_blob(self, desc: Descriptor, dest: Path, *, cap: int, retries: int = 3) -> None:
        """Stream a blob into `dest` (a new file), checking its size as it comes and its digest
        at the end, hashed as the bytes come, in order (never read back).  A blob of at least
        RANGED_THRESHOLD bytes from a store that answers ranges begins as one stream; where its
        first RANGED_PIECE bytes came slower than RANGED_ENOUGH bytes/s (or on a machine of
        RANGED_CORES cores or more, whatever their rate), the rest comes as
        RANGED_STREAMS parallel range requests (`_RangedPull`), and a store that answers one
        with the whole blob has the rest come as one stream again.  A connection that drops mid-blob (or mid-range) is resumed
        from where it stopped (a Range request) up to `retries` times.  The transfer's deadline
        and least rate judge the whole pull.  On any failure `dest` is removed."""
        if desc.size > cap:
            raise StoreError(f"{self.url}: layer {desc.digest[:19]} is {desc.size} bytes, past the "
                             f"{cap}-byte cap (substitute.max_layer_bytes)")
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        ok = False
        try:
            with os.fdopen(fd, "wb") as out, _HashingWriter(out) as sink, \
                    self.transfer(f"layer {desc.digest[:19]}", large=True) as transfer:
                switch = None
                if self.ranged and RANGED_STREAMS > 1 and desc.size >= RANGED_THRESHOLD:
                    switch = _slow_for_one_stream(desc.size)
                got = self._stream(desc, 0, sink, transfer, retries, switch)
                if got < desc.size:  # switched: the rest as parallel ranges
                    sink.drain()
                    out.flush()
                    got = _RangedPull(self, desc, got, out.fileno(), sink.hash, transfer, retries).run()
                    out.seek(got)
                    self._stream(desc, got, sink, transfer, retries)
                digest = sink.finish()
            if digest != desc.digest:
                raise StoreError(f"{self.url}: layer {desc.digest[:19]}'s bytes do not match its digest")
            ok = True
        except OSError as exc:  # writing `dest` (a full disk, an I/O error): named for the line
            if exc.filename is None:
                exc.filename = str(dest)
            raise
        finally:
            if not ok:
                with contextlib.suppress(OSError):
                    os.unlink(dest)

    def _stream(self, desc: Descriptor, got: int, sink: _HashingWriter, transfer: Transfer,
                retries: int, switch=None) -> int:
        """The blob from byte `got` to its end as one stream into `sink`, resumed as said, or
        up to where `switch(got)` says the rest is to come otherwise (the stream then closed):
        the bytes it got."""
        attempt = 0
        while got < desc.size:
            try:
                with self._open_blob(desc.digest, got) as raw:
                    fh = transfer.paced(raw)
                    while got < desc.size:
                        want = min(CHUNK, desc.size - got)
                        if switch is not None and got < RANGED_PIECE:  # judged at that byte
                            want = min(want, RANGED_PIECE - got)
                        chunk = fh.read(want)
                        if not chunk:
                            break
                        sink.put(chunk)
                        got += len(chunk)
                        if switch is not None and switch(got):
                            return got
                    if got == desc.size and fh.read(1):
                        raise StoreError(f"{self.url}: layer {desc.digest[:19]} is longer than "
                                         f"its {desc.size} bytes")
            except TransferExpired:
                raise
            except StoreUnreachable:
                if attempt >= retries:
                    raise
            if got < desc.size:
                attempt += 1
                if attempt > retries:
                    raise StoreUnreachable(
                        f"{self.url}: layer {desc.digest[:19]} stopped at {got} of {desc.size} "
                        f"bytes after {retries} resumes")
        return got

    def push_blob_bytes(self, data: bytes, media_type: str) -> Descriptor:
        import io

        desc = Descriptor.for_bytes(media_type, data)
        if not self.has_blob(desc.digest):
            self._put_blob(io.BytesIO(data), desc)
        return desc

    def push_blob_file(self, path: Path, media_type: str) -> Descriptor:
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
                size += len(chunk)
        desc = Descriptor(media_type, "sha256:" + h.hexdigest(), size)
        if not self.has_blob(desc.digest):
            with open(path, "rb") as fh:
                self._put_blob(fh, desc)
        return desc

    def push_manifest(self, data: bytes, *, tag: str | None = None) -> Manifest:
        """Store a manifest under its digest (and `tag`); one with a subject is added to the
        subject's referrers (the API where the store has one, else the tag schema's index)."""
        if not self.writable:
            raise StoreError(f"{self.url} is read-only")
        man = Manifest.parse(data, f"{self.url} new manifest")
        self._put_manifest(data, MANIFEST, man.digest)
        if tag is not None:
            self._put_manifest(data, MANIFEST, check_tag(tag, self.url))
        if man.subject is not None and not self._referrers_native_on_push(man):
            self._add_to_fallback_index(man)
        return man

    def _referrers_native_on_push(self, man: Manifest) -> bool:
        """Whether the store itself keeps `man` among its subject's referrers (a registry that
        answered the push with an OCI-Subject header)."""
        return False

    def _add_to_fallback_index(self, man: Manifest) -> None:
        """`man` added to its subject's tag-schema index, and read back: a registry has no
        conditional write, so an addition another writer's replaced is made again."""
        tag = fallback_tag(man.subject.digest)
        desc = man.descriptor(annotations=dict(man.annotations))
        for attempt in range(FALLBACK_TRIES + 1):
            try:
                entries = self.index(tag)
            except NotFound:
                entries = []
            if any(e.digest == desc.digest for e in entries):
                return
            if attempt < FALLBACK_TRIES:
                self._put_manifest(make_index([*entries, desc]), INDEX, tag)
        raise StoreError(f"{self.url}: the referrers of {man.subject.digest[:19]} kept changing under "
                         f"this write ({FALLBACK_TRIES} tries)", "publish again")

    def referrers(self, digest: str, artifact_type: str | None = None) -> list[Descriptor]:
        check_digest(digest, self.url)
        with self.transfer(f"the referrers of {digest[:19]}"):
            found = self._native_referrers(digest)
            if found is None:
                try:
                    found = self.index(fallback_tag(digest))
                except NotFound:
                    found = []
        if len(found) > MAX_REFERRERS:
            raise StoreError(f"{self.url}: {digest[:19]} has {len(found)} referrers, past {MAX_REFERRERS}")
        return [d for d in found if artifact_type is None or d.artifact_type == artifact_type]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _slow_for_one_stream(size: int):
    """A large layer's `switch` (Store._stream): once its first RANGED_PIECE bytes are in, true
    when they came slower than RANGED_ENOUGH, or this machine has RANGED_CORES cores or more, and a
    range or more is left (then never again)."""
    began, judged = time.monotonic(), False

    def switch(got: int) -> bool:
        nonlocal judged
        if judged or got < RANGED_PIECE:
            return False
        judged = True
        slow = got < RANGED_ENOUGH * (time.monotonic() - began)
        return (slow or (os.cpu_count() or 1) >= RANGED_CORES) and size - got >= RANGED_PIECE

    return switch


class _RangedPull:
    """A large blob as parallel range requests of RANGED_PIECE bytes: RANGED_STREAMS workers
    each take the next piece and receive it into a buffer of its own, while the caller's thread
    hashes the pieces in order as their bytes arrive and a writer thread writes what was hashed,
    in order, to the file: the digest needs no second read, the bytes written are the bytes
    hashed, the file grows in order (parallel writes to one file at scattered offsets contend
    on its inode and were slower, measured), and at most 2 x RANGED_STREAMS pieces are held.  It
    begins where one stream of the blob has already been answered (credentials settled), so
    every stream starts at once; a store that answers a range with the whole blob
    (RangeRefused) has the rest come as one stream from the bytes hashed so far.  One Pace judges all the streams together; each read waits at most until the
    transfer's deadline; a piece whose connection drops is resumed from where it stopped up to
    `retries` times.  The first error stops every stream (their sockets shut down) and is
    raised."""

    def __init__(self, store: Store, desc: Descriptor, start: int, fd: int, hash_,
                 transfer: Transfer, retries: int):
        self.store, self.desc, self.fd, self.hash, self.transfer = store, desc, fd, hash_, transfer
        self.hashed_out: queue.Queue[tuple[int, bytearray, int, int] | None] = queue.Queue()
        self.write_error: OSError | None = None
        self.retries, self.pace = retries, _SharedPace(transfer.pace())
        self.where = f"{store.url}: layer {desc.digest[:19]}"
        self.pieces = [(at, min(at + RANGED_PIECE, desc.size))
                       for at in range(start, desc.size, RANGED_PIECE)]
        self.start = start
        self.window = 2 * RANGED_STREAMS
        self.cond = threading.Condition()
        self.taken = 0       # pieces handed to a worker
        self.written = 0     # pieces hashed and written whole
        self.buffers: dict[int, bytearray] = {}  # pieces being received or hashed
        self.filled: dict[int, int] = {}
        self.spare: list[bytearray] = []
        self.streams: set = set()
        self.error: BaseException | None = None
        self.refused = False
        self.stopped = False

    def run(self) -> int:
        """The bytes hashed, in order, and written: the blob's size, or fewer where the store
        refused a range (the rest comes as one stream)."""
        workers = [threading.Thread(target=self._work, args=(n,), name=f"rocforge-range-{n}",
                                    daemon=True) for n in range(RANGED_STREAMS)]
        writer = threading.Thread(target=self._write, name="rocforge-range-writer", daemon=True)
        writer.start()
        for worker in workers:
            worker.start()
        try:
            at = self._hash_in_order()
            if not self.refused:  # every range read to its end (a longer one is refused) first
                for worker in workers:
                    worker.join(max(0.01, self.transfer.deadline.left()))
                    if worker.is_alive():
                        raise self.transfer.expired_error()
                if self.error is not None:
                    raise self.error
        finally:
            self._stop()
            for worker in workers:
                worker.join(2.0)
            self.hashed_out.put(None)
            writer.join()  # every byte hashed is in the file (or the error it met) before the rest
        if self.write_error is not None:
            raise self.write_error
        return at

    def _write(self) -> None:
        """What the caller's thread hashed, written in order at the file's position."""
        while (item := self.hashed_out.get()) is not None:
            index, buffer, start, end = item
            if self.write_error is None:
                view = memoryview(buffer)[start:end]
                try:
                    while view:
                        view = view[os.write(self.fd, view):]
                except OSError as exc:
                    self.write_error = exc
                    self._stop()
                finally:
                    view.release()
            if end == self.pieces[index][1] - self.pieces[index][0]:
                with self.cond:
                    self.spare.append(buffer)
                    self.written = index + 1
                    self.cond.notify_all()

    def _hash_in_order(self) -> int:
        at = self.start
        for index, (start, end) in enumerate(self.pieces):
            done = 0
            while start + done < end:
                with self.cond:
                    while True:
                        if self.error is not None:
                            raise self.error
                        if self.write_error is not None:
                            raise self.write_error
                        if self.filled.get(index, 0) > done:
                            break
                        if self.refused:
                            return at
                        left = self.transfer.deadline.left()
                        if left <= 0:
                            raise self.transfer.expired_error()
                        self.cond.wait(min(left, 1.0))
                    filled, buffer = self.filled[index], self.buffers[index]
                self.hash.update(memoryview(buffer)[done:filled])
                self.hashed_out.put((index, buffer, done, filled))
                done = filled
                at = start + done
            with self.cond:
                del self.buffers[index]
        return at

    def _stop(self) -> None:
        with self.cond:
            self.stopped = True
            streams = list(self.streams)
            self.cond.notify_all()
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.abort()

    def _work(self, n: int) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopped and self.taken < len(self.pieces) and \
                            self.taken >= self.written + self.window:
                        self.cond.wait(1.0)
                    if self.stopped or self.taken >= len(self.pieces):
                        return
                    index = self.taken
                    self.taken += 1
                    buffer = self.spare.pop() if self.spare else None
                if buffer is None:
                    buffer = bytearray(RANGED_PIECE)
                with self.cond:
                    self.buffers[index] = buffer
                self._piece(index, buffer)
        except RangeRefused:
            with self.cond:
                self.refused = True
            self._stop()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            with self.cond:
                if self.error is None and not self.stopped:
                    self.error = exc
            self._stop()

    def _piece(self, index: int, buffer: bytearray) -> None:
        start, end = self.pieces[index]
        length, got, attempt = end - start, 0, 0
        view = memoryview(buffer)
        while got < length:
            try:
                with self.store._open_range(self.desc.digest, start + got, end - 1, self.desc.size) as raw:
                    with self.cond:
                        if self.stopped:
                            return
                        self.streams.add(raw)
                    try:
                        fh = _PacedReader(raw, self.transfer, self.pace)
                        while got < length:
                            count = fh.readinto(view[got:min(length, got + CHUNK)])
                            if not count or self.stopped:
                                break
                            got += count
                            with self.cond:
                                self.filled[index] = got
                                self.cond.notify_all()
                        if self.stopped:
                            return
                        if got == length and fh.readinto(bytearray(1)):
                            raise StoreError(f"{self.where}: the range from byte {start} is longer "
                                             f"than its {length} bytes")
                    finally:
                        with self.cond:
                            self.streams.discard(raw)
            except (TransferExpired, RangeRefused):
                raise
            except StoreUnreachable:
                if self.stopped:
                    return
                if attempt >= self.retries:
                    raise
            if got < length:
                attempt += 1
                if attempt > self.retries:
                    raise StoreUnreachable(f"{self.where}: the range from byte {start} stopped at "
                                           f"{start + got} after {self.retries} resumes")


class NotFound(StoreError):
    """What the store does not hold (a miss, not an attack)."""


def _read_exact(fh: BinaryIO, size: int, where: str) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = fh.read(min(CHUNK, size - got))
        if not chunk:
            raise StoreUnreachable(f"{where}: ended after {got} of {size} bytes")
        parts.append(chunk)
        got += len(chunk)
    if fh.read(1):
        raise StoreError(f"{where}: longer than its {size} bytes")
    return b"".join(parts)


def read_capped(fh: BinaryIO, cap: int, where: str) -> bytes:
    """At most `cap` bytes of a reply whose length is not known ahead (a manifest), read a chunk
    at a time (so a paced stream judges each)."""
    parts: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = fh.read(min(CHUNK, cap + 1 - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got > cap:
        raise StoreError(f"{where}: past the {cap}-byte cap")
    return b"".join(parts)


def chunks(fh: BinaryIO) -> Iterator[bytes]:
    return iter(lambda: fh.read(CHUNK), b"")
