"""`rocforge key rotate`, `key trust-rotation` and `key revoke` as a publisher and a consumer run
them (commands/key.py): the rotation lands in the store the publisher names, the consumer trusts the
new key only by its own explicit step and only through the old key, and a revocation ends it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trust_helpers import run

from rocforge_build import config
from rocforge_build.substitute import keys, signing
from rocforge_build.substitute.stores import open_store


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    """(publisher's config dir, consumer's config dir, store URL, the publisher's first key)."""
    publisher, consumer = tmp_path / "publisher", tmp_path / "consumer"
    url = f"file://{tmp_path / 'store'}"
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(publisher))
    code, out, err = run(capsys, "key", "generate")
    assert code == 0, err
    return publisher, consumer, url, out.split()[0]


def as_(monkeypatch, where: Path) -> None:
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(where))


def test_rotate_trust_rotation_and_revoke(world, monkeypatch, capsys):
    publisher, consumer, url, old = world
    code, out, err = run(capsys, "key", "rotate", "--to", url, "--json")
    assert code == 0, err
    rotated = json.loads(out)
    new = rotated["new_public_key"]
    assert rotated["published"][0]["tag"].startswith(keys.ROTATION_TAG + signing.PublicKey.parse(old).key_id)
    assert Path(rotated["secret_key_path"]).stat().st_mode & 0o777 == 0o600
    assert f"substitute.signing_key {rotated['secret_key_path']}" in err

    as_(monkeypatch, consumer)
    config.set_value("substitute.trusted_keys", [old])
    config.set_value("substitute.stores", [url])
    code, out, err = run(capsys, "key", "trust-rotation", url, "--dry-run")
    assert code == 0 and "(dry run) trusting the key" in err
    assert config.get("substitute.trusted_keys") == [old]  # nothing is trusted by default
    code, out, err = run(capsys, "key", "trust-rotation", url)
    assert code == 0 and f"trusting the key {rotated['new_key_id']}" in err, err
    entries = config.get("substitute.trusted_keys")
    assert entries == [old, f"{new} not-before={rotated['made_at']} via={rotated['old_key_id']}"]
    code, out, err = run(capsys, "key", "trust-rotation", url)
    assert code == 0 and "trusted already" in err and config.get("substitute.trusted_keys") == entries

    as_(monkeypatch, publisher)  # the old key is compromised: its revocation ends the new key too
    code, out, err = run(capsys, "key", "revoke", "--to", url, "--reason", "compromised", "--note", "laptop stolen",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["reason"] == "compromised"
    as_(monkeypatch, consumer)
    trusted, lines, unread = keys.with_revocations(
        signing.trusted_keys_from_config(config.get("substitute.trusted_keys")), [url], 5)
    assert not lines and not unread
    assert [k.revoked.reason for k in trusted] == ["compromised", "compromised"]
    assert "came through the key" in signing.trust_problem(trusted[1], None)


def test_rotate_new_key_publishes_the_same_rotation_to_another_store(world, monkeypatch, capsys, tmp_path):
    publisher, consumer, url, old = world
    code, out, err = run(capsys, "key", "rotate", "--to", url, "--out", str(tmp_path / "new"))
    assert code == 0, err
    second = f"file://{tmp_path / 'second'}"
    code, out2, err = run(capsys, "key", "rotate", "--to", second, "--new-key", str(tmp_path / "new/rocforge.key"))
    assert code == 0 and out2 == out, err
    with open_store(second, timeout=5) as store:
        assert [t for t in store.tags() if t.startswith(keys.ROTATION_TAG)]
    code, _, err = run(capsys, "key", "rotate", "--to", url, "--new-key",
                       str(publisher / "keys/rocforge.key"))
    assert code != 0 and "the new key is the old key" in err


def test_store_show_names_the_revocation_of_the_signer(world, monkeypatch, capsys, tmp_path):
    """`store list` reads the revocations of the store it lists and of every configured store, as a
    pull does, so a revoked signer is not shown as trusted."""
    from rocforge_build.substitute import artifact, oci

    publisher, consumer, url, old = world
    pair = signing.read_secret_key(publisher / "keys/rocforge.key")
    with open_store(url, timeout=5) as store:
        config_blob = store.push_blob_bytes(b'{"k": 1}', oci.KEY_CONFIG)
        layer = store.push_blob_bytes(b"bundle", oci.BUNDLE_LAYER)
        man = store.push_manifest(oci.make_manifest(artifact_type=oci.BUILD_TYPE, config=config_blob,
                                                    layers=[layer]), tag="rocforge-" + "0" * 64)
        artifact.attach(store, man, oci.SIGNATURE_TYPE, None, pair)
    as_(monkeypatch, consumer)
    config.set_value("substitute.trusted_keys", [old])
    code, out, err = run(capsys, "store", "list", url, "--json")
    assert code == 0 and json.loads(out)[0]["signed_by"] == pair.key_id, err
    elsewhere = f"file://{tmp_path / 'elsewhere'}"
    with open_store(elsewhere, timeout=5) as store:
        keys.publish_revocation(store, keys.make_revocation(pair, "compromised", "", "t"), pair)
    config.set_value("substitute.stores", [elsewhere])
    code, out, err = run(capsys, "store", "list", url, "--json")
    assert code == 0, err
    assert "revoked as compromised" in json.loads(out)[0]["signed_by"]
