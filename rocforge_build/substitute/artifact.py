"""A build as an OCI artifact, and what is attached to it.

The build's manifest has the key document as its config (so the config's digest is the key) and
one layer, the relocatable bundle (ship/bundle.py).  Signatures, evidence and advisories are OCI
1.1 referrers of it: small artifacts whose `subject` is the build's manifest, each holding a JSON
document and its minisign signature, or (a signature) the signature of the build's manifest
bytes.  Reading one back checks every digest, every size and every signature before any field
is believed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rocforge_build.forge.substitute_key import SubstituteKey
from rocforge_build.substitute import oci, signing
from rocforge_build.substitute.oci import Descriptor, Manifest, Store, StoreError

MAX_SIGNATURE = 8 << 10
SIGNER = "dev.rocforge.signer"  # the key id a referrer says signed it (a hint: the signature decides)
MAX_DOCUMENT = 4 << 20


class Refused(StoreError):
    """A store's artifact that rocforge will not use: unsigned, untrusted, altered, re-tagged, or
    named bad by an advisory."""


class KnownBad(Refused):
    """A trusted advisory names this build bad: not pulled, and not compiled either (the same
    inputs make the same bytes) unless the user forces it."""


@dataclass(frozen=True)
class Attached:
    """A signed document attached to a build (evidence or advisory), its signature checked."""

    digest: str  # the referrer's manifest digest
    artifact_type: str
    document: dict
    signer: str  # the key id that signed it


def build_manifest(key: SubstituteKey, config: Descriptor, layer: Descriptor, annotations: dict[str, str]) -> bytes:
    if config.digest != key.digest:
        raise StoreError(f"the key document's digest {config.digest} is not the key {key.digest}")
    return oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config, layers=[layer],
                             annotations=annotations)


def signature_comment(kind: str, *digests: str) -> str:
    return f"rocforge {kind} " + " ".join(digests)


def attach(store: Store, subject: Manifest, artifact_type: str, document: dict | None,
           pair: signing.KeyPair, *, annotations: dict[str, str] | None = None) -> Manifest:
    """A signed referrer of `subject`: for a signature, the signature of the subject's manifest
    bytes; else a JSON document and its signature."""
    empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    if document is None:
        signed = subject.data
        layers = []
        comment = signature_comment("build", subject.digest)
    else:
        signed = oci.canonical_json(document)
        layers = [store.push_blob_bytes(signed, oci.JSON_LAYER)]
        comment = signature_comment(artifact_type.rsplit(".", 2)[-2], subject.digest,
                                    oci.sha256_digest(signed))
    sig = signing.sign(signed, pair, comment).encode()
    layers.append(store.push_blob_bytes(sig, oci.MINISIGN_LAYER))
    data = oci.make_manifest(artifact_type=artifact_type, config=empty, layers=layers,
                             subject=subject.descriptor(),
                             annotations={**(annotations or {}), SIGNER: pair.key_id})
    return store.push_manifest(data)


def _by_trusted(refs: list[Descriptor], trusted: list[signing.PublicKey]) -> tuple[list[Descriptor], list[str]]:
    """The referrers whose annotation names a trusted key (only those are fetched and checked:
    the annotation is a hint, the signature decides), and a line for those that name none, so
    that referrers anyone could add cost nothing and crowd out no good one."""
    ids = {k.key_id for k in trusted}
    named = [r for r in refs if r.annotations.get(SIGNER) in ids]
    others = sorted({str(r.annotations.get(SIGNER, "no key"))[:16] for r in refs
                     if r.annotations.get(SIGNER) not in ids})
    return named, [f"signed by the key {k}, which is not trusted" for k in others[:3]]


def signed_by(store: Store, build: Manifest, trusted: list[signing.PublicKey]) -> str:
    """The id of a trusted key whose signature of the build's manifest bytes holds, or Refused
    saying why none does (no signature, only untrusted keys, or a signature that does not match)."""
    candidates, problems = _by_trusted(store.referrers(build.digest, oci.SIGNATURE_TYPE), trusted)
    for ref in candidates:
        try:
            man = store.manifest(ref.digest)
            sig_layer = _one_layer(man, oci.MINISIGN_LAYER, store)
            text = store.read_blob(sig_layer, MAX_SIGNATURE).decode("utf-8", "replace")
            verified = signing.verify(build.data, text, trusted)
        except (StoreError, signing.SignatureError) as exc:
            problems.append(exc.message)
            continue
        if verified.trusted_comment != signature_comment("build", build.digest):
            problems.append("a signature's trusted comment names another artifact")
            continue
        return verified.key_id
    if not problems:
        raise Refused(f"{store.url}: the build {build.digest[:19]} is not signed",
                      "ask its publisher to sign it (`rocforge publish` signs every build)")
    raise Refused(f"{store.url}: no trusted signature of the build {build.digest[:19]}: {problems[0]}",
                  "trust the publisher's key (substitute.trusted_keys) only if you trust them")


def attached(store: Store, build: Manifest, artifact_type: str,
             trusted: list[signing.PublicKey]) -> tuple[list[Attached], list[str]]:
    """The documents of `artifact_type` attached to a build whose signature by a trusted key
    holds, and one line for each one left out (untrusted, altered, malformed)."""
    candidates, left_out = _by_trusted(store.referrers(build.digest, artifact_type), trusted)
    good = []
    for ref in candidates:
        try:
            man = store.manifest(ref.digest)
            if man.subject is None or man.subject.digest != build.digest:
                raise Refused(f"{ref.digest[:19]} names another subject")
            if man.artifact_type != artifact_type:
                raise Refused(f"{ref.digest[:19]} is not a {artifact_type}")
            doc_layer = _one_layer(man, oci.JSON_LAYER, store)
            sig_layer = _one_layer(man, oci.MINISIGN_LAYER, store)
            data = store.read_blob(doc_layer, MAX_DOCUMENT)
            text = store.read_blob(sig_layer, MAX_SIGNATURE).decode("utf-8", "replace")
            verified = signing.verify(data, text, trusted)
            if not verified.trusted_comment.endswith(f" {build.digest} {oci.sha256_digest(data)}"):
                raise Refused(f"{ref.digest[:19]}: its signature names another document")
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise Refused(f"{ref.digest[:19]}: not a JSON object")
            if doc.get("key") not in (None, "") and doc.get("key") != build.config.digest:
                raise Refused(f"{ref.digest[:19]}: made for another key")
        except (StoreError, signing.SignatureError) as exc:
            left_out.append(exc.message)
            continue
        except (ValueError, RecursionError):
            left_out.append(f"{ref.digest[:19]}: not JSON")
            continue
        good.append(Attached(man.digest, artifact_type, doc, verified.key_id))
    return good, left_out



def in_force(advisories: list[Attached], withdrawals: list[Attached]) -> list[Attached]:
    """The advisories no withdrawal by the key that signed them names: only an advisory's own
    signer takes it back, so one trusted key cannot silence another's warning."""
    taken_back = {(str(w.document.get("withdraws")), w.signer) for w in withdrawals}
    return [a for a in advisories if (a.digest, a.signer) not in taken_back]

def _one_layer(man: Manifest, media_type: str, store: Store) -> Descriptor:
    found = [layer for layer in man.layers if layer.media_type == media_type]
    if len(found) != 1:
        raise Refused(f"{store.url}: {man.digest[:19]} has {len(found)} {media_type} layers, not one")
    return found[0]


def check_build(store: Store, man: Manifest, key: SubstituteKey) -> Descriptor:
    """The bundle layer of a build manifest found under `key`'s tag, once its config is the key
    (an artifact re-tagged under another key is refused) and its shape is a rocforge build's."""
    if man.artifact_type != oci.BUILD_TYPE:
        raise Refused(f"{store.url}: {key.tag[:25]}... is not a rocforge build "
                      f"({str(man.artifact_type)[:60]})")
    if man.config.media_type != oci.KEY_CONFIG or man.config.digest != key.digest:
        raise Refused(f"{store.url}: the artifact under {key.tag[:25]}... was made for another key "
                      f"({man.config.digest[:19]}): re-tagged, not this build",
                      "the store holds a build of other inputs under this key's tag; it is not used")
    document = store.read_blob(man.config, MAX_DOCUMENT)
    if document != key.document:
        why = key.mismatch(json.loads(document)) if document else "empty"
        raise Refused(f"{store.url}: the key document differs: {why}")
    if len(man.layers) != 1 or man.layers[0].media_type != oci.BUNDLE_LAYER:
        raise Refused(f"{store.url}: {man.digest[:19]} does not have one bundle layer")
    return man.layers[0]
