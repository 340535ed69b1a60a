"""Keys that change: a key's own signed revocation, and a rotation statement (an old key naming
its successor, signed by both), each a subject-less signed OCI artifact in a store, like the
nightly advisories.

- A revocation (`rocforge key revoke`) is tagged `rocforge-key-revocation-<KEYID>-<hex>`: its
  document names the key (the whole public key), a reason (`compromised`: nothing the key ever
  signed is trusted; `retired`: only what it signed, by its own claim, before `revoked_at`) and is
  signed by that very key.  A key revokes only itself: a document naming another key does not
  verify under the key it names and is left out with a line.  A key whose secret is lost cannot
  revoke itself; its consumers drop it from substitute.trusted_keys or give it a not-after.
- A rotation (`rocforge key rotate`) is tagged `rocforge-key-rotation-<OLDID>-<hex>`: its document
  names the old and the new key and when it was made, signed by the old key (its word) and by the
  new (it holds the new secret, so no one else's key is named).  Consumers follow it only with
  `rocforge key trust-rotation URL`, which adds the new key `via` the old one: never past the old
  key's window, and never once the old key is revoked as compromised (substitute/signing.py
  trusted_keys_from_config, trust_problem).

Before a pull trusts a signature, the revocations of every configured store are read
(`with_revocations`); a store whose revocations cannot be read is not pulled from."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rocforge_build.errors import UsageError
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import artifact, oci, signing
from rocforge_build.substitute.oci import Store, StoreError, StoreUnreachable
from rocforge_build.trusted_entry import format_time, parse_time

REVOCATION_TYPE = "application/vnd.rocforge.key-revocation.v1"
ROTATION_TYPE = "application/vnd.rocforge.key-rotation.v1"
REVOCATION_SCHEMA = "rocforge.key-revocation/1"
ROTATION_SCHEMA = "rocforge.key-rotation/1"
REVOCATION_TAG = "rocforge-key-revocation-"
ROTATION_TAG = "rocforge-key-rotation-"
REASONS = ("compromised", "retired")
MAX_DOCUMENT = 16 << 10
MAX_NOTE = 300
MAX_PER_KEY = 16  # statements read per key and store: a store crowding one key's tags costs a line
MAX_LINES = 8  # lines about statements left out, per store


def _now_text() -> str:
    return format_time(int(time.time()))


def _comment(kind: str, digest: str) -> str:
    return f"rocforge {kind} {digest}"


# -- making and publishing -----------------------------------------------------------------------

def make_revocation(pair: signing.KeyPair, reason: str, note: str, version: str) -> dict:
    doc = {"schema": REVOCATION_SCHEMA, "key": pair.public.text, "reason": reason,
           "revoked_at": _now_text(), "note": note, "rocforge": version}
    _check_revocation(doc)
    return doc


def make_rotation(old: signing.KeyPair, new: signing.KeyPair, version: str) -> dict:
    doc = {"schema": ROTATION_SCHEMA, "old": old.public.text, "new": new.public.text,
           "made_at": _now_text(), "rocforge": version}
    _check_rotation(doc)
    return doc


def _push(store: Store, artifact_type: str, tag: str, data: bytes, signatures: list[str], signer: str) -> str:
    empty = store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY)
    layers = [store.push_blob_bytes(data, oci.JSON_LAYER)]
    layers += [store.push_blob_bytes(s.encode(), oci.MINISIGN_LAYER) for s in signatures]
    manifest = oci.make_manifest(artifact_type=artifact_type, config=empty, layers=layers,
                                 annotations={artifact.SIGNER: signer})
    store.push_manifest(manifest, tag=tag)
    return tag


def publish_revocation(store: Store, doc: dict, pair: signing.KeyPair) -> str:
    data = oci.canonical_json(doc)
    digest = oci.sha256_digest(data)
    sig = signing.sign(data, pair, _comment("key-revocation", digest))
    return _push(store, REVOCATION_TYPE, f"{REVOCATION_TAG}{pair.key_id}-{digest[7:19]}", data, [sig],
                 pair.key_id)


def publish_rotation(store: Store, doc: dict, old: signing.KeyPair, new: signing.KeyPair) -> str:
    data = oci.canonical_json(doc)
    digest = oci.sha256_digest(data)
    comment = _comment("key-rotation", digest)
    return _push(store, ROTATION_TYPE, f"{ROTATION_TAG}{old.key_id}-{digest[7:19]}", data,
                 [signing.sign(data, old, comment), signing.sign(data, new, comment)], old.key_id)


# -- the documents, checked strictly --------------------------------------------------------------

def _fields(doc: object, schema: str, names: tuple[str, ...]) -> dict:
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise StoreError(f"not a {schema} document")
    if set(doc) != {"schema", *names}:
        extra = sorted(set(doc) - {"schema", *names}) or sorted({"schema", *names} - set(doc))
        raise StoreError(f"a {schema} document has the fields {', '.join(names)}, not "
                         f"{one_line(str(extra[0]))[:40]!r}")
    for name in names:
        if not isinstance(doc[name], str):
            raise StoreError(f"its {name} is a {type(doc[name]).__name__}, not a text")
    return doc


def _time(doc: dict, name: str) -> int:
    value = doc[name]
    try:
        if len(value) != 20:
            raise ValueError("is not YYYY-MM-DDTHH:MM:SSZ")
        return parse_time(value)
    except ValueError as exc:
        raise StoreError(f"its {name} {one_line(value)[:32]!r} {exc}") from None


def _key(doc: dict, name: str) -> signing.PublicKey:
    if len(doc[name]) > 100 or not doc[name].isprintable():
        raise StoreError(f"its {name} key is not one public key line (RW...)")
    try:
        return signing.PublicKey.parse(doc[name])
    except signing.SignatureError as exc:
        raise StoreError(f"its {name} key: {exc.message}") from None


def _check_revocation(doc: object) -> tuple[signing.PublicKey, str, int]:
    doc = _fields(doc, REVOCATION_SCHEMA, ("key", "reason", "revoked_at", "note", "rocforge"))
    if doc["reason"] not in REASONS:
        raise StoreError(f"its reason {one_line(doc['reason'])[:32]!r} is not one of {', '.join(REASONS)}")
    if len(doc["note"]) > MAX_NOTE or not doc["note"].isprintable() or len(doc["rocforge"]) > 64:
        raise StoreError(f"its note is not one printable line of at most {MAX_NOTE} characters")
    return _key(doc, "key"), doc["reason"], _time(doc, "revoked_at")


class SelfRotation(StoreError):
    """A rotation statement naming its own key as the new one."""


def _check_rotation(doc: object) -> tuple[signing.PublicKey, signing.PublicKey, int]:
    doc = _fields(doc, ROTATION_SCHEMA, ("old", "new", "made_at", "rocforge"))
    old, new = _key(doc, "old"), _key(doc, "new")
    if old.keynum == new.keynum or old.raw == new.raw:
        raise SelfRotation("it rotates a key to itself (the same key number or the same key)")
    if len(doc["rocforge"]) > 64:
        raise StoreError("its rocforge version is longer than 64 characters")
    return old, new, _time(doc, "made_at")


def _read(store: Store, tag: str, artifact_type: str, signatures: int) -> tuple[bytes, list[str], str]:
    """A statement's document bytes, its signature texts and its digest (each read capped)."""
    man = store.manifest(tag)
    if man.artifact_type != artifact_type or man.subject is not None:
        raise StoreError(f"{tag[:60]} is not a {artifact_type.rsplit('.', 2)[-2]} statement")
    kinds = [d.media_type for d in man.layers]
    if kinds != [oci.JSON_LAYER] + [oci.MINISIGN_LAYER] * signatures:
        raise StoreError(f"{tag[:60]}: not one document and {signatures} signature(s)")
    data = store.read_blob(man.layers[0], MAX_DOCUMENT, "document")
    texts = [store.read_blob(d, artifact.MAX_SIGNATURE, "signature").decode("utf-8", "replace")
             for d in man.layers[1:]]
    return data, texts, oci.sha256_digest(data)


def _json(data: bytes, tag: str) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise StoreError(f"{tag[:60]}: not JSON") from None


def _tags_by_key(store: Store, prefix: str, trusted: list[signing.PublicKey], lines: list[str],
                 crowded: set[str] | None = None) -> list[tuple[str, str]]:
    """(tag, key id) of the statements whose tag names a trusted key, at most MAX_PER_KEY each
    (a line says how many were not read); tags naming no trusted key are not read at all."""
    ids = {k.key_id for k in trusted}
    found: dict[str, list[str]] = {}
    for tag in store.tags():
        if isinstance(tag, str) and tag.startswith(prefix):
            key_id = tag[len(prefix):len(prefix) + 16]
            if key_id in ids and tag[len(prefix) + 16:len(prefix) + 17] == "-":
                found.setdefault(key_id, []).append(tag)
    chosen = []
    for key_id, tags in sorted(found.items()):
        if len(tags) > MAX_PER_KEY:
            if crowded is not None:  # the caller must know: what went unread may be what counts
                crowded.add(key_id)
            lines.append(f"{store.url}: {len(tags)} {prefix[13:-1]} statements name the key {key_id}; "
                         f"only {MAX_PER_KEY} are read")
        chosen += [(t, key_id) for t in sorted(tags)[:MAX_PER_KEY]]
    return chosen


def read_revocations(store: Store, trusted: list[signing.PublicKey]) -> tuple[list[signing.Revocation], list[str]]:
    """The revocations in `store` of keys in `trusted`, each signed by the key it revokes, and one
    line per statement left out (not one of ours, malformed, signed by another key)."""
    lines: list[str] = []
    found: list[signing.Revocation] = []
    for tag, key_id in _tags_by_key(store, REVOCATION_TAG, trusted, lines):
        try:
            data, (text,), digest = _read(store, tag, REVOCATION_TYPE, 1)
            key, reason, revoked_at = _check_revocation(_json(data, tag))
            if key.key_id != key_id:
                raise StoreError(f"its tag names the key {key_id}, its document {key.key_id}")
            mine = [k for k in trusted if k.keynum == key.keynum and k.raw == key.raw]
            if not mine:
                raise StoreError(f"it revokes a key {key.key_id} other than the trusted key of that id")
            try:  # under the key it names, and that key alone: no key revokes another
                verified = signing.verify(data, text, [signing.PublicKey(key.keynum, key.raw)])
            except signing.SignatureError as exc:
                raise StoreError(f"not signed by the key it revokes ({exc.message})") from None
            if verified.trusted_comment != _comment("key-revocation", digest):
                raise StoreError("its signature names another document")
        except StoreUnreachable:
            raise
        except (StoreError, signing.SignatureError) as exc:
            lines.append(f"{store.url}: key revocation {one_line(tag)[:60]} left out: {one_line(exc.message)[:300]}")
            continue
        found.append(signing.Revocation(key_id, reason, revoked_at, digest, store.url, key.text))
    return found, _capped(lines, store.url)


def _capped(lines: list[str], url: str) -> list[str]:
    if len(lines) <= MAX_LINES:
        return lines
    return [*lines[:MAX_LINES], f"{url}: {len(lines) - MAX_LINES} more key statements left out"]


def apply(trusted: list[signing.TrustedKey], revocations: list[signing.Revocation]) -> list[signing.TrustedKey]:
    """The trusted keys, each with the revocation that ends it: its own strongest (compromised
    before retired, then the earliest), else a compromised key's it came through (`via`).  A
    revocation is matched by the whole key, never by its id alone (two keys may share a key
    number; a key revokes only itself)."""
    def strength(r: signing.Revocation) -> tuple:
        return (r.reason != "compromised", r.revoked_at, r.digest)

    own: dict[str, signing.Revocation] = {}
    for r in revocations:
        if r.key_text not in own or strength(r) < strength(own[r.key_text]):
            own[r.key_text] = r
    by_id = {k.key_id: k.text for k in trusted}  # trusted_entry refuses a via naming a shared id
    out = []
    for key in trusted:
        revoked = own.get(key.text)
        if revoked is None or revoked.reason != "compromised":
            through = [own[by_id[v]] for v in getattr(key, "via", ())
                       if by_id.get(v) in own and own[by_id[v]].reason == "compromised"]
            revoked = through[0] if through else revoked
        out.append(replace(key, revoked=revoked) if isinstance(key, signing.TrustedKey) else key)
    return out


def with_revocations(trusted: list[signing.TrustedKey], urls, timeout: float
                     ) -> tuple[list[signing.TrustedKey], list[str], dict[str, str]]:
    """The trusted keys with the revocations of every store in `urls` applied, one line per
    statement left out or store not read, and the stores whose revocations could not be read,
    each with why (nothing of theirs is trusted in this run: a revocation there might have been
    missed)."""
    from rocforge_build.substitute.stores import open_store

    revocations: list[signing.Revocation] = []
    lines: list[str] = []
    unread: dict[str, str] = {}
    if not trusted:
        return trusted, lines, unread
    for url in urls:
        try:
            with open_store(url, timeout=timeout) as store:
                with store.transfer("its key revocations"):
                    found, left_out = read_revocations(store, trusted)
        except Exception as exc:  # noqa: BLE001 - any store failure: that store is not trusted now
            why = one_line(getattr(exc, "message", None) or str(exc))[:200]
            lines.append(f"{one_line(str(url))[:200]}: its key revocations could not be read "
                         f"({why}); nothing is pulled from it")
            unread[url] = why
            continue
        revocations += found
        lines += left_out
    return apply(trusted, revocations), lines, unread


@dataclass(frozen=True)
class Rotation:
    old: signing.TrustedKey
    new: signing.PublicKey
    made_at: int
    digest: str
    tag: str


def read_rotations(store: Store, trusted: list[signing.TrustedKey], *, witnessed: dict[str, set[str]] | None = None
                   ) -> tuple[list[Rotation], list[str]]:
    """The rotation statements in `store` from a key in `trusted` that hold: signed by the old key
    and by the new, made (by its own claim) while the old key was trusted and not revoked, and
    one line for each left out.  `witnessed` (key id -> successors) gets every successor a
    statement signed by both keys names, and "" for a key whose statements here could hide one:
    the fork rule holds across stores (`key trust-rotation` reads every configured one)."""
    lines: list[str] = []
    found: list[Rotation] = []
    # key id -> why its rotations are not followed from this store: a statement naming it that
    # could not be read or whose signatures do not hold (its owner's, overwritten or spoiled?), or
    # more of them than are read (its owner's crowded out?): the fork it would show is unseen
    crowded: set[str] = set()
    tags = _tags_by_key(store, ROTATION_TAG, trusted, lines, crowded)
    unsure: dict[str, str] = {k: "crowded" for k in crowded}
    named: dict[str, set[str]] = {}  # key id -> every successor a statement signed by both names
    for tag, key_id in tags:
        known = False  # what it says and who signed it are known: refused for what it says, no fork hides
        try:
            data, (by_old, by_new), digest = _read(store, tag, ROTATION_TYPE, 2)
            try:
                old, new, made_at = _check_rotation(_json(data, tag))
            except SelfRotation:
                known = True
                raise
            if old.key_id != key_id:
                raise StoreError(f"its tag names the key {key_id}, its document {old.key_id}")
            mine = [k for k in trusted if k.keynum == old.keynum and k.raw == old.raw]
            if not mine:
                raise StoreError(f"it rotates a key {old.key_id} other than the trusted key of that id")
            comment = _comment("key-rotation", digest)
            for text, key, whose in ((by_old, old, "old"), (by_new, new, "new")):
                try:
                    verified = signing.verify(data, text, [signing.PublicKey(key.keynum, key.raw)])
                except signing.SignatureError as exc:
                    raise StoreError(f"the {whose} key's signature does not hold ({exc.message})") from None
                if verified.trusted_comment != comment:
                    raise StoreError(f"the {whose} key's signature names another document")
            known = True
            named.setdefault(key_id, set()).add(new.text)
            distrust = signing.trust_problem(mine[0], made_at)
            if distrust:
                raise StoreError(distrust)
        except StoreUnreachable:
            raise
        except (StoreError, signing.SignatureError) as exc:
            lines.append(f"{store.url}: key rotation {one_line(tag)[:60]} left out: {one_line(exc.message)[:300]}")
            if not known:
                unsure.setdefault(key_id, tag)
            continue
        found.append(Rotation(mine[0], new, made_at, digest, tag))
    # a statement of the key that does not hold may be its owner's, overwritten or spoiled by whoever
    # can write to the store: the fork it would make is unseen, so no rotation of that key is followed
    for key_id, successors in named.items():  # one refused for its time still shows a fork
        if len(successors) > 1 and len({r.new.text for r in found if r.old.key_id == key_id}) < len(successors):
            unsure.setdefault(key_id, "fork")
    if witnessed is not None:
        for key_id, successors in named.items():
            witnessed.setdefault(key_id, set()).update(successors)
        for key_id in unsure:
            witnessed.setdefault(key_id, set()).add("")
    refused = []
    for key_id in sorted(unsure):
        if any(r.old.key_id == key_id for r in found):
            refused.append(f"{store.url}: no rotation of {key_id} is followed from this store: "
                           + ("more statements name it than are read" if unsure[key_id] == "crowded" else
                              "statements signed by it name other keys too, some refused" if unsure[key_id] == "fork" else
                              f"its statement {one_line(unsure[key_id])[:60]} cannot be read or its signatures "
                              "do not hold") + " (it might be its owner's, rotating it elsewhere)")
    found = [r for r in found if r.old.key_id not in unsure]
    return found, [*refused, *_capped(lines, store.url)]


def new_entries(rotations: list[Rotation], configured: list[signing.TrustedKey], only: str | None
                ) -> tuple[list[str], list[str]]:
    """(the trusted_keys entries the rotations add, one line per rotation and why it adds or not):
    a key rotated to two different keys is followed to neither (one of them is not its owner's),
    a key already trusted is left as it is, and the new entry is trusted `via` the old one from
    the rotation's time."""
    by_old: dict[str, list[Rotation]] = {}
    for r in rotations:
        if only is None or r.old.key_id == only:
            by_old.setdefault(r.old.key_id, []).append(r)
    added: list[str] = []
    lines: list[str] = []
    for old_id, rs in sorted(by_old.items()):
        successors = {r.new.text for r in rs}
        if len(successors) > 1:
            lines.append(f"the key {old_id} was rotated to {len(successors)} different keys "
                         f"({', '.join(sorted(signing.PublicKey.parse(t).key_id for t in successors))}): "
                         "none is trusted; ask its owner which is theirs, and trust that one with "
                         "`rocforge config set`")
            continue
        r = min(rs, key=lambda r: r.made_at)
        if any(k.keynum == r.new.keynum and k.raw == r.new.raw for k in configured):
            lines.append(f"the key {r.new.key_id} (rotated from {old_id}) is trusted already")
            continue
        entry = f"{r.new.text} not-before={format_time(r.made_at)} via={old_id}"
        added.append(entry)
        lines.append(f"trusting the key {r.new.key_id}, rotated from {old_id} at {format_time(r.made_at)} "
                     f"({r.tag}), never past {old_id}'s own window")
    return added, lines


def followable_rotations(url: str, stores: list[str], configured: list[signing.TrustedKey], timeout: float,
                         warn: Callable[[str], None]) -> list[Rotation]:
    """The rotations in `url` a consumer may follow (`key trust-rotation`): read with every
    store's revocations applied, and none of a key another store in `stores` rotates elsewhere —
    a fork is seen across stores (the owner's rotation in one, a thief's in another), so a store
    whose revocations or rotations cannot be read stops it in one line.  `warn` gets one line per
    statement or key left out."""
    from rocforge_build.substitute.stores import open_store

    trusted, lines, unread = with_revocations(configured, stores, timeout)
    for line in lines:
        warn(line)
    if unread:
        raise UsageError(f"the key revocations of {len(unread)} store(s) could not be read, so no "
                         "rotation is trusted", "try again when every configured store answers")
    with open_store(url, timeout=timeout) as store:
        rotations, left_out = read_rotations(store, trusted)
    for line in left_out:
        warn(line)
    witnessed: dict[str, set[str]] = {}
    for other in stores:
        if other == url:
            continue
        try:
            with open_store(other, timeout=timeout) as store:
                read_rotations(store, trusted, witnessed=witnessed)
        except Exception as exc:  # noqa: BLE001 - a store not read might hold the other half of a fork
            why = getattr(exc, "message", None) or str(exc)
            raise UsageError(f"{other}: its key rotations could not be read ({one_line(why)[:200]}), so no "
                             "rotation is trusted (a rotation of the same key there would make a fork)",
                             "try again when every configured store answers") from None
    forked = {r.old.key_id for r in rotations if witnessed.get(r.old.key_id, set()) - {r.new.text}}
    for key_id in sorted(forked):
        warn(f"no rotation of {key_id} is followed: another configured store holds a rotation "
             "of it to another key, or one that cannot be read (one of them is not its owner's)")
    return [r for r in rotations if r.old.key_id not in forked]


def refuse_fork(urls: list[str], old: signing.KeyPair, new: signing.KeyPair, timeout: float) -> None:
    """A rotation of `old` to another key than `new` in any of the stores is a fork, which every
    consumer follows to neither key: refused before anything is written (a second `key rotate`
    after a first, where `--new-key` publishing the first again was meant).  A store that does
    not answer is left to the publish, which says so."""
    from rocforge_build.substitute.stores import open_store

    trusted = signing.trusted_keys_from_config([old.public.text])
    for url in urls:
        witnessed: dict[str, set[str]] = {}
        try:
            with open_store(url, timeout=timeout) as store:
                read_rotations(store, trusted, witnessed=witnessed)
        except (StoreError, StoreUnreachable):
            continue
        others = sorted(t for t in witnessed.get(old.key_id, set()) if t and t != new.public.text)
        if others:
            ids = ", ".join(signing.PublicKey.parse(t).key_id for t in others)
            raise UsageError(f"key rotate: {url} holds a rotation of {old.key_id} to {ids} already; a second "
                             "rotation to another key is a fork, which consumers follow to neither; nothing "
                             "was written", f"publish that rotation again with `--new-key` (its secret "
                             f"key file), or revoke {old.key_id} and have consumers trust the new key by hand")


def publish_each(urls: list[str], timeout: float, push: Callable[[Store], str], failed_line: Callable[[str], None]
                 ) -> tuple[list[dict], int]:
    """push(store) to every store: (what each answered, how many failed), one line per failure —
    a statement reaches the stores that answer, whatever the others do."""
    from rocforge_build.credentials import redact
    from rocforge_build.errors import RocforgeError
    from rocforge_build.substitute.stores import open_store

    done, failed = [], 0
    for url in urls:
        try:
            with open_store(url, timeout=timeout) as store:
                done.append({"store": redact(url), "tag": push(store)})
        except RocforgeError as exc:
            failed += 1
            failed_line(f"{redact(url)}: not published: {exc.message}")
    return done, failed
