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
from rocforge_build.substitute.oci import Descriptor, Manifest, Store, StoreError, StoreUnreachable

MAX_SIGNATURE = 8 << 10
SIGNER = "dev.rocforge.signer"  # the key id a referrer says signed it (a hint: the signature decides)
MAX_DOCUMENT = 4 << 20
CREATED = "org.opencontainers.image.created"  # the signed time a build's manifest claims
# The referrers naming a trusted key read per build and type: their manifests and blobs are read
# one by one, so a store listing hundreds of them (each answered just in time) would hold a pull
# for hours; all of them are also read within one download.listing_deadline (`_walk`).
MAX_READ_REFERRERS = 32


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


class _Walk:
    """The referrers naming a trusted key, read one by one (`for ref in walk`, inside `with
    walk`): at most MAX_READ_REFERRERS, all within one store transfer (download.listing_deadline,
    or sooner when the caller's transfer ends sooner), and `skipped` says in one line what was
    not read and why."""

    def __init__(self, store: Store, build: Manifest, kind: str, candidates: list[Descriptor]):
        self.store, self.kind, self.candidates = store, kind, candidates
        self.what = f"the {kind} referrers of {build.digest[:19]}"
        self.read = 0
        self.expired = False

    def __enter__(self) -> _Walk:
        self._context = self.store.transfer(self.what)
        self.transfer = self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def __iter__(self):
        for ref in self.candidates[:MAX_READ_REFERRERS]:
            if self.transfer.expired():
                self.expired = True
                return
            yield ref
            self.read += 1

    def stopped(self, exc: StoreUnreachable) -> bool:
        """Whether `exc` is the walk's own deadline (the walk ends) rather than one read's."""
        self.expired = self.transfer.expired()
        return self.expired

    @property
    def skipped(self) -> str | None:
        left = len(self.candidates) - self.read
        if left <= 0:
            return None
        why = (f"stopped at {self.transfer.deadline.words()}" if self.expired
               else f"at most {MAX_READ_REFERRERS} are read")
        return (f"{left} of the {len(self.candidates)} {self.kind} referrers of "
                f"{self.what.rsplit(' ', 1)[-1]} naming a trusted key were skipped ({why})")


def signed_by(store: Store, build: Manifest, trusted: list[signing.PublicKey]) -> str:
    """The id of a trusted key whose signature of the build's manifest bytes holds, or Refused
    saying why none does (no signature, only untrusted keys, or a signature that does not match,
    and what was skipped: `_Walk`)."""
    candidates, problems = _by_trusted(store.referrers(build.digest, oci.SIGNATURE_TYPE), trusted)
    with _Walk(store, build, "signature", candidates) as walk:
        for ref in walk:
            try:
                man = store.manifest(ref.digest)
                sig_layer = _one_layer(man, oci.MINISIGN_LAYER, store)
                text = store.read_blob(sig_layer, MAX_SIGNATURE, "signature").decode("utf-8", "replace")
                verified = signing.verify(build.data, text, trusted)
            except StoreUnreachable as exc:
                if walk.stopped(exc):
                    break
                raise
            except (StoreError, signing.SignatureError) as exc:
                problems.append(exc.message)
                continue
            if verified.trusted_comment != signature_comment("build", build.digest):
                problems.append("a signature's trusted comment names another artifact")
                continue
            distrust = signing.trust_problem(verified.key, signing.claimed_time(
                build.annotations.get(CREATED)))
            if distrust:  # its window or a revocation: the signature holds, the key is not trusted
                problems.insert(0, distrust)  # the line names this first: it is why, not noise
                continue
            return verified.key_id
    skipped = f"; {walk.skipped}" if walk.skipped else ""
    if not problems:
        raise Refused(f"{store.url}: the build {build.digest[:19]} is not signed" if not skipped else
                      f"{store.url}: no trusted signature of the build {build.digest[:19]} was read{skipped}",
                      "ask its publisher to sign it (`rocforge publish` signs every build)")
    raise Refused(f"{store.url}: no trusted signature of the build {build.digest[:19]}: {problems[0]}"
                  f"{skipped}",
                  "trust the publisher's key (substitute.trusted_keys) only if you trust them")


def attached(store: Store, build: Manifest, artifact_type: str,
             trusted: list[signing.PublicKey], notes: list[str] | None = None
             ) -> tuple[list[Attached], list[str]]:
    """The documents of `artifact_type` attached to a build whose signature by a trusted key
    holds, and one line for each one left out (untrusted, altered, malformed); the line for the
    referrers not read at all (`_Walk`) goes to `notes` too."""
    candidates, left_out = _by_trusted(store.referrers(build.digest, artifact_type), trusted)
    good = []
    with _Walk(store, build, artifact_type.rsplit(".", 2)[-2], candidates) as walk:
        _read_attached(store, build, artifact_type, trusted, walk, good, left_out)
    if walk.skipped:
        left_out.append(walk.skipped)
        if notes is not None:
            notes.append(f"{store.url}: {walk.skipped}")
    return good, left_out


def _read_attached(store: Store, build: Manifest, artifact_type: str, trusted: list[signing.PublicKey],
                   walk: _Walk, good: list[Attached], left_out: list[str]) -> None:
    for ref in walk:
        try:
            man = store.manifest(ref.digest)
            if man.subject is None or man.subject.digest != build.digest:
                raise Refused(f"{ref.digest[:19]} names another subject")
            if man.artifact_type != artifact_type:
                raise Refused(f"{ref.digest[:19]} is not a {artifact_type}")
            doc_layer = _one_layer(man, oci.JSON_LAYER, store)
            sig_layer = _one_layer(man, oci.MINISIGN_LAYER, store)
            data = store.read_blob(doc_layer, MAX_DOCUMENT, "document")
            text = store.read_blob(sig_layer, MAX_SIGNATURE, "signature").decode("utf-8", "replace")
            verified = signing.verify(data, text, trusted)
            if not verified.trusted_comment.endswith(f" {build.digest} {oci.sha256_digest(data)}"):
                raise Refused(f"{ref.digest[:19]}: its signature names another document")
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise Refused(f"{ref.digest[:19]}: not a JSON object")
            if doc.get("key") not in (None, "") and doc.get("key") != build.config.digest:
                raise Refused(f"{ref.digest[:19]}: made for another key")
            distrust = signing.trust_problem(verified.key, signing.claimed_time(doc.get("made_at")))
            if distrust:
                raise Refused(f"{ref.digest[:19]}: {distrust}")
        except StoreUnreachable as exc:
            if walk.stopped(exc):
                return
            raise
        except (StoreError, signing.SignatureError) as exc:
            left_out.append(exc.message)
            continue
        except (ValueError, RecursionError):
            left_out.append(f"{ref.digest[:19]}: not JSON")
            continue
        good.append(Attached(man.digest, artifact_type, doc, verified.key_id))



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
    document = store.read_blob(man.config, MAX_DOCUMENT, "key document")
    if document != key.document:
        why = key.mismatch(json.loads(document)) if document else "empty"
        raise Refused(f"{store.url}: the key document differs: {why}")
    if len(man.layers) != 1 or man.layers[0].media_type != oci.BUNDLE_LAYER:
        raise Refused(f"{store.url}: {man.digest[:19]} does not have one bundle layer")
    return man.layers[0]
