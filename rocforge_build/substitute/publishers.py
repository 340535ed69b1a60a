"""Many publishers of one build key in one store, none hiding another's.

Every build is an artifact kept by its digest.  Each publisher key owns one tag per build key,
`rocforge-<key hex>-<key id>` (90 characters: an OCI tag holds 128), naming an OCI image index of
every artifact that key published for that build key, signed by it: the index's annotations
carry a minisign signature of a canonical document of its entries (`_signed`), so a reader
believes the list, its order and its dates only when a trusted key's signature of them holds.
A consumer computes the tags of its trusted keys (no tag listing is needed) and takes any artifact
one of them lists; the single tag of earlier stores, `rocforge-<key hex>`, is read too, and a
publisher sets it only where no one has (so a store's first publisher keeps it for older
rocforge).  As an index, the list also keeps its builds alive in a registry: what an index names
is never an untagged manifest to the registry's own garbage collection."""

from __future__ import annotations

import random
import re
import time

from rocforge_build.forge.substitute_key import TAG_PREFIX, SubstituteKey
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import oci, signing
from rocforge_build.substitute.oci import Descriptor, Manifest, NotFound, Store, StoreError

INDEX_TYPE = "application/vnd.rocforge.build-index.v1"
SIGNATURE = "dev.rocforge.index.signature"
SIGNER = "dev.rocforge.signer"  # artifact.SIGNER: a hint, the signature decides
CREATED = "org.opencontainers.image.created"
SCHEMA = "rocforge.build-index/1"
MAX_ENTRIES = 256  # one publisher's artifacts of one build key; the oldest go past it
MAX_CANDIDATES = 8  # the artifacts of one key a pull checks, newest first
WRITE_TRIES = 5  # a registry has no conditional write: an index read back and written again

_TAG = re.compile(re.escape(TAG_PREFIX) + r"([0-9a-f]{64})(?:-([0-9A-F]{16}))?")
_CREATED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


class IndexRefused(StoreError):
    """A publisher's index that is not believed: unsigned, signed by another key, malformed."""


def publisher_tag(key_digest: str, key_id: str) -> str:
    return oci.check_tag(f"{TAG_PREFIX}{oci.check_digest(key_digest, 'key').removeprefix('sha256:')}-{key_id}",
                         "publisher tag")


def parse_tag(tag: str) -> tuple[str, str | None] | None:
    """(key digest, publisher key id or None for the single tag of earlier stores) of a tag
    rocforge names builds by, else None (a nightly advisory's tag, anything else)."""
    found = _TAG.fullmatch(tag)
    return None if found is None else ("sha256:" + found.group(1), found.group(2))


def created(desc: Descriptor | Manifest) -> str:
    """The date an artifact says it was made (ISO 8601, UTC), or "" when it says none."""
    value = desc.annotations.get(CREATED, "")
    return value if _CREATED.fullmatch(value) else ""


def _signed(key_digest: str, key_id: str, entries: list[Descriptor]) -> bytes:
    return oci.canonical_json({"schema": SCHEMA, "key": key_digest, "publisher": key_id,
                               "manifests": [e.to_json() for e in entries]})


def _comment(key_digest: str, signed: bytes) -> str:
    return f"rocforge index {key_digest} {oci.sha256_digest(signed)}"


def make_index(key_digest: str, entries: list[Descriptor], pair: signing.KeyPair) -> bytes:
    signed = _signed(key_digest, pair.key_id, entries)
    signature = signing.sign(signed, pair, _comment(key_digest, signed))
    return oci.make_index(entries, artifact_type=INDEX_TYPE,
                          annotations={SIGNER: pair.key_id, SIGNATURE: signature})


def entry_of(man: Manifest) -> Descriptor:
    return man.descriptor(annotations={k: v for k, v in man.annotations.items() if k == CREATED})


def read_index(store: Store, key_digest: str, public: signing.PublicKey) -> list[Descriptor] | None:
    """The artifacts `public`'s key lists for this build key, newest first; None where it lists
    none; IndexRefused (one line) for an index its signature does not hold for."""
    tag = publisher_tag(key_digest, public.key_id)
    try:
        entries, artifact_type, annotations, _ = store.index_doc(tag)
    except NotFound:
        return None
    except IndexRefused:
        raise
    except StoreError as exc:
        if isinstance(exc, oci.StoreUnreachable):
            raise
        raise IndexRefused(f"the index {tag[:25]}...-{public.key_id} is unreadable: {exc.message}") from None
    where = f"the index {tag[:25]}...-{public.key_id}"
    if artifact_type != INDEX_TYPE:
        raise IndexRefused(f"{where} is not a rocforge build index")
    text = annotations.get(SIGNATURE)
    if not text:
        raise IndexRefused(f"{where} is not signed")
    if len(entries) > MAX_ENTRIES:
        raise IndexRefused(f"{where} lists {len(entries)} artifacts, past {MAX_ENTRIES}")
    signed = _signed(key_digest, public.key_id, entries)
    try:
        verified = signing.verify(signed, text, [public])
    except signing.SignatureError as exc:
        raise IndexRefused(f"{where}: {exc.message}") from None
    if verified.trusted_comment != _comment(key_digest, signed):
        raise IndexRefused(f"{where}: its signature names another list")
    # the key's window and revocations (substitute/keys.py), the list claiming its newest entry's time
    distrust = signing.trust_problem(verified.key, signing.claimed_time(max(map(created, entries), default=None)))
    if distrust:
        raise IndexRefused(f"{where}: {distrust}")
    seen: set[str] = set()
    out = []
    for e in entries:
        if e.media_type != oci.MANIFEST or e.artifact_type not in (None, oci.BUILD_TYPE):
            raise IndexRefused(f"{where} names {e.digest[:19]}, which is not a build manifest")
        if e.digest not in seen:
            seen.add(e.digest)
            out.append(e)
    return sorted(out, key=created, reverse=True)


def add(store: Store, key: SubstituteKey, man: Manifest, pair: signing.KeyPair) -> tuple[str, list[str]]:
    """`man` added to `pair`'s index of `key` (re-signed), and read back: a registry has no
    conditional write, so a write that another one of the same key's replaced is made again.
    (the tag, lines saying what was dropped)."""
    tag = publisher_tag(key.digest, pair.key_id)
    notes: list[str] = []
    for attempt in range(WRITE_TRIES):
        try:
            entries = read_index(store, key.digest, pair.public) or []
        except IndexRefused as exc:
            notes.append(f"{exc.message}: written anew")
            entries = []
        if any(e.digest == man.digest for e in entries):
            return tag, notes
        entries = sorted([entry_of(man), *entries], key=created, reverse=True)
        if len(entries) > MAX_ENTRIES:
            notes.append(f"the {len(entries) - MAX_ENTRIES} oldest artifact(s) of this key dropped "
                         f"from the index (it lists at most {MAX_ENTRIES})")
            entries = entries[:MAX_ENTRIES]
        store.push_index(make_index(key.digest, entries, pair), tag=tag)
        time.sleep(random.uniform(0.0, 0.05 * (attempt + 1)))
    try:
        if any(e.digest == man.digest for e in read_index(store, key.digest, pair.public) or []):
            return tag, notes
    except IndexRefused:
        pass
    raise StoreError(f"{store.url}: the index {tag[:25]}... kept losing this artifact to other writes "
                     f"of the same key ({WRITE_TRIES} tries)", "publish again")


def legacy_tag(key_digest: str) -> str:
    """The single tag of earlier stores: `rocforge-<key hex>` (SubstituteKey.tag)."""
    return TAG_PREFIX + oci.check_digest(key_digest, "key").removeprefix("sha256:")


def candidates(store: Store, key_digest: str, trusted: list[signing.PublicKey],
               notes: list[str]) -> list[Manifest]:
    """The artifacts of `key` the trusted keys' indexes list (each index's signature checked;
    one ignored says why in `notes`) and the one under the single tag of earlier stores, newest
    first, at most MAX_CANDIDATES; each still to be checked (`artifact.check_build`,
    `artifact.signed_by`) before it is used."""
    with store.transfer(f"the indexes of {key_digest[:19]}"):  # all of them within one listing deadline
        return _candidates(store, key_digest, trusted, notes)


def _candidates(store: Store, key_digest: str, trusted: list[signing.PublicKey],
                notes: list[str]) -> list[Manifest]:
    listed: dict[str, str] = {}
    seen_ids: set[str] = set()
    for public in trusted:
        if public.key_id in seen_ids:
            continue
        seen_ids.add(public.key_id)
        try:
            entries = read_index(store, key_digest, public)
        except IndexRefused as exc:
            notes.append(f"{store.url}: {exc.message}: ignored")
            continue
        for e in entries or []:
            listed.setdefault(e.digest, created(e))
    found: dict[str, Manifest] = {}
    try:
        legacy = store.manifest(legacy_tag(key_digest))
    except NotFound:
        legacy = None
    if legacy is not None:
        found[legacy.digest] = legacy
        listed.setdefault(legacy.digest, created(legacy))
    order = sorted(listed, key=lambda d: listed[d], reverse=True)
    if len(order) > MAX_CANDIDATES:
        notes.append(f"{store.url}: {len(order) - MAX_CANDIDATES} older artifact(s) of this key not "
                     f"checked (the {MAX_CANDIDATES} newest are)")
    out = []
    for digest in order[:MAX_CANDIDATES]:
        if digest not in found:
            try:
                found[digest] = store.manifest(digest)
            except oci.StoreUnreachable:
                raise
            except StoreError as exc:
                notes.append(f"{store.url}: an index names {digest[:19]}: {one_line(exc.message)}")
                continue
        out.append(found[digest])
    return out
