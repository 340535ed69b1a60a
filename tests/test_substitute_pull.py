"""substitute/pull.py's `attempt`, asked by the pipeline before anything is compiled: which store
answers, in the configured order, and what it says when none may be used.  A build without a key
asks nobody; a store without the key's artifact is a miss named by its URL; an artifact is used
only under a signature of a trusted key (none configured: none trusted); a trusted advisory stops
the search (a compile makes the same bytes); a pulled tree with no way to verify it here says so
instead of passing.  The stores are real OCI image layouts on disk (`file://`) holding an
artifact made here with artifact.py, so nothing is built or packed.  Pulling a real build end to
end is tests/e2e/test_substitute_fixture.py's; forged stores are
tests/attack/test_substitute_pull_hostile.py's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rocforge_build.forge.substitute_key import SubstituteKey, SubstitutePolicy
from rocforge_build.substitute import artifact, oci, pull, signing
from rocforge_build.substitute.stores import open_store

KEY = SubstituteKey.of_fields({"recipe": "fixture", "target": "", "backend": "cpu",
                               "source": {"kind": "git", "commit": "c" * 40}})


def plan(tmp_path: Path, stores: list[str], trusted: list[signing.KeyPair] = (), *,
         key: SubstituteKey | None = KEY, verify: str = "none"):
    """What `attempt` reads of a plan: its key (or why it has none), the policy, the prefix."""
    policy = SubstitutePolicy("only", tuple(stores), tuple(p.public.text for p in trusted), verify,
                              "", False, "", 1 << 20, 5.0)
    return SimpleNamespace(substitutes=policy, substitute_key=key, prefix=tmp_path / "prefix",
                           no_substitute_key="the source is a local tree that is not a clean checkout")


def publish_by_hand(url: str, pair: signing.KeyPair, advisory: str | None = None, key: SubstituteKey = KEY
                    ) -> None:
    """`key`'s artifact in the store at `url`, signed by `pair` (and an advisory of `pair`'s)."""
    with open_store(url, timeout=5.0) as store:
        config = store.push_blob_bytes(key.document, oci.KEY_CONFIG)
        layer = store.push_blob_bytes(b"not a bundle: never reached here", oci.BUNDLE_LAYER)
        man = store.push_manifest(artifact.build_manifest(key, config, layer, {}), tag=key.tag)
        artifact.attach(store, man, oci.SIGNATURE_TYPE, None, pair)
        if advisory:
            artifact.attach(store, man, oci.ADVISORY_TYPE,
                            {"schema": "rocforge.advisory/1", "key": KEY.digest, "reason": advisory}, pair)


@pytest.fixture(scope="module")
def publisher() -> signing.KeyPair:
    return signing.generate()


def test_a_build_without_a_key_asks_no_store(tmp_path):
    said = []
    out = pull.attempt(plan(tmp_path, [(tmp_path / "s").as_uri()], key=None), tmp_path / "staging", said.append)
    assert (out.staged, out.why, out.tried) == (
        False, "no key: the source is a local tree that is not a clean checkout", ())
    assert said == [] and not (tmp_path / "s").exists()


def test_each_store_without_the_artifact_is_a_miss_named_by_its_url_in_order(tmp_path, publisher):
    absent, other = (tmp_path / "absent").as_uri(), (tmp_path / "other").as_uri()
    publish_by_hand(other, publisher, key=SubstituteKey.of_fields({**KEY.fields, "backend": "vulkan"}))
    out = pull.attempt(plan(tmp_path, [absent, other], [publisher]), tmp_path / "staging", lambda _: None)
    assert out.tried == (f"{absent}: not in this store", f"{other}: not in this store")
    assert not out.staged and out.why == "; ".join(out.tried) and not (tmp_path / "staging").exists()


def test_without_trusted_keys_no_signature_is_trusted(tmp_path, publisher):
    url = (tmp_path / "store").as_uri()
    publish_by_hand(url, publisher)
    out = pull.attempt(plan(tmp_path, [url]), tmp_path / "staging", lambda _: None)
    assert out.tried == (f"{url}: untrusted: substitute.trusted_keys is empty, so no signature can be "
                         "trusted",)
    other = signing.generate()  # trusted, but not the key that signed it
    out = pull.attempt(plan(tmp_path, [url], [other]), tmp_path / "staging", lambda _: None)
    assert not out.staged and len(out.tried) == 1 and url in out.tried[0]
    assert "trusted" in out.tried[0] and not (tmp_path / "staging").exists()


def test_a_trusted_advisory_stops_the_search_before_the_next_store(tmp_path, publisher):
    bad, good = (tmp_path / "bad").as_uri(), (tmp_path / "good").as_uri()
    publish_by_hand(bad, publisher, advisory="wrong answers on gfx1151 with ROCm 7.13")
    out = pull.attempt(plan(tmp_path, [bad, good], [publisher]), tmp_path / "staging", lambda _: None)
    assert not out.staged and out.advisory == (f"known bad: an advisory signed by {publisher.key_id} "
                                               "says: wrong answers on gfx1151 with ROCm 7.13")
    assert len(out.tried) == 1 and out.tried[0].startswith(bad)  # `good` never asked
    assert not (tmp_path / "good").exists()


def test_a_pulled_tree_that_cannot_be_verified_here_says_why_and_never_passes(tmp_path):
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    said = []
    p = plan(tmp_path, [], verify="none")
    assert pull.verify_here(tree, p, None, [], said.append) == (
        "not verified here", ["substitute.verify is none"], None)
    p = plan(tmp_path, [], verify="quick")
    verdict, lines, _ = pull.verify_here(tree, p, None, [], said.append)
    assert verdict == "not verified here" and lines[0].startswith("no substitute.verify_model")
    verdict, lines, _ = pull.verify_here(tree, p, object(), [], said.append)
    assert (verdict, lines) == ("not verified here", ["it has no llama-perplexity to verify with"])
    # and nothing of a verify that did not pass is recorded for the prefix
    pull.record_verified(p, {"verified_here": verdict}, None)
    assert said == [] and not (tmp_path / "prefix").exists()
