"""Known-bad advisories about TheRock nightlies published to a store: subject-less signed OCI
artifacts tagged `rocforge-nightly-advisory-<hex>`, read back as known_bad.KnownBad entries so
that `nightly install` honours them exactly as the packaged table, and only when a trusted key
signed them."""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Callable

from rocforge_build.discover.known_bad import KnownBad
from rocforge_build.discover.rocm_version import version_key
from rocforge_build.nightly.listing import _VERSION
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import artifact, oci, signing
from rocforge_build.substitute.oci import Store, StoreError

SCHEMA = "rocforge.nightly-advisory/1"
TAG_PREFIX = "rocforge-nightly-advisory-"
MAX_TAGS = 256
MAX_DOCUMENT = 16 << 10
MAX_REASON = 500
MAX_LINES = 8  # lines about advisories left out, per store
READ_BUDGET = 3  # timeouts one store may spend on its advisories before the install goes on
_VERSION_RE = re.compile(_VERSION)
_TARGET_RE = re.compile(r"gfx[0-9a-fA-F]{3,5}")


def comment(document_digest: str) -> str:
    return f"rocforge nightly-advisory {document_digest}"


def make_document(first: str, last: str, targets: list[str], reason: str, version: str) -> dict:
    """The advisory's document, checked as a reader will check it (so nothing unreadable is published)."""
    doc = {"schema": SCHEMA, "first": first, "last": last, "targets": sorted(set(targets)),
           "reason": reason, "rocforge": version,
           "made_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    _check_document(doc)
    return doc


def publish(store: Store, document: dict, pair: signing.KeyPair) -> str:
    """Push the signed advisory under its tag; the tag."""
    data = oci.canonical_json(document)
    digest = oci.sha256_digest(data)
    empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    layers = [store.push_blob_bytes(data, oci.JSON_LAYER),
              store.push_blob_bytes(signing.sign(data, pair, comment(digest)).encode(), oci.MINISIGN_LAYER)]
    manifest = oci.make_manifest(artifact_type=oci.ADVISORY_TYPE, config=empty, layers=layers,
                                 annotations={artifact.SIGNER: pair.key_id})
    tag = TAG_PREFIX + digest.split(":", 1)[1][:16]
    store.push_manifest(manifest, tag=tag)
    return tag


def _check_document(doc: object) -> KnownBad:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise StoreError(f"not a {SCHEMA} document")
    first, last, targets, reason = doc.get("first"), doc.get("last"), doc.get("targets"), doc.get("reason")
    for name, v in (("first", first), ("last", last)):
        if not isinstance(v, str) or not _VERSION_RE.fullmatch(v):
            raise StoreError(f"{name} {one_line(str(v))[:40]!r} is not a nightly version")
    if version_key(first) > version_key(last):
        raise StoreError(f"first {first} comes after last {last}")
    if not isinstance(targets, list) or len(targets) > 64 or not all(
            isinstance(t, str) and _TARGET_RE.fullmatch(t) for t in targets):
        raise StoreError("targets must be a list of gfx names")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON or "\n" in reason:
        raise StoreError(f"the reason must be one line of at most {MAX_REASON} characters")
    return KnownBad(first, last, tuple(targets), one_line(reason), "")


def _read_one(store: Store, tag: str, trusted: list[signing.PublicKey]) -> tuple[KnownBad, str]:
    man = store.manifest(tag)
    if man.artifact_type != oci.ADVISORY_TYPE or man.subject is not None:
        raise StoreError(f"{tag[:60]} is not a nightly advisory")
    if str(man.annotations.get(artifact.SIGNER)) not in {k.key_id for k in trusted}:
        raise StoreError(f"{tag[:60]}: signed by the key {one_line(str(man.annotations.get(artifact.SIGNER)))[:16]}, "
                         "which is not trusted")
    docs = [d for d in man.layers if d.media_type == oci.JSON_LAYER]
    sigs = [d for d in man.layers if d.media_type == oci.MINISIGN_LAYER]
    if len(docs) != 1 or len(sigs) != 1 or len(man.layers) != 2:
        raise StoreError(f"{tag[:60]}: not one document and one signature")
    data = store.read_blob(docs[0], MAX_DOCUMENT)
    text = store.read_blob(sigs[0], artifact.MAX_SIGNATURE).decode("utf-8", "replace")
    verified = signing.verify(data, text, trusted)
    if verified.trusted_comment != comment(oci.sha256_digest(data)):
        raise StoreError(f"{tag[:60]}: its signature names another document")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise StoreError(f"{tag[:60]}: not JSON") from None
    try:
        bad = _check_document(doc)
    except StoreError as exc:
        raise StoreError(f"{tag[:60]}: {exc.message}") from None
    distrust = signing.trust_problem(verified.key, signing.claimed_time(doc.get("made_at")))
    if distrust:  # the key's window, or its revocation (substitute/keys.py)
        raise StoreError(f"{tag[:60]}: {distrust}")
    return bad, verified.key_id


def nightly_advisories(urls: list[str], trusted: list[signing.PublicKey], timeout: float
                       ) -> tuple[list[KnownBad], list[str]]:
    """The trusted nightly advisories of every store, and one line per advisory left out or
    store that did not answer: nothing a store holds stops an install."""
    from rocforge_build.substitute.stores import open_store

    found: list[KnownBad] = []
    problems: list[str] = []
    for url in urls:
        where = one_line(str(url))[:200]
        try:
            with open_store(url, timeout=timeout) as store:
                tags = [t for t in store.tags() if isinstance(t, str) and t.startswith(TAG_PREFIX)]
                if len(tags) > MAX_TAGS:
                    problems.append(f"{where}: {len(tags)} advisories; only the first {MAX_TAGS} are read")
                deadline = time.monotonic() + READ_BUDGET * timeout
                left_out = []
                for tag in sorted(tags)[:MAX_TAGS]:
                    if time.monotonic() > deadline:
                        problems.append(f"{where}: reading its advisories took past {READ_BUDGET * timeout:g} s; "
                                        "the rest are left out")
                        break
                    try:
                        bad, key_id = _read_one(store, tag, trusted)
                    except (StoreError, signing.SignatureError) as exc:
                        left_out.append(f"{where}: advisory left out: {one_line(exc.message)[:300]}")
                        continue
                    found.append(KnownBad(bad.first, bad.last, bad.targets, bad.symptom,
                                          f"advisory signed by {key_id} in {where}"))
                problems += left_out[:MAX_LINES]
                if len(left_out) > MAX_LINES:
                    problems.append(f"{where}: {len(left_out) - MAX_LINES} more advisories left out")
        except oci.StoreUnreachable as exc:
            problems.append(f"{where}: no nightly advisories read ({one_line(exc.message)[:200]})")
        except Exception as exc:  # noqa: BLE001 - a store's failure never stops an install
            msg = getattr(exc, "message", None) or str(exc)
            problems.append(f"{where}: no nightly advisories read ({one_line(msg)[:200]})")
    return found, problems


def known_bad_finder(substitute_config: dict, warn) -> Callable[..., KnownBad | None]:
    """known_bad.find with the trusted nightly advisories of the configured stores joined to the
    packaged table (`nightly install` and `doctor` ask the same question); each store's problem
    goes to `warn` as one line.  With no store configured: the packaged table, no network."""
    from rocforge_build.discover import known_bad

    if not substitute_config.get("stores"):
        return known_bad.find
    from rocforge_build.substitute import keys

    stores, timeout = list(substitute_config["stores"]), float(substitute_config.get("timeout", 30.0))
    trusted, revocation_lines, _ = keys.with_revocations(
        signing.trusted_keys_from_config(list(substitute_config.get("trusted_keys") or [])), stores, timeout)
    extra, problems = nightly_advisories(stores, trusted, timeout)
    problems = revocation_lines + problems
    for line in problems:
        warn(line)

    def find(version, target=None, family=None):
        return known_bad.find(version, target, family) or next(
            (bad for bad in extra if bad.covers(version) and bad.hits(target, family)), None)
    return find
