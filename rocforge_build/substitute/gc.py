"""`rocforge store gc URL --keep N [--dry-run] [--all-publishers]`: what no kept build needs,
removed from a store.

Per build key the N newest of this signing key's own builds are kept (its signed index is
written again listing only those), with every other publisher's builds, trusted or not, and
the one under the single tag of earlier stores when another publisher's index names it;
`--all-publishers` keeps the N newest of the key across publishers instead.  A removed build
goes with its referrers (signatures, evidence, advisories) and the blobs nothing kept needs;
whatever another tag of the store names (a nightly advisory, a tag rocforge did not make) is
kept with all it names.  An OCI image layout (file://, s3://) is swept whole as well: a blob or
manifest nothing in index.json reaches, older than GRACE seconds (a publish under way writes its
blobs before it names them), goes too; a file that is not a blob is left alone and counted.

Order, so a failure leaves what a reader sees whole: the builds' manifests and their referrers
first (a registry that refuses deletion refuses the first, and nothing has changed), then this
key's index, then the blobs.  Each is idempotent: an interrupted gc is finished by running it
again; a pull passes over an index entry whose build is gone."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rocforge_build.errors import UsageError
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import oci, publishers, signing
from rocforge_build.substitute.oci import Descriptor, Manifest, NotFound, Store, StoreError

GRACE = 3600.0  # seconds: an unnamed blob younger than this may be a publish under way
MAX_KEEP = 10_000
MAX_WALK = 100_000  # manifests and indexes read while marking what is kept


@dataclass
class Build:
    key: str
    digest: str
    created: str
    publisher: str  # the key id whose index lists it ("" for the single tag of earlier stores alone)
    size: int = 0  # the manifest, its blobs and its referrers, once counted


@dataclass
class Plan:
    removed: list[Build] = field(default_factory=list)
    kept: int = 0
    manifests: dict[str, int] = field(default_factory=dict)  # digest -> size: to remove
    blobs: dict[str, int] = field(default_factory=dict)  # digest -> size: to remove
    tags: list[str] = field(default_factory=list)  # tags removed (a layout's index.json entries)
    rewrite: dict[str, list[Descriptor]] = field(default_factory=dict)  # this key's index tag -> kept entries
    old_indexes: dict[str, str] = field(default_factory=dict)  # its tag -> the digest it names now
    retag: dict[str, str] = field(default_factory=dict)  # a single tag -> the kept build it names now
    tag_targets: dict[str, str] = field(default_factory=dict)  # a removed tag -> the build it is of
    notes: list[str] = field(default_factory=list)
    foreign: int = 0  # files in a layout's blobs/ that are not blobs: left alone

    @property
    def bytes(self) -> int:
        return sum(self.manifests.values()) + sum(self.blobs.values())


def _names(man: Manifest) -> list[Descriptor]:
    return [man.config, *man.layers]


def plan(store: Store, keep: int, pair_public: signing.PublicKey, trusted: list[signing.PublicKey],
         *, all_publishers: bool) -> Plan:
    if not 0 <= keep <= MAX_KEEP:
        raise UsageError(f"--keep {keep}: give 0 to {MAX_KEEP}")
    out = Plan()
    mine = pair_public.key_id
    by_id = {k.key_id: k for k in [*trusted, pair_public]}
    tags = store.tags()
    keys: dict[str, set[str | None]] = {}
    other_tags: list[str] = []
    fallback: dict[str, str] = {}  # subject digest -> its tag-schema tag
    for tag in tags:
        parsed = publishers.parse_tag(tag)
        if parsed is not None:
            keys.setdefault(parsed[0], set()).add(parsed[1])
        elif tag.startswith("sha256-") and len(tag) == 71:
            fallback["sha256:" + tag[7:]] = tag
        else:
            other_tags.append(tag)
    kept_roots: set[str] = set()  # manifests and indexes kept, whose blobs and entries stay
    shallow: set[str] = set()  # publishers' indexes kept: themselves, not what they list
    for key in sorted(keys):
        _plan_key(store, key, keys[key], keep, mine, by_id, all_publishers, out, kept_roots, shallow)
    # what the removed builds take with them: referrers, their tag-schema index, their blobs
    removed = {b.digest for b in out.removed}
    unreadable: set[str] = set()
    for build in out.removed:
        size = 0
        try:
            man = store.manifest(build.digest)
        except NotFound:
            continue
        except StoreError as exc:  # what an index calls a build is not one: left, said
            if isinstance(exc, oci.StoreUnreachable):
                raise
            out.notes.append(f"{build.digest[:19]} is listed as a build but unreadable "
                             f"({one_line(exc.message)[:120]}): left as it is")
            unreadable.add(build.digest)
            continue
        size += len(man.data)
        out.manifests[man.digest] = len(man.data)
        blobs = {d.digest: d.size for d in _names(man)}
        for ref in store.referrers(man.digest):
            if ref.media_type != oci.MANIFEST:
                continue
            try:
                r = store.manifest(ref.digest)
            except NotFound:
                continue
            if r.subject is None or r.subject.digest != man.digest:
                continue  # a hostile index naming another's referrer: not this build's
            out.manifests[r.digest] = len(r.data)
            size += len(r.data)
            blobs.update({d.digest: d.size for d in _names(r)})
        if man.digest in fallback:
            out.tags.append(fallback[man.digest])
            out.tag_targets[fallback[man.digest]] = man.digest
        for digest, n in blobs.items():
            out.blobs.setdefault(digest, n)
        build.size = size + sum(blobs.values())
    # nothing another kept thing names goes: kept builds, their referrers, every other tag
    needed = _mark(store, kept_roots | set(other_tags)
                   | {t for s, t in fallback.items() if s not in removed}, out, shallow)
    for digest in list(out.blobs):
        if digest in needed:
            del out.blobs[digest]
    for digest in list(out.manifests):
        if digest in needed:
            del out.manifests[digest]
    for build in out.removed:
        if build.digest in needed:  # another tag (a hand-made one) names it: it stays
            out.notes.append(f"{build.digest[:19]} is named by another tag of the store: kept")
    out.removed = [b for b in out.removed if b.digest not in needed and b.digest not in unreadable]
    # a tag goes only with what it names (a registry removes a tag by removing what it names)
    out.tags = [t for t in out.tags if out.tag_targets.get(t) not in needed | unreadable]
    return out


def _plan_key(store: Store, key: str, ids: set[str | None], keep: int, mine: str,
              by_id: dict[str, signing.PublicKey], all_publishers: bool, out: Plan,
              kept_roots: set[str], shallow: set[str]) -> None:
    short = key.removeprefix("sha256:")[:16]
    builds: dict[str, Build] = {}
    owners: dict[str, set[str]] = {}  # build digest -> the key ids whose index lists it
    own_entries: list[Descriptor] | None = None
    other_indexes: dict[str, list[Descriptor]] = {}
    for kid in sorted(i for i in ids if i is not None):
        tag = publishers.publisher_tag(key, kid)
        if kid in by_id:
            try:
                entries = publishers.read_index(store, key, by_id[kid]) or []
            except publishers.IndexRefused as exc:
                if kid == mine:
                    out.notes.append(f"{short}: {exc.message}: this key's builds of it left as they are")
                    kept_roots.add(tag)
                    return
                out.notes.append(f"{short}: {exc.message}: kept, with all it names")
                kept_roots.add(tag)
                continue
        else:  # not a trusted key's: its entries are kept (never this key's to remove) unless
            try:  # --all-publishers, read without a signature only to know what they are
                entries = store.index(tag)
            except StoreError as exc:
                if isinstance(exc, oci.StoreUnreachable):
                    raise
                out.notes.append(f"{short}: the index of {kid} is unreadable ({one_line(exc.message)[:120]}): "
                                 "left as it is")
                kept_roots.add(tag)
                continue
            entries = [e for e in entries if e.media_type == oci.MANIFEST][:publishers.MAX_ENTRIES]
        if kid == mine:
            own_entries = entries
        else:
            other_indexes[kid] = entries
        for e in entries:
            builds.setdefault(e.digest, Build(key, e.digest, publishers.created(e), kid))
            owners.setdefault(e.digest, set()).add(kid)
    legacy = publishers.legacy_tag(key)
    legacy_digest = None
    if None in ids:
        try:
            man = store.manifest(legacy)
        except StoreError as exc:
            if isinstance(exc, oci.StoreUnreachable):
                raise
            man = None
            out.notes.append(f"{short}: its single tag is unreadable ({one_line(exc.message)[:120]}): left as it is")
            kept_roots.add(legacy)
        if man is not None:
            legacy_digest = man.digest
            builds.setdefault(man.digest, Build(key, man.digest, publishers.created(man), ""))
    newest = lambda digests: sorted(digests, key=lambda d: (builds[d].created, d), reverse=True)  # noqa: E731
    if all_publishers:
        kept = set(newest(builds)[:keep])
    else:
        own = [e.digest for e in own_entries or []]
        kept = set(newest(own)[:keep])
        kept |= {d for d in builds if owners.get(d, set()) - {mine}}  # another publisher lists it
        if legacy_digest is not None and legacy_digest not in own:
            kept.add(legacy_digest)  # the single tag names another's build (or one no index lists)
    for digest in newest(builds):
        if digest in kept:
            out.kept += 1
            kept_roots.add(digest)
        else:
            build = builds[digest]
            build.publisher = build.publisher or (mine if digest in {e.digest for e in own_entries or []} else "")
            out.removed.append(build)
    if own_entries is not None:
        tag = publishers.publisher_tag(key, mine)
        left = [e for e in own_entries if e.digest in kept]
        if len(left) != len(own_entries):
            out.rewrite[tag] = left
        elif own_entries:
            shallow.add(tag)
        if tag in out.rewrite:
            try:
                out.old_indexes[tag] = oci.sha256_digest(store.index_doc(tag)[3])
            except NotFound:
                pass
    for kid, entries in other_indexes.items():
        tag = publishers.publisher_tag(key, kid)
        if any(e.digest in kept for e in entries):
            shallow.add(tag)  # another's signed list is never rewritten; a pull passes over what is gone
        elif entries or all_publishers:
            out.tags.append(tag)
    if legacy_digest is not None and legacy_digest not in kept:
        own_kept = [d for d in newest(e.digest for e in own_entries or []) if d in kept]
        if own_kept:  # it named this key's build: it names this key's newest kept one instead
            out.retag[legacy] = own_kept[0]
        else:
            out.tags.append(legacy)
            out.tag_targets[legacy] = legacy_digest


def _mark(store: Store, roots: set[str], out: Plan, shallow: set[str] = frozenset()) -> set[str]:
    """Every manifest, index and blob `roots` (tags or digests) reach, and the indexes `shallow`
    names without what they list; a build's referrers with it."""
    needed: set[str] = set()
    todo = [(r, False) for r in roots] + [(r, True) for r in shallow]
    walked = 0
    while todo:
        ref, alone = todo.pop()
        if ref in needed:
            continue
        walked += 1
        if walked > MAX_WALK:
            raise StoreError(f"{store.url}: more than {MAX_WALK} manifests reached from its tags (stopped)")
        try:
            data, media_type = _raw(store, ref)
            entries = (oci.parse_index(data, f"{store.url} {ref[:80]}") if media_type == oci.INDEX
                       else None)
            man = Manifest.parse(data, f"{store.url} {ref[:80]}") if entries is None else None
        except NotFound:
            continue
        except StoreError as exc:
            if isinstance(exc, oci.StoreUnreachable):
                raise
            raise _Unsure(f"{one_line(ref)[:80]} is unreadable ({one_line(exc.message)[:160]})") from None
        digest = oci.sha256_digest(data)
        needed.update((digest, ref))
        if alone:
            continue
        if entries is not None:
            todo += [(e.digest, False) for e in entries if e.digest not in needed]
            continue
        needed.update(d.digest for d in _names(man))
        if man.artifact_type == oci.BUILD_TYPE:
            todo += [(r.digest, False) for r in store.referrers(digest) if r.digest not in needed]
    return needed


class _Unsure(StoreError):
    """Something a tag names is unreadable: what it needs cannot be told."""


def _raw(store: Store, ref: str) -> tuple[bytes, str]:
    if ref.startswith("sha256:"):
        oci.check_digest(ref, store.url)
    else:
        oci.check_tag(ref, store.url)
    with store.transfer(f"manifest {ref[:80]}"):
        data, media_type = store._get_manifest(ref)
    if media_type not in (oci.MANIFEST, oci.INDEX):
        raise StoreError(f"{store.url}: {ref[:80]} is a {media_type[:60]}")
    if ref.startswith("sha256:") and oci.sha256_digest(data) != ref:
        raise StoreError(f"{store.url}: {ref[:19]}'s bytes do not match its digest")
    return data, media_type


def run(store: Store, keep: int, pair: signing.KeyPair | None, public: signing.PublicKey,
        trusted: list[signing.PublicKey], *, all_publishers: bool, dry_run: bool, say) -> Plan:
    """The plan, then (unless `dry_run`) carried out; `say` gets each line."""
    if not store.writable and not dry_run:
        raise UsageError(f"{store.url} is read-only: nothing can be removed from it")
    try:
        found = plan(store, keep, public, trusted, all_publishers=all_publishers)
    except _Unsure as exc:
        raise StoreError(f"{store.url}: {exc.message}, so what is kept cannot be told; nothing was removed",
                         "remove or repair what names it, then run gc again") from None
    sweep = _sweep_plan(store, found) if hasattr(store, "blob_files") else {}
    verb = "would remove" if dry_run else "removing"
    for b in found.removed:
        say(f"{verb} {b.key.removeprefix('sha256:')[:16]} build {b.digest[:19]} "
            f"({b.created or 'no date'}, {'by ' + b.publisher if b.publisher else 'no index'}): "
            f"{_size(b.size)}")
    for tag in found.rewrite:
        say(f"{verb} from this key's index {tag[:25]}...: it keeps {len(found.rewrite[tag])} build(s)")
    for tag in found.tags:
        parsed = publishers.parse_tag(tag)
        if parsed is not None and parsed[1] is not None:
            say(f"{verb} the index of {parsed[1]} for {parsed[0].removeprefix('sha256:')[:16]}: it lists "
                "nothing kept")
    for digest, size in sorted(sweep.items()):
        say(f"{verb} unnamed {digest[:19]} (nothing in the store names it): {_size(size)}")
    for note in found.notes:
        say(note)
    if found.foreign:
        say(f"left alone: {found.foreign} file(s) under blobs/ that are not blobs")
    total = found.bytes + sum(sweep.values())
    say(f"{'would free' if dry_run else 'freeing'} {_size(total)}: {len(found.removed)} build(s), "
        f"{len(found.manifests)} manifest(s), {len(found.blobs) + len(sweep)} blob(s); {found.kept} build(s) kept")
    for tag, digest in found.retag.items():
        say(f"{'would move' if dry_run else 'moving'} {tag[:25]}... (read by older rocforge) to this key's "
            f"newest kept build {digest[:19]}")
    if dry_run or not (found.removed or found.rewrite or found.tags or sweep or found.retag):
        return found
    if found.rewrite and pair is None:
        raise UsageError("store gc needs this key's secret key to sign its shortened index")
    layout = hasattr(store, "forget")
    builds = {b.digest for b in found.removed}
    order = [d for d in found.manifests if d not in builds] + [d for d in found.manifests if d in builds]
    # 1. the removed builds' referrers first (a registry that refuses deletion refuses the first,
    # before anything changed), the single tag of earlier stores moved from a removed build of this
    # key's to its newest kept one, then the builds' manifests and the tags only they need (a
    # layout: index.json changed in one write, then the files)
    for digest in order[:0 if layout else 1]:
        try:
            store.delete_manifest(digest, found.manifests[digest])
        except StoreError as exc:
            if isinstance(exc, oci.StoreUnreachable):
                raise
            raise StoreError(f"{exc.message}; nothing was removed", exc.hint) from None
    for tag, digest in found.retag.items():
        store.push_manifest(store.manifest(digest).data, tag=tag)
    if layout:
        store.forget(set(found.manifests), set(found.tags))
        for digest in found.manifests:
            store.delete_blob(digest)
    else:
        for digest in order[1:]:
            store.delete_manifest(digest, found.manifests[digest])
        for tag in found.tags:
            store.delete_tag(tag)
    # 2. this key's index, signed again with what it keeps (or gone when it keeps nothing)
    gone = {b.digest for b in found.removed}
    for tag, entries in found.rewrite.items():
        key = "sha256:" + tag.removeprefix(publishers.TAG_PREFIX)[:64]
        try:  # read again: a build this key published since the plan was made stays listed
            current = publishers.read_index(store, key, pair.public)
        except publishers.IndexRefused:
            current = None
        if current is not None:
            entries = [e for e in current if e.digest not in gone]
        now_names = store.push_index(publishers.make_index(key, entries, pair), tag=tag) if entries else None
        if not entries:
            store.delete_tag(tag)
        if tag in found.old_indexes and found.old_indexes[tag] != now_names:
            store.delete_manifest(found.old_indexes[tag], 0)
    # 3. blobs no kept thing needs
    for digest in [*found.blobs, *sweep]:
        try:
            store.delete_blob(digest)
        except StoreError as exc:
            if isinstance(exc, oci.StoreUnreachable):
                raise
            say(f"left alone: {one_line(exc.message)[:200]}")
            total -= found.blobs.get(digest, sweep.get(digest, 0))
    say(f"freed {_size(total)}")
    return found


def _sweep_plan(store: Store, found: Plan) -> dict[str, int]:
    """A layout's blobs nothing in index.json reaches (once this gc's removals are made), older
    than GRACE: digest -> size."""
    files, foreign = store.blob_files()
    found.foreign = foreign
    if not files:
        return {}
    roots = {e.digest for e in store.layout_entries()
             if e.digest not in found.manifests and e.annotations.get(oci.REF_NAME) not in found.tags}
    try:
        needed = _mark(store, roots, found)
    except _Unsure as exc:
        found.notes.append(f"{exc.message}: the sweep of unnamed blobs was skipped")
        return {}
    now = time.time()
    return {d: size for d, (size, mtime) in files.items()
            if d not in needed and d not in found.blobs and d not in found.manifests and now - mtime > GRACE}


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"
