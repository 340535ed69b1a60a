"""Signatures in minisign's format (rocforge_build/substitute/signing.py): rocforge's own round
trip, known answers made by minisign 0.11 itself (so the format is checked against the program,
not against rocforge's own constants), the real `minisign` both ways where it is installed
(Debian package minisign), key files and `rocforge key generate`."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from needs import needs
from trust_helpers import one_error, rocforge

from rocforge_build.errors import ConfigError
from rocforge_build.substitute import signing
from rocforge_build.substitute.signing import PublicKey, SignatureError

# Made by `minisign -G -W -p mpub -s msec`, then `minisign -S -s msec -m m2` and
# `minisign -S -l -s msec -m m2 -x m2.legacy -t "legacy one"` for m2 = b"data\n" (minisign 0.11);
# minisign wrote the key id into the public key file's comment.
MINISIGN_PUB_FILE = ("untrusted comment: minisign public key DEAC1E7840211711\n"
                     "RWQRFyFAeB6s3o4YXT4aTi1cLHly5ispWqiOu0lXGihNQXFE1l3PNK9c\n")
MINISIGN_KEY_ID = "DEAC1E7840211711"
MINISIGN_SECRET_FILE = (
    "untrusted comment: minisign encrypted secret key\n"
    "RWQAAEIyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAERchQHgerN6lWmCdCizs6pNX"
    "De6HsuBS1Vet4F6d8WFnmMzHmXlBF44YXT4aTi1cLHly5ispWqiOu0lXGihNQXFE1l3PNK9cAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAA=\n")
MESSAGE = b"data\n"
MINISIGN_SIGNATURE = (
    "untrusted comment: signature from minisign secret key\n"
    "RUQRFyFAeB6s3lSsxCvdox2UD/QiYvj19SIMM/fgmNqd+snkxfuFxOSqnXfNcsiOPFW4JKgVfMTbMyc4mIihIhKijJPqW4RnawU=\n"
    "trusted comment: timestamp:1795729890\tfile:m2\thashed\n"
    "oZAvJfTejaSVUC+Qza49UFCwmjzhRMkhzkv/p8HCL8X1OSmo3xE8KWV/faRH59g6MoPagRP3OTAPCZ7Lm9CqBw==\n")
MINISIGN_LEGACY_SIGNATURE = (
    "untrusted comment: signature from minisign secret key\n"
    "RWQRFyFAeB6s3gef1H/tUjQtJ1UH2R5Msiz5rHEOATl1peE6mQei/hSuVu/rGA+o64Gwz2j7mt/B5k/nGJpAGrr3fH51cCrqGwI=\n"
    "trusted comment: legacy one\n"
    "r3BM0fNNwRbYi7njR18xw+CfgsrZ4Nizd3WNDExKHg5YS9zLkLvw7WXqczbvjytMBrwnzG5wx+7mfYBY5v7aAw==\n")


def test_round_trip_names_the_key_and_the_trusted_comment():
    pair = signing.generate()
    text = signing.sign(b"the manifest's bytes", pair, "rocforge build sha256:ab")
    verified = signing.verify(b"the manifest's bytes", text, [signing.generate().public, pair.public])
    assert (verified.key_id, verified.trusted_comment) == (pair.key_id, "rocforge build sha256:ab")
    assert len(verified.key_id) == 16 and verified.key_id == verified.key_id.upper()


def test_signature_text_is_minisigns_four_lines():
    pair = signing.generate()
    lines = signing.sign(b"x", pair, "a comment").split("\n")
    assert lines[0].startswith("untrusted comment: ") and lines[2] == "trusted comment: a comment"
    assert base64.b64decode(lines[1])[:2] == b"ED"  # a prehashed signature
    assert len(lines) == 5 and lines[4] == ""


def test_a_minisign_public_key_file_and_its_line_parse_alike():
    from_file = PublicKey.parse(MINISIGN_PUB_FILE)
    from_line = PublicKey.parse(MINISIGN_PUB_FILE.splitlines()[1])
    assert from_file == from_line
    assert from_file.key_id == MINISIGN_KEY_ID
    assert from_file.text == MINISIGN_PUB_FILE.splitlines()[1]


def test_minisigns_prehashed_signature_verifies():
    verified = signing.verify(MESSAGE, MINISIGN_SIGNATURE, [PublicKey.parse(MINISIGN_PUB_FILE)])
    assert verified.key_id == MINISIGN_KEY_ID
    assert verified.trusted_comment == "timestamp:1795729890\tfile:m2\thashed"


def test_minisigns_legacy_signature_verifies():
    verified = signing.verify(MESSAGE, MINISIGN_LEGACY_SIGNATURE, [PublicKey.parse(MINISIGN_PUB_FILE)])
    assert verified.trusted_comment == "legacy one"


def test_minisigns_unencrypted_secret_key_signs_for_its_public_key(tmp_path):
    key = tmp_path / "minisign.key"
    key.write_text(MINISIGN_SECRET_FILE)
    key.chmod(0o600)
    pair = signing.read_secret_key(key)
    assert pair.public == PublicKey.parse(MINISIGN_PUB_FILE)
    text = signing.sign(b"other", pair, "c")
    assert signing.verify(b"other", text, [PublicKey.parse(MINISIGN_PUB_FILE)]).key_id == MINISIGN_KEY_ID


def test_the_secret_key_never_shows_in_a_repr():
    pair = signing.generate()
    assert pair.seed.hex() not in repr(pair) and repr(pair.seed) not in repr(pair)


def test_key_pair_files_round_trip_with_their_modes(tmp_path):
    pair = signing.generate()
    old = os.umask(0)  # even a umask that takes nothing away leaves the secret key 0600
    try:
        signing.write_key_pair(tmp_path / "k" / "a.key", tmp_path / "k" / "a.pub", pair)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k" / "a.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k" / "a.pub").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    assert signing.read_secret_key(tmp_path / "k" / "a.key") == pair
    assert PublicKey.parse((tmp_path / "k" / "a.pub").read_text()) == pair.public
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["a.key", "a.pub"]


def test_an_existing_key_is_never_overwritten(tmp_path):
    first = signing.generate()
    signing.write_key_pair(tmp_path / "a.key", tmp_path / "a.pub", first)
    with pytest.raises(ConfigError, match="already exists"):
        signing.write_key_pair(tmp_path / "a.key", tmp_path / "a.pub", signing.generate())
    assert signing.read_secret_key(tmp_path / "a.key") == first


def test_trusted_keys_from_config_keeps_each_key_once():
    a, b = signing.generate().public, signing.generate().public
    assert signing.trusted_keys_from_config([a.text, b.text, a.text]) == [a, b]
    assert signing.trusted_keys_from_config([]) == []


@pytest.mark.parametrize("bad", ["", "RW" + "A" * 54, "not a key", "RWQRFyFAeB6s3o4Y", 3, None])
def test_a_bad_trusted_key_names_its_entry(bad):
    good = signing.generate().public.text
    with pytest.raises(ConfigError) as exc:
        signing.trusted_keys_from_config([good, bad])
    assert exc.value.message.startswith("substitute.trusted_keys[1] ")
    assert "\n" not in exc.value.message


@pytest.mark.parametrize("comment", ["two\nlines", "cr\r", "esc \x1b[2J", "nul\0", "c1 \x85",
                                     "x" * 1025])
def test_sign_refuses_a_trusted_comment_verify_would_refuse(comment):
    with pytest.raises(SignatureError):
        signing.sign(b"x", signing.generate(), comment)


@needs("minisign")
def test_minisign_verifies_what_rocforge_signs(tmp_path):
    pair = signing.generate()
    message = tmp_path / "manifest.json"
    message.write_bytes(b'{"schemaVersion": 2}')
    (tmp_path / "manifest.json.minisig").write_text(
        signing.sign(message.read_bytes(), pair, "rocforge build sha256:01"))
    res = subprocess.run(["minisign", "-V", "-P", pair.public.text, "-m", str(message)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "Trusted comment: rocforge build sha256:01" in res.stdout
    message.write_bytes(b'{"schemaVersion": 3}')
    res = subprocess.run(["minisign", "-V", "-P", pair.public.text, "-m", str(message)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0


@needs("minisign")
def test_rocforge_reads_minisigns_keys_and_signatures(tmp_path):
    pub, sec, message = tmp_path / "m.pub", tmp_path / "m.key", tmp_path / "file"
    subprocess.run(["minisign", "-G", "-W", "-p", str(pub), "-s", str(sec)], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
    message.write_bytes(b"a build's manifest\n")
    subprocess.run(["minisign", "-S", "-s", str(sec), "-m", str(message), "-t", "from minisign"],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
    public = PublicKey.parse(pub.read_text())
    # minisign spells the id in hex without leading zeros ("EF2FB6AB7E1693D" for one key in 16);
    # rocforge always writes 16 digits (registries' signer annotations compare that form): the same number
    said = pub.read_text().splitlines()[0].rsplit(" ", 1)[1]
    assert len(public.key_id) == 16 and int(public.key_id, 16) == int(said, 16)
    verified = signing.verify(message.read_bytes(), (tmp_path / "file.minisig").read_text(), [public])
    assert (verified.key_id, verified.trusted_comment) == (public.key_id, "from minisign")
    pair = signing.read_secret_key(sec)  # minisign writes its secret key 0600
    assert pair.public == public
    (tmp_path / "file.minisig").write_text(signing.sign(message.read_bytes(), pair, "from rocforge"))
    res = subprocess.run(["minisign", "-V", "-p", str(pub), "-m", str(message)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "Trusted comment: from rocforge" in res.stdout, res.stderr


@needs("minisign")
def test_minisign_reads_the_secret_key_rocforge_writes(tmp_path):
    pair = signing.generate()
    signing.write_key_pair(tmp_path / "r.key", tmp_path / "r.pub", pair)
    message = tmp_path / "file"
    message.write_bytes(b"bytes")
    subprocess.run(["minisign", "-S", "-W", "-s", str(tmp_path / "r.key"), "-m", str(message)],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
    assert signing.verify(b"bytes", (tmp_path / "file.minisig").read_text(), [pair.public])
    res = subprocess.run(["minisign", "-V", "-p", str(tmp_path / "r.pub"), "-m", str(message)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_key_generate_writes_the_pair_and_prints_the_public_key(tmp_path):
    res = rocforge("key", "generate", "--out", str(tmp_path / "keys"))
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert res.stdout == line + "\n"  # only the key
    public = PublicKey.parse(line)
    assert PublicKey.parse((tmp_path / "keys" / "rocforge.pub").read_text()) == public
    assert stat.S_IMODE((tmp_path / "keys" / "rocforge.key").stat().st_mode) == 0o600
    assert signing.read_secret_key(tmp_path / "keys" / "rocforge.key").public == public
    assert f"substitute.trusted_keys '[\"{line}\"]'" in res.stderr
    assert "substitute.signing_key" in res.stderr
    assert all(x.startswith("rocforge: ") for x in res.stderr.splitlines())

    again = rocforge("key", "generate", "--out", str(tmp_path / "keys"))
    assert "already exists" in one_error(again)
    assert again.stdout == ""
    assert signing.read_secret_key(tmp_path / "keys" / "rocforge.key").public == public


def test_key_generate_json_and_the_default_directory(tmp_path):
    res = rocforge("key", "generate", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    config_dir = Path(os.environ["ROCFORGE_CONFIG_DIR"])  # the session's isolated config dir
    assert doc["secret_key_path"] == str(config_dir / "keys" / "rocforge.key")
    assert doc["public_key_path"] == str(config_dir / "keys" / "rocforge.pub")
    public = PublicKey.parse(doc["public_key"])
    assert doc["key_id"] == public.key_id
    assert signing.read_secret_key(Path(doc["secret_key_path"])).public == public


def test_key_without_an_action_prints_usage():
    res = rocforge("key")
    assert res.returncode == 2 and "generate" in res.stderr and "Traceback" not in res.stderr
