"""Attack tests: keys that change (substitute/keys.py, signing.trust_problem) against hostile
stores, for real: an OCI layout on disk, Debian's docker-registry and moto's S3 server.

A revocation is honoured only when the key it names signed it (a key never revokes another); a
forged, malformed, oversized or crowded statement costs one line and never hides a good one; a
rotation is followed only from a key trusted now and at the rotation's claimed time, never from a
revoked one, never to two keys at once, and never round a loop; every refusal of a build names the
revocation or the window that refused it."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from moto_s3 import moto_s3, use_s3
from needs import needs

from rocforge_build.substitute import artifact, keys, oci, signing
from rocforge_build.substitute.artifact import Refused
from rocforge_build.substitute.stores import open_store
from rocforge_build.trusted_entry import format_time

NOW = int(time.time())


def _at(offset: int) -> str:
    return format_time(NOW + offset)


@pytest.fixture(scope="module")
def pairs():
    return [signing.generate() for _ in range(4)]


@pytest.fixture
def url(tmp_path):
    return f"file://{tmp_path / 'store'}"


@pytest.fixture(scope="module")
def s3_server():
    with moto_s3("keys") as endpoint:
        yield endpoint


def _build(store, pair, created: str, name: str = "b") -> oci.Manifest:
    """A build artifact signed by `pair` whose signed manifest claims `created`."""
    config = store.push_blob_bytes(json.dumps({"name": name}).encode(), oci.KEY_CONFIG)
    layer = store.push_blob_bytes(b"bundle " + name.encode(), oci.BUNDLE_LAYER)
    man = store.push_manifest(oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config, layers=[layer],
                                                annotations={artifact.CREATED: created}),
                              tag=f"rocforge-test-{name}")
    artifact.attach(store, man, oci.SIGNATURE_TYPE, None, pair)
    return man


def _revocation(pair, reason="compromised", at=None, key_text=None, **extra) -> dict:
    doc = {"schema": keys.REVOCATION_SCHEMA, "key": key_text or pair.public.text, "reason": reason,
           "revoked_at": at or _at(0), "note": "", "rocforge": "test"}
    return {**doc, **extra}


def _push_statement(store, artifact_type, tag, doc_bytes: bytes, signers, *, comment=None, signer_id="") -> None:
    digest = oci.sha256_digest(doc_bytes)
    kind = "key-revocation" if artifact_type == keys.REVOCATION_TYPE else "key-rotation"
    sigs = [signing.sign(doc_bytes, p, comment or f"rocforge {kind} {digest}") for p in signers]
    keys._push(store, artifact_type, tag, doc_bytes, sigs, signer_id)


def _trusted(*entries: str):
    return signing.trusted_keys_from_config(list(entries))


def _check(store_url, trusted):
    """(the keys with the store's revocations applied, the lines) through the same call a pull makes."""
    applied, lines, unread = keys.with_revocations(trusted, [store_url], 5)
    assert not unread, lines
    assert all("\n" not in line and "Traceback" not in line for line in lines)
    return applied, lines


def _refusal(store_url, man, trusted) -> str:
    with open_store(store_url, timeout=5) as store, pytest.raises(Refused) as exc:
        artifact.signed_by(store, man, trusted)
    assert "\n" not in exc.value.message
    return exc.value.message


def _signer(store_url, man, trusted) -> str:
    with open_store(store_url, timeout=5) as store:
        return artifact.signed_by(store, man, trusted)


# -- revocations on every kind of store ----------------------------------------------------------

def _revocation_round(store_url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(store_url, timeout=5) as store:
        old = _build(store, a, _at(-3600), "old")
        new = _build(store, a, _at(0), "new")
        other = _build(store, b, _at(0), "other")
        keys.publish_revocation(store, _revocation(a, "retired", at=_at(-60)), a)
    trusted, lines = _check(store_url, _trusted(a.public.text, b.public.text))
    assert not lines
    assert _signer(store_url, old, trusted) == a.key_id  # signed (by its claim) before: kept
    line = _refusal(store_url, new, trusted)
    assert "revoked by its revocation sha256:" in line and "retired" in line and store_url in line
    assert _signer(store_url, other, trusted) == b.key_id  # another key's builds: untouched
    with open_store(store_url, timeout=5) as store:
        keys.publish_revocation(store, _revocation(a, "compromised"), a)
    trusted, _ = _check(store_url, _trusted(a.public.text, b.public.text))
    line = _refusal(store_url, old, trusted)  # compromised: nothing it ever signed
    assert "revoked as compromised by its revocation sha256:" in line and a.key_id in line
    assert _signer(store_url, other, trusted) == b.key_id


def test_a_revocation_in_a_layout_on_disk(url, pairs):
    _revocation_round(url, pairs)


@needs("docker-registry")
def test_a_revocation_in_debians_docker_registry(tmp_path, pairs, monkeypatch):
    from registry_server import clear_store_environment, start_registry

    clear_store_environment(monkeypatch)
    with start_registry(tmp_path) as reg:
        _revocation_round(reg.store_url("team/keys"), pairs)


def test_a_revocation_in_s3(s3_server, pairs, monkeypatch):
    use_s3(monkeypatch, s3_server)
    _revocation_round("s3://keys/team", pairs)


# -- forged, replayed and malformed revocations ---------------------------------------------------

def test_a_key_cannot_revoke_another_key(url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(url, timeout=5) as store:
        build = _build(store, b, _at(0))
        forged = oci.canonical_json(_revocation(b))  # names b, signed by a, under b's tag
        _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{b.key_id}-000000000001",
                        forged, [a], signer_id=b.key_id)
        keys.publish_revocation(store, _revocation(b), a)  # names b, signed by a, under a's tag
        # b's key number with a's key: the id matches, the key does not
        twin = signing.PublicKey(b.public.keynum, a.public.raw).text
        _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{b.key_id}-000000000002",
                        oci.canonical_json(_revocation(a, key_text=twin)), [a], signer_id=b.key_id)
    trusted, lines = _check(url, _trusted(a.public.text, b.public.text))
    assert _signer(url, build, trusted) == b.key_id
    assert any("not signed by the key it revokes" in line for line in lines), lines
    assert any(f"its tag names the key {a.key_id}, its document {b.key_id}" in line for line in lines), lines
    assert any("other than the trusted key of that id" in line for line in lines), lines
    assert not [k for k in trusted if k.revoked]


def test_a_revocation_replayed_into_another_store_still_holds(tmp_path, pairs):
    """A revocation is the key's own word wherever it lies: copied by anyone to any store, it
    revokes as it did; it can be spread, never forged or undone."""
    a = pairs[0]
    first, second = f"file://{tmp_path / 'one'}", f"file://{tmp_path / 'two'}"
    with open_store(first, timeout=5) as store:
        keys.publish_revocation(store, _revocation(a), a)
        data = store.read_blob(store.manifest(store.tags()[0]).layers[0])
        sig = store.read_blob(store.manifest(store.tags()[0]).layers[1]).decode()
    with open_store(second, timeout=5) as store:
        build = _build(store, a, _at(0))
        keys._push(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{a.key_id}-replayed0000", data, [sig],
                   a.key_id)
    trusted, _ = _check(second, _trusted(a.public.text))
    assert "compromised" in _refusal(second, build, trusted)


@pytest.mark.parametrize("change, why", [
    ({"reason": "lost"}, "is not one of compromised, retired"),
    ({"reason": 1}, "is a int, not a text"),
    ({"key": ["RW"]}, "is a list, not a text"),
    ({"revoked_at": "2026-11-29T08:00:00+01:00"}, "is not YYYY-MM-DDTHH:MM:SSZ"),
    ({"revoked_at": "2026-02-30T00:00:00Z"}, "is not a real date"),
    ({"revoked_at": 1764400000}, "is a int"),
    ({"note": "a\nb"}, "one printable line"),
    ({"note": "x" * 400}, "one printable line"),
    ({"extra": "field"}, "has the fields"),
    ({"schema": "rocforge.key-revocation/2"}, "not a rocforge.key-revocation/1 document"),
    ({"key": "RW" + "A" * 200}, "not one public key line"),
])
def test_a_malformed_revocation_is_one_line_and_revokes_nothing(url, pairs, change, why):
    a = pairs[0]
    with open_store(url, timeout=5) as store:
        build = _build(store, a, _at(0))
        doc = oci.canonical_json({**_revocation(a), **change})
        _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{a.key_id}-bad000000000", doc, [a],
                        signer_id=a.key_id)
    trusted, lines = _check(url, _trusted(a.public.text))
    assert len(lines) == 1 and why in lines[0], lines
    assert _signer(url, build, trusted) == a.key_id


def test_garbage_beside_a_good_revocation_leaves_the_good_one_working(url, pairs):
    a = pairs[0]
    tag = f"{keys.REVOCATION_TAG}{a.key_id}-"
    with open_store(url, timeout=5) as store:
        build = _build(store, a, _at(0))
        huge = b'{"schema": "' + b"x" * (1 << 20) + b'"}'
        _push_statement(store, keys.REVOCATION_TYPE, tag + "huge00000000", huge, [a], signer_id=a.key_id)
        _push_statement(store, keys.REVOCATION_TYPE, tag + "nested000000", b"[" * 100000 + b"]" * 100000, [a])
        _push_statement(store, keys.REVOCATION_TYPE, tag + "notjson00000", b"\xff\xfe", [a])
        _push_statement(store, keys.REVOCATION_TYPE, tag + "othercomment", oci.canonical_json(_revocation(a)),
                        [a], comment="rocforge build sha256:" + "0" * 64)
        _push_statement(store, keys.REVOCATION_TYPE, tag + "twosigs00000", oci.canonical_json(_revocation(a)), [a, a])
        _push_statement(store, keys.ROTATION_TYPE, tag + "wrongtype000", oci.canonical_json(_revocation(a)), [a])
        keys._push(store, keys.REVOCATION_TYPE, tag + "badsig000000", oci.canonical_json(_revocation(a)),
                   ["not a signature"], a.key_id)
        keys.publish_revocation(store, _revocation(a), a)
    trusted, lines = _check(url, _trusted(a.public.text))
    assert len(lines) == 7, lines  # each piece of garbage one line
    assert "compromised" in _refusal(url, build, trusted)


def test_a_store_crowding_a_keys_revocations_costs_a_line_and_no_time(url, pairs):
    """Whoever writes to a store can also hide a revocation there (delete its tag); what rocforge
    bounds is the reading: at most MAX_PER_KEY statements per key and store, one line for the rest."""
    a = pairs[0]
    with open_store(url, timeout=5) as store:
        for i in range(40):
            _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{a.key_id}-{i:012d}",
                            b"{}", [a])
    started = time.monotonic()
    _, lines = _check(url, _trusted(a.public.text))
    assert time.monotonic() - started < 5
    assert any(f"40 revocation statements name the key {a.key_id}; only {keys.MAX_PER_KEY} are read" in line
               for line in lines), lines
    assert len(lines) == keys.MAX_LINES + 1 and lines[-1].endswith("9 more key statements left out")


def test_a_store_whose_revocations_cannot_be_read_is_not_trusted(pairs):
    """A store that does not answer may hold a revocation: nothing is pulled from it this time."""
    dead = "oci+http://127.0.0.1:9/team/keys"
    started = time.monotonic()
    trusted, lines, unread = keys.with_revocations(_trusted(pairs[0].public.text), [dead], 2)
    assert set(unread) == {dead} and len(lines) == 1 and "nothing is pulled from it" in lines[0]
    assert time.monotonic() - started < 10


def test_revocations_of_keys_that_are_not_trusted_are_not_read(url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(url, timeout=5) as store:
        for i in range(20):
            _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{b.key_id}-{i:012d}",
                            b"x" * 1000, [b])
    trusted, lines = _check(url, _trusted(a.public.text))
    assert not lines and not [k for k in trusted if k.revoked]


# -- rotations --------------------------------------------------------------------------------

def _rotation(old, new, at=None, **extra) -> bytes:
    return oci.canonical_json({"schema": keys.ROTATION_SCHEMA, "old": old.public.text, "new": new.public.text,
                               "made_at": at or _at(-10), "rocforge": "test", **extra})


def _push_rotation(store, old, new, data: bytes, signers=None, suffix="000000000000") -> None:
    _push_statement(store, keys.ROTATION_TYPE, f"{keys.ROTATION_TAG}{old.key_id}-{suffix}", data,
                    signers or [old, new], signer_id=old.key_id)


def _rotations(store_url, trusted):
    with open_store(store_url, timeout=5) as store:
        found, lines = keys.read_rotations(store, trusted)
    assert all("\n" not in line for line in lines)
    return found, lines


def test_a_rotation_needs_both_signatures(url, pairs):
    a, b, c = pairs[0], pairs[1], pairs[2]
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b), [a, c], "000000000001")  # b never agreed
        _push_rotation(store, a, b, _rotation(a, b), [c, b], "000000000002")  # a never said so
        _push_rotation(store, a, b, _rotation(a, b), [a], "000000000003")
    found, lines = _rotations(url, _trusted(a.public.text))
    assert not found and len(lines) == 3
    assert "the new key's signature does not hold" in lines[0]
    assert "the old key's signature does not hold" in lines[1]
    assert "not one document and 2 signature(s)" in lines[2]


def test_a_rotation_grants_no_more_than_the_old_key_had(url, pairs):
    a, b = pairs[0], pairs[1]
    window = f"{a.public.text} not-before={_at(-7200)} not-after={_at(-3600)}"
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b, at=_at(-5000)))  # made inside a's window
    found, lines = _rotations(url, _trusted(window))
    assert not found and "now is outside" in lines[0]  # a expired: it rotates nothing any more
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b, at=_at(-9000)), suffix="000000000001")
    found, lines = _rotations(url, _trusted(f"{a.public.text} not-before={_at(-7200)}"))
    assert len(found) == 1 and any("the signing time it claims" in line for line in lines)
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b, at=_at(3600)), suffix="000000000002")
    found, lines = _rotations(url, _trusted(a.public.text))
    assert any("in the future" in line for line in lines)


def test_a_revoked_key_rotates_nothing(url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b, at=_at(-10)))  # made after the retirement below
        keys.publish_revocation(store, _revocation(a, "retired", at=_at(-60)), a)
    trusted, _ = _check(url, _trusted(a.public.text))
    found, lines = _rotations(url, trusted)
    assert not found and "revoked by its revocation" in lines[0] and "not before it" in lines[0]
    with open_store(url, timeout=5) as store:  # an old statement, made before it retired: it holds
        _push_rotation(store, a, b, _rotation(a, b, at=_at(-120)), suffix="000000000001")
    found, _ = _rotations(url, trusted)
    assert [r.new for r in found] == [b.public]


def test_a_key_rotated_to_two_keys_is_followed_to_neither(url, pairs):
    a, b, c = pairs[0], pairs[1], pairs[2]
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b), suffix="000000000001")
        _push_rotation(store, a, c, _rotation(a, c), suffix="000000000002")
    configured = _trusted(a.public.text)
    found, _ = _rotations(url, configured)
    added, lines = keys.new_entries(found, configured, None)
    assert not added and "rotated to 2 different keys" in lines[0]


def test_rotation_loops_and_self_rotations_grant_nothing_new(url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(url, timeout=5) as store:
        _push_rotation(store, a, b, _rotation(a, b), suffix="000000000001")
        _push_rotation(store, b, a, _rotation(b, a), suffix="000000000002")
        _push_rotation(store, a, a, _rotation(a, a), [a, a], suffix="000000000003")
    configured = _trusted(a.public.text)
    found, lines = _rotations(url, configured)
    assert any("rotates a key to itself" in line for line in lines)
    added, said = keys.new_entries(found, configured, None)
    assert added == [f"{b.public.text} not-before={_at(-10)} via={a.key_id}"]
    configured = _trusted(a.public.text, *added)
    found, _ = _rotations(url, configured)  # now b -> a is read too: a is trusted already
    added, said = keys.new_entries(found, configured, None)
    assert not added and all("trusted already" in line for line in said)
    # a hand-made loop in the config is refused when it is read
    with pytest.raises(Exception, match="loops"):
        _trusted(f"{a.public.text} via={b.key_id}", f"{b.public.text} via={a.key_id}")


def test_a_successor_falls_with_a_compromised_predecessor(url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(url, timeout=5) as store:
        build = _build(store, b, _at(0))
        keys.publish_revocation(store, _revocation(a, "retired", at=_at(0)), a)
    entries = (a.public.text, f"{b.public.text} not-before={_at(-60)} via={a.key_id}")
    trusted, _ = _check(url, _trusted(*entries))
    assert _signer(url, build, trusted) == b.key_id  # a retired predecessor ends nothing of b's
    with open_store(url, timeout=5) as store:
        keys.publish_revocation(store, _revocation(a, "compromised"), a)
    trusted, _ = _check(url, _trusted(*entries))
    line = _refusal(url, build, trusted)
    assert f"came through the key {a.key_id}, which is revoked as compromised" in line


def test_a_build_claiming_a_time_outside_the_window_is_refused(url, pairs):
    a = pairs[0]
    with open_store(url, timeout=5) as store:
        early = _build(store, a, _at(-10 * 86400), "early")
        future = _build(store, a, _at(86400), "future")
        unclaimed = _build(store, a, "yesterday", "unclaimed")
    trusted = _trusted(f"{a.public.text} not-before={_at(-86400)}")
    assert "the signing time it claims" in _refusal(url, early, trusted)
    assert "in the future" in _refusal(url, future, trusted)
    assert _signer(url, unclaimed, trusted) == a.key_id  # no claim narrows nothing: now is inside
    expired = _trusted(f"{a.public.text} not-after={_at(-1)}")
    assert "now is outside" in _refusal(url, unclaimed, expired)


def test_statement_documents_are_read_capped(url, pairs, monkeypatch):
    """A 20 MiB document is never read whole: the read stops at the cap."""
    a = pairs[0]
    with open_store(url, timeout=5) as store:
        _push_statement(store, keys.REVOCATION_TYPE, f"{keys.REVOCATION_TAG}{a.key_id}-big000000000",
                        b" " * (20 << 20), [a])
    started = time.monotonic()
    _, lines = _check(url, _trusted(a.public.text))
    assert len(lines) == 1 and time.monotonic() - started < 5, lines
    shutil.rmtree(url.removeprefix("file://"))


def test_a_key_sharing_anothers_key_number_cannot_revoke_it(url, pairs):
    """Two trusted keys may share a key number (minisign's id is 8 random bytes, and anyone can
    choose theirs): a revocation is matched by the whole key, so one cannot revoke the other."""
    a = pairs[0]
    twin = signing.KeyPair(signing.PublicKey(a.public.keynum, pairs[1].public.raw), pairs[1].seed)
    with open_store(url, timeout=5) as store:
        build = _build(store, a, _at(0))
        keys.publish_revocation(store, _revocation(twin), twin)  # the twin's own, valid revocation
    trusted, lines = _check(url, _trusted(a.public.text, twin.public.text))
    assert not lines
    assert [k.revoked is not None for k in trusted] == [False, True]
    assert _signer(url, build, trusted) == a.key_id
    with pytest.raises(Exception, match="which two entries share"):
        _trusted(a.public.text, twin.public.text, f"{pairs[2].public.text} via={a.key_id}")
    with pytest.raises(Exception, match="again with other options"):
        _trusted(a.public.text, f"{a.public.text} not-after={_at(0)}")
    assert len(_trusted(a.public.text, a.public.text)) == 1  # the same entry twice: as before


def test_a_compromised_keys_nightly_advisories_are_left_out(url, pairs):
    from rocforge_build.substitute import advisories

    a = pairs[0]
    with open_store(url, timeout=5) as store:
        advisories.publish(store, advisories.make_document("7.15.0a20260702", "7.15.0a20260702", [],
                                                           "bad", "t"), a)
    found, _ = advisories.nightly_advisories([url], _trusted(a.public.text), 5)
    assert len(found) == 1
    with open_store(url, timeout=5) as store:
        keys.publish_revocation(store, _revocation(a), a)
    trusted, _ = _check(url, _trusted(a.public.text))
    found, lines = advisories.nightly_advisories([url], trusted, 5)
    assert not found and any("revoked as compromised" in line for line in lines), lines


def _rotation_round(store_url, pairs):
    a, b = pairs[0], pairs[1]
    with open_store(store_url, timeout=5) as store:
        keys.publish_rotation(store, keys.make_rotation(a, b, "t"), a, b)
    configured = _trusted(a.public.text)
    found, lines = _rotations(store_url, configured)
    added, _ = keys.new_entries(found, configured, None)
    assert not lines and len(added) == 1 and added[0].startswith(b.public.text)


@needs("docker-registry")
def test_a_rotation_in_debians_docker_registry(tmp_path, pairs, monkeypatch):
    from registry_server import clear_store_environment, start_registry

    clear_store_environment(monkeypatch)
    with start_registry(tmp_path) as reg:
        _rotation_round(reg.store_url("team/keys"), pairs)


def test_a_rotation_in_s3(s3_server, pairs, monkeypatch):
    use_s3(monkeypatch, s3_server)
    _rotation_round("s3://keys/rotations", pairs)


@pytest.mark.parametrize("stalled", [r".*/tags/list", r".*/manifests/rocforge-key-revocation-.*"])
def test_a_store_that_hangs_over_its_revocations_costs_its_timeout_and_is_not_trusted(pairs, stalled):
    import threading

    from registry_server import FakeRegistry

    a = pairs[0]
    release = threading.Event()

    def hang(_request):
        release.wait(30)
        return 404, {}, b""
    with FakeRegistry() as fake:
        with open_store(fake.store_url(), timeout=5) as store:
            keys.publish_revocation(store, _revocation(a), a)
        fake.route("GET", stalled, hang)
        started = time.monotonic()
        try:
            trusted, lines, unread = keys.with_revocations(_trusted(a.public.text), [fake.store_url()], 1)
        finally:
            release.set()
    assert time.monotonic() - started < 8
    assert list(unread) == [fake.store_url()] and len(lines) == 1 and "nothing is pulled from it" in lines[0]
