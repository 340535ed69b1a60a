"""Attack tests: signatures, keys and key files a hostile store or a careless set-up hands
rocforge (rocforge_build/substitute/signing.py).  A changed byte anywhere is refused with a line
saying what does not hold; a signature by an unknown key names that key's id; malformed text of
any shape is one SignatureError line, never a traceback or a hang; key files are read only from
the user's own regular files that no one else can read, and written without ever overwriting or
following a link."""

from __future__ import annotations

import base64
import os
import threading

import pytest

from rocforge_build.errors import ConfigError
from rocforge_build.substitute import signing
from rocforge_build.substitute.signing import PublicKey, SignatureError

DATA = b'{"schemaVersion": 2, "layers": []}'
COMMENT = "rocforge build sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def pair() -> signing.KeyPair:
    return signing.generate()


@pytest.fixture(scope="module")
def signed(pair) -> list[str]:
    """The signature's four lines."""
    return signing.sign(DATA, pair, COMMENT).splitlines()


def refused(data: bytes, text, trusted) -> str:
    with pytest.raises(SignatureError) as exc:
        signing.verify(data, text, trusted)
    assert "\n" not in exc.value.message
    return exc.value.message


def flip_b64(line: str, byte: int) -> str:
    raw = bytearray(base64.b64decode(line))
    raw[byte] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


def test_a_changed_byte_of_the_data_is_refused(pair, signed):
    for at in (0, len(DATA) // 2, len(DATA) - 1):
        data = bytearray(DATA)
        data[at] ^= 0x20
        assert "does not match the data" in refused(bytes(data), "\n".join(signed), [pair.public])
    assert "does not match the data" in refused(DATA + b"\n", "\n".join(signed), [pair.public])


def test_a_changed_byte_of_the_signature_is_refused(pair, signed):
    for at in (10, 40, 73):  # in the Ed25519 signature: its R, its S, its last byte
        lines = [signed[0], flip_b64(signed[1], at), *signed[2:]]
        assert "does not match the data" in refused(DATA, "\n".join(lines), [pair.public])


def test_a_changed_trusted_comment_is_refused(pair, signed):
    for comment in (COMMENT.replace("ab", "cd", 1), COMMENT + " ", COMMENT[:-1], ""):
        lines = [signed[0], signed[1], "trusted comment: " + comment, signed[3]]
        assert "comment was altered" in refused(DATA, "\n".join(lines), [pair.public])


def test_a_changed_comment_signature_is_refused(pair, signed):
    lines = [*signed[:3], flip_b64(signed[3], 5)]
    assert "comment was altered" in refused(DATA, "\n".join(lines), [pair.public])


def test_the_untrusted_comment_is_not_signed(pair, signed):
    """minisign's rule: the first line is free text that nothing checks; changing it changes
    nothing that is trusted."""
    lines = ["untrusted comment: signed by your bank", *signed[1:]]
    assert signing.verify(DATA, "\n".join(lines), [pair.public]).trusted_comment == COMMENT


def test_a_signature_by_an_untrusted_key_names_its_key_id(pair, signed):
    message = refused(DATA, "\n".join(signed), [signing.generate().public])
    assert pair.key_id in message and "not trusted" in message
    assert pair.key_id in refused(DATA, "\n".join(signed), [])


def test_a_key_that_copies_a_trusted_key_id_cannot_sign_for_it(pair):
    """An attacker's key with the trusted key's id: the id only chooses the key; its signature
    still has to hold under the trusted public key."""
    forger = signing.generate()
    forged = signing.KeyPair(PublicKey(pair.public.keynum, forger.public.raw), forger.seed)
    text = signing.sign(DATA, forged, COMMENT)
    assert "does not match the data" in refused(DATA, text, [pair.public])


def test_a_signature_of_the_key_number_changed_to_a_trusted_one(pair, signed):
    other = signing.generate()
    raw = bytearray(base64.b64decode(signed[1]))
    raw[2:10] = other.public.keynum
    lines = [signed[0], base64.b64encode(bytes(raw)).decode(), *signed[2:]]
    assert "does not match the data" in refused(DATA, "\n".join(lines), [other.public])


def _with_algorithm(line: str, algorithm: bytes) -> str:
    raw = base64.b64decode(line)
    return base64.b64encode(algorithm + raw[2:]).decode()


def test_a_prehashed_signature_relabelled_legacy_is_refused(pair, signed):
    lines = [signed[0], _with_algorithm(signed[1], b"Ed"), *signed[2:]]
    assert "does not match the data" in refused(DATA, "\n".join(lines), [pair.public])


def _malformed(signed: list[str]) -> dict[str, object]:
    sig, glob = signed[1], signed[3]
    return {
        "empty": "",
        "only newlines": "\n\n\n\n",
        "one line": signed[0],
        "three lines": "\n".join(signed[:3]),
        "five lines": "\n".join([*signed, "extra"]),
        "huge": "\n".join(signed) + "\n" + "A" * (64 << 10),
        "huge trusted comment": "\n".join([*signed[:2], "trusted comment: " + "x" * 5000, glob]),
        "binary": "\x00\xff\xfe" * 40,
        "bytes, not text": "\n".join(signed).encode(),
        "none": None,
        "no untrusted prefix": "\n".join(["comment: x", *signed[1:]]),
        "no trusted prefix": "\n".join([signed[0], sig, "comment: x", glob]),
        "lines swapped": "\n".join([signed[0], glob, signed[2], sig]),
        "not base64": "\n".join([signed[0], "RU!!" + sig[4:], *signed[2:]]),
        "non-ascii base64": "\n".join([signed[0], "RUé" + sig[3:], *signed[2:]]),
        "short signature": "\n".join([signed[0], base64.b64encode(base64.b64decode(sig)[:-1]).decode(),
                                      *signed[2:]]),
        "long signature": "\n".join([signed[0], base64.b64encode(base64.b64decode(sig) + b"\0").decode(),
                                     *signed[2:]]),
        "short comment signature": "\n".join([*signed[:3], glob[:40]]),
        "wrong algorithm": "\n".join([signed[0], _with_algorithm(sig, b"RS"), *signed[2:]]),
        "zero algorithm": "\n".join([signed[0], _with_algorithm(sig, b"\0\0"), *signed[2:]]),
        "escape in the trusted comment": "\n".join([*signed[:2], "trusted comment: ok\x1b[2J", glob]),
        "carriage return in the comment": "\n".join([*signed[:2], "trusted comment: a\rb", glob]),
        "NUL in the comment": "\n".join([*signed[:2], "trusted comment: a\0b", glob]),
        "C1 control in the comment": "\n".join([*signed[:2], "trusted comment: a\x9bb", glob]),
        "lone surrogate in the comment": "\n".join([*signed[:2], "trusted comment: a\ud800", glob]),
        "spaces inside base64": "\n".join([signed[0], sig[:10] + " " + sig[10:], *signed[2:]]),
    }


def test_every_malformed_signature_is_one_line(pair, signed):
    for name, text in _malformed(signed).items():
        with pytest.raises(SignatureError) as exc:
            signing.verify(DATA, text, [pair.public])
        assert exc.value.message and "\n" not in exc.value.message, name


def test_a_signature_with_crlf_lines_still_verifies(pair, signed):
    """minisign trims a carriage return before the newline (`trim`): such a file is the same."""
    assert signing.verify(DATA, "\r\n".join(signed) + "\r\n", [pair.public]).key_id == pair.key_id


@pytest.mark.parametrize("text", [
    "", "RW", "RWQ" + "A" * 53,  # the right length, but its key is all zeros: small order
    "RW" + "A" * 53 + "=", "\x00" * 56, "é" * 56,
    "untrusted comment: a\nuntrusted comment: b\nRW" + "A" * 54,
    base64.b64encode(b"RS" + bytes(40)).decode(),  # another algorithm, right length
    base64.b64encode(b"Ed" + bytes(41)).decode(),  # one byte too many
    "A" * 100_000,
])
def test_a_malformed_public_key_is_one_line(text):
    with pytest.raises(SignatureError) as exc:
        PublicKey.parse(text)
    assert "\n" not in exc.value.message


def test_write_refuses_a_symbolic_link_at_the_secret_key_and_writes_nothing(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "rocforge.key").symlink_to(target)
    with pytest.raises(ConfigError, match="already exists"):
        signing.write_key_pair(tmp_path / "keys" / "rocforge.key", tmp_path / "keys" / "rocforge.pub",
                               signing.generate())
    assert not target.exists()
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["rocforge.key"]


def test_write_refuses_an_existing_public_key_and_writes_no_secret_key(tmp_path):
    (tmp_path / "rocforge.pub").write_text("someone's key\n")
    with pytest.raises(ConfigError, match="already exists"):
        signing.write_key_pair(tmp_path / "rocforge.key", tmp_path / "rocforge.pub",
                               signing.generate())
    assert (tmp_path / "rocforge.pub").read_text() == "someone's key\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rocforge.pub"]


def test_a_key_appearing_while_the_pair_is_written_is_never_replaced(tmp_path, monkeypatch):
    """The public key's path taken between the check and the write: the pair is not written,
    the secret key already put in place is taken back, and the other file is untouched."""
    real_link = os.link

    def link(src, dst, **kw):
        if str(dst).endswith(".pub"):
            (tmp_path / "rocforge.pub").write_text("raced\n")
        return real_link(src, dst, **kw)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(ConfigError, match="already exists"):
        signing.write_key_pair(tmp_path / "rocforge.key", tmp_path / "rocforge.pub",
                               signing.generate())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rocforge.pub"]
    assert (tmp_path / "rocforge.pub").read_text() == "raced\n"


def _secret_file(tmp_path, pair, mode=0o600):
    path = tmp_path / "rocforge.key"
    path.write_text(pair.secret_text())
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620])
def test_a_secret_key_open_to_others_is_refused(tmp_path, pair, mode):
    path = _secret_file(tmp_path, pair, mode)
    with pytest.raises(ConfigError) as exc:
        signing.read_secret_key(path)
    assert f"{mode:04o}" in exc.value.message and "chmod 600" in exc.value.hint


def test_a_secret_key_through_a_symbolic_link_is_refused(tmp_path, pair):
    path = _secret_file(tmp_path, pair)
    (tmp_path / "link.key").symlink_to(path)
    with pytest.raises(ConfigError, match="symbolic link"):
        signing.read_secret_key(tmp_path / "link.key")


def test_a_fifo_or_a_directory_at_the_secret_key_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(outcome, fifo), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading a FIFO secret key waited for a writer"
    assert isinstance(outcome[0], ConfigError) and "not a regular file" in outcome[0].message
    (tmp_path / "dir.key").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        signing.read_secret_key(tmp_path / "dir.key")


def _catch(outcome: list, path) -> None:
    try:
        signing.read_secret_key(path)
    except BaseException as exc:  # noqa: BLE001 - the test looks at whatever it was
        outcome.append(exc)


def test_a_missing_secret_key_says_how_to_make_one(tmp_path):
    with pytest.raises(ConfigError) as exc:
        signing.read_secret_key(tmp_path / "none.key")
    assert "rocforge key generate" in exc.value.hint


def _secret_body(pair) -> bytearray:
    return bytearray(base64.b64decode(pair.secret_text().splitlines()[1]))


def _write_body(tmp_path, body: bytes | str) -> object:
    path = tmp_path / "bad.key"
    text = body if isinstance(body, str) else base64.b64encode(bytes(body)).decode()
    path.write_text("untrusted comment: x\n" + text + "\n")
    path.chmod(0o600)
    return path


def test_an_encrypted_secret_key_is_refused_saying_how_to_make_an_unencrypted_one(tmp_path, pair):
    body = _secret_body(pair)
    body[2:4] = b"Sc"  # minisign's scrypt key derivation: the key is encrypted with a password
    with pytest.raises(ConfigError) as exc:
        signing.read_secret_key(_write_body(tmp_path, body))
    assert "encrypted" in exc.value.message
    assert "rocforge key generate" in exc.value.hint and "minisign -G -W" in exc.value.hint


def test_a_damaged_secret_key_is_refused(tmp_path, pair):
    cases = {}
    body = _secret_body(pair)
    body[-1] ^= 1
    cases["checksum"] = body
    body = _secret_body(pair)
    body[-40] ^= 1  # the public half
    cases["public half"] = body
    body = _secret_body(pair)
    body[60] ^= 1  # the seed: the checksum no longer matches
    cases["seed"] = body
    body = _secret_body(pair)
    body[0:2] = b"RS"
    cases["algorithm"] = body
    body = _secret_body(pair)
    body[2:4] = b"Xx"
    cases["key derivation"] = body
    cases["short"] = _secret_body(pair)[:-1]
    cases["not base64"] = "RW!!"
    for name, damaged in cases.items():
        with pytest.raises(ConfigError) as exc:
            signing.read_secret_key(_write_body(tmp_path, damaged))
        assert "\n" not in exc.value.message, name


def test_a_huge_or_binary_secret_key_file_is_refused(tmp_path):
    path = tmp_path / "huge.key"
    path.write_bytes(b"untrusted comment: x\n" + b"A" * (1 << 20))
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="bytes"):
        signing.read_secret_key(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not a minisign secret key"):
        signing.read_secret_key(path)



@pytest.mark.parametrize("point", [
    bytes(32),  # y = 0: order 4
    bytes([1]) + bytes(31),  # the identity
    bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),  # order 8
    bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),  # order 8
    bytes([0xEC]) + b"\xff" * 30 + b"\x7f",  # y = p - 1: order 2
    bytes([0xED]) + b"\xff" * 30 + b"\x7f",  # y = p, a non-canonical 0
    bytes([0x01]) + bytes(30) + b"\x80",  # x = 0 with the sign bit set: no point
])
def test_a_small_order_or_invalid_public_key_is_refused(point):
    """Under the all-zero key, the all-zero signature holds for a message (OpenSSL does not
    check the key's order; libsodium, and so minisign, does): such a key is never trusted.
    The small-order encodings are libsodium's list (ed25519_ref10.c, `ge25519_has_small_order`)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if point == bytes(32):  # the forgery this refusal prevents, shown on OpenSSL itself
        Ed25519PublicKey.from_public_bytes(point).verify(bytes(64), b"x")
    text = base64.b64encode(b"Ed" + bytes(8) + point).decode()
    with pytest.raises(SignatureError, match="small-order or invalid"):
        PublicKey.parse(text)
    with pytest.raises(SignatureError):
        PublicKey(bytes(8), point)


# libsodium's list of the small-order encodings (ed25519_ref10.c, `ge25519_has_small_order`:
# compared with the sign bit masked, so each also with the bit set): 0 (order 4), 1 (the
# identity), the two of order 8, p - 1 (order 2), and p and p + 1, non-canonical 0 and 1
_FF = b"\xff" * 30
LIBSODIUM_SMALL_ORDER = [
    bytes(32), bytes([1]) + bytes(31),
    bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
    b"\xec" + _FF + b"\x7f", b"\xed" + _FF + b"\x7f", b"\xee" + _FF + b"\x7f"]
EVERY_BAD_POINT = [*LIBSODIUM_SMALL_ORDER, *(p[:31] + bytes([p[31] | 0x80]) for p in LIBSODIUM_SMALL_ORDER),
                   b"\xf0" + _FF + b"\x7f",  # y = p + 3: another non-canonical encoding
                   bytes([2]) + bytes(31)]  # y = 2: no point of the curve


def _key_line(point: bytes) -> str:
    return base64.b64encode(b"Ed" + bytes(8) + point).decode()


@pytest.mark.parametrize("point", EVERY_BAD_POINT, ids=lambda p: p.hex()[:6] + ("-" if p[31] & 0x80 else "+"))
def test_every_small_order_and_non_canonical_encoding_is_refused(point):
    """All 14 of libsodium's small-order encodings (the 8 points and their non-canonical forms)
    are refused wherever a key is read: PublicKey, and the config's own rule."""
    from rocforge_build.config_values import problem

    with pytest.raises(SignatureError, match="small-order or invalid"):
        PublicKey.parse(_key_line(point))
    wrong = problem("substitute.trusted_keys", [_key_line(point)])
    assert wrong and "no usable Ed25519 key" in wrong and "\n" not in wrong


def test_a_real_key_passes_the_config_rule(pair):
    from rocforge_build.config_values import problem

    assert problem("substitute.trusted_keys", [pair.public.text]) is None


@pytest.mark.parametrize(("point", "named"), [
    (bytes(32), "small-order point"),  # the all-zero key: the all-zero signature verifies under it
    (bytes([1]) + bytes(31), "small-order point"),  # the identity
    (b"\xed" + _FF + b"\x7f", "non-canonical encoding"),
])
def test_config_set_refuses_a_small_order_trusted_key_in_one_line(tmp_path, monkeypatch, capsys, point, named):
    """`config set` took the all-zero and identity keys (its rule was a regex); now the point is
    judged when it is set, one line naming the problem, and the file is not written."""
    from rocforge_build import cli

    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(tmp_path / "config"))
    code = cli.main(["config", "set", "substitute.trusted_keys", f'["{_key_line(point)}"]'])
    err = capsys.readouterr().err
    assert code == 2, err
    first = err.splitlines()[0]
    assert first.startswith("rocforge: error: substitute.trusted_keys [0]") and named in first, err
    assert len([line for line in err.splitlines() if line.startswith("rocforge: error:")]) == 1
    assert not (tmp_path / "config" / "config.toml").exists()


def test_a_hand_written_zero_key_is_refused_at_every_read(tmp_path, monkeypatch, capsys):
    """A config file edited by hand to trust the all-zero key stops the commands that read it."""
    from rocforge_build import cli

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text(
        f'[substitute]\ntrusted_keys = ["{_key_line(bytes(32))}"]\n')
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(tmp_path / "config"))
    assert cli.main(["config", "get", "substitute.trusted_keys"]) == 2
    err = capsys.readouterr().err
    assert "small-order point" in err.splitlines()[0] and "Traceback" not in err
