"""substitute/keys.py's workflows, in process on file:// stores (real OCI image layouts): the
rotations a consumer may follow across stores, a publisher's fork refused before anything is
written, a statement published to every store that answers."""

from __future__ import annotations

import pytest

from rocforge_build.errors import UsageError
from rocforge_build.substitute import keys, signing
from rocforge_build.substitute.stores import open_store


def _publish(url: str, old: signing.KeyPair, new: signing.KeyPair) -> None:
    with open_store(url, timeout=5) as store:
        keys.publish_rotation(store, keys.make_rotation(old, new, "test"), old, new)


def test_a_rotation_is_followed_unless_another_store_rotates_the_key_elsewhere(tmp_path):
    old, owners, thiefs = signing.generate(), signing.generate(), signing.generate()
    here, there = f"file://{tmp_path / 'here'}", f"file://{tmp_path / 'there'}"
    _publish(here, old, owners)
    with open_store(there, timeout=5):
        pass  # an empty store: nothing to fork with
    trusted = signing.trusted_keys_from_config([old.public.text])
    warned: list[str] = []
    got = keys.followable_rotations(here, [here, there], trusted, 5, warned.append)
    assert [(r.old.key_id, r.new.key_id) for r in got] == [(old.key_id, owners.key_id)] and warned == []
    _publish(there, old, thiefs)  # the same key rotated to another key in another configured store
    got = keys.followable_rotations(here, [here, there], trusted, 5, warned.append)
    assert got == []
    assert warned == [f"no rotation of {old.key_id} is followed: another configured store holds a rotation "
                      "of it to another key, or one that cannot be read (one of them is not its owner's)"]


def test_a_configured_store_whose_rotations_cannot_be_read_stops_the_trust(tmp_path):
    old, new = signing.generate(), signing.generate()
    here = f"file://{tmp_path / 'here'}"
    _publish(here, old, new)
    (tmp_path / "broken").write_text("not a store")  # a file where the layout's directory should be
    with pytest.raises(UsageError, match="could not be read"):
        keys.followable_rotations(here, [here, f"file://{tmp_path / 'broken'}"],
                                  signing.trusted_keys_from_config([old.public.text]), 5, lambda line: None)


def test_a_second_rotation_to_another_key_is_refused_and_the_same_one_is_not(tmp_path):
    old, first, second = signing.generate(), signing.generate(), signing.generate()
    url = f"file://{tmp_path / 'store'}"
    _publish(url, old, first)
    keys.refuse_fork([url], old, first, 5)  # publishing the first again elsewhere: no fork
    with pytest.raises(UsageError, match=f"holds a rotation of {old.key_id} to {first.key_id} already"):
        keys.refuse_fork([url], old, second, 5)


def test_publish_each_reaches_every_store_that_answers_and_counts_the_others(tmp_path):
    pair = signing.generate()
    doc = keys.make_revocation(pair, "retired", "moved to a new laptop", "test")
    (tmp_path / "blocked").write_text("")
    urls = [f"file://{tmp_path / 'a'}", f"file://{tmp_path / 'blocked'}", f"file://{tmp_path / 'b'}"]
    lines: list[str] = []
    done, failed = keys.publish_each(urls, 5, lambda store: keys.publish_revocation(store, doc, pair), lines.append)
    assert failed == 1 and [d["store"] for d in done] == [urls[0], urls[2]]
    assert all(d["tag"].startswith(keys.REVOCATION_TAG + pair.key_id) for d in done)
    assert len(lines) == 1 and lines[0].startswith(f"{urls[1]}: not published: ")
