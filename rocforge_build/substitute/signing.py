"""Signatures of substitutes and their evidence in minisign's formats (github.com/jedisct1/
minisign: src/minisign.h and src/minisign.c), made and checked with PyCA cryptography's Ed25519.

Why minisign's format through cryptography, not sigstore's offline bundle: a minisign public key
is one short line that fits `substitute.trusted_keys`, checking needs no certificate authority or
transparency log (a store may be a directory on an offline machine), and the `minisign` program
verifies rocforge's signatures (and rocforge reads its unencrypted keys) as they are.

The formats (little-endian, as minisign's structs are laid out):
- public key: base64(b"Ed" + key number (8 bytes) + Ed25519 public key (32));
- secret key: base64(b"Ed" + KDF (b"\\0\\0": none, b"Sc": scrypt, a password) + b"B2" + salt (32) +
  opslimit (8) + memlimit (8) + key number (8) + seed and public key (64) + checksum (32:
  BLAKE2b-256 of b"Ed" + key number + the 64 bytes; `minisign -W` leaves it zero));
- signature: "untrusted comment: ...", base64(b"ED" + key number + Ed25519 signature of the
  BLAKE2b-512 of the data; b"Ed": of the data itself, minisign's legacy form), "trusted comment:
  TEXT", base64(Ed25519 signature of the first signature's 64 bytes + TEXT's UTF-8 bytes).
A key's id is its key number read as a little-endian integer in 16 uppercase hex digits, as
minisign prints it."""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rocforge_build.ed25519_point import point_problem
from rocforge_build.errors import ConfigError, IntegrityError

UNTRUSTED_PREFIX = "untrusted comment: "
TRUSTED_PREFIX = "trusted comment: "
MAX_SIGNATURE_TEXT = 8 << 10  # a signature file is four short lines
MAX_COMMENT = 1024  # characters of either comment (minisign's COMMENTMAXBYTES)
MAX_KEY_TEXT = 4 << 10  # a key file is two short lines
MAX_TRUSTED_KEYS = 256

_ALG = b"Ed"  # the Ed25519 algorithm of keys, and of legacy (not prehashed) signatures
_ALG_PREHASHED = b"ED"
_KDF_NONE = b"\0\0"
_KDF_SCRYPT = b"Sc"
_CHECKSUM_ALG = b"B2"
_KEYNUM = 8
_PUBLIC_LEN = 2 + _KEYNUM + 32
_SIGNATURE_LEN = 2 + _KEYNUM + 64
_SECRET_LEN = 2 + 2 + 2 + 32 + 8 + 8 + _KEYNUM + 64 + 32
_CHECKSUM_AT = _SECRET_LEN - 32
_KEYNUM_AT = _CHECKSUM_AT - 64 - _KEYNUM


class SignatureError(IntegrityError):
    """A signature or key rocforge refuses: malformed, made by a key that is not trusted, or
    one that does not match what it signs; one line saying which."""


@dataclass(frozen=True, eq=False)
class PublicKey:
    """A minisign public key: its key number (the id signatures name) and its Ed25519 key.  Two
    are equal when both are, whatever else a TrustedKey carries."""

    keynum: bytes
    raw: bytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PublicKey):
            return NotImplemented
        return (self.keynum, self.raw) == (other.keynum, other.raw)

    def __hash__(self) -> int:
        return hash((self.keynum, self.raw))

    def __post_init__(self):
        if not (isinstance(self.keynum, bytes) and len(self.keynum) == _KEYNUM
                and isinstance(self.raw, bytes) and len(self.raw) == 32):
            raise SignatureError("a public key is an 8-byte key number and a 32-byte Ed25519 key")
        wrong = point_problem(self.raw)
        if wrong:
            raise SignatureError(f"a public key that is no usable Ed25519 key (a small-order or "
                                 f"invalid point): {wrong}")

    @property
    def key_id(self) -> str:
        return key_id_of(self.keynum)

    @property
    def text(self) -> str:
        """The base64 line (RW...) that `substitute.trusted_keys` and `minisign -P` take."""
        return base64.b64encode(_ALG + self.keynum + self.raw).decode("ascii")

    def file_text(self, comment: str | None = None) -> str:
        return f"{UNTRUSTED_PREFIX}{comment or 'minisign public key ' + self.key_id}\n{self.text}\n"

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """A public key from its base64 line or from a .pub file's text (a comment line, then the
        base64 line); one line saying what is wrong with anything else."""
        if not isinstance(text, str) or len(text) > MAX_KEY_TEXT:
            raise SignatureError("a public key must be a short text (RW...)")
        lines = text.strip().splitlines()
        if len(lines) == 2 and lines[0].startswith(UNTRUSTED_PREFIX.rstrip()):
            lines = lines[1:]
        if len(lines) != 1:
            raise SignatureError("a public key is one base64 line (RW...), or a .pub file's two lines")
        raw = _b64(lines[0].strip(), _PUBLIC_LEN, "public key")
        if raw[:2] != _ALG:
            raise SignatureError(f"a public key of algorithm {raw[:2]!r}, not Ed25519 ({_ALG!r})")
        return cls(raw[2:2 + _KEYNUM], raw[2 + _KEYNUM:])


@dataclass(frozen=True)
class KeyPair:
    """A secret key (its Ed25519 seed) with its public key; the seed never shows in a repr."""

    public: PublicKey
    seed: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def secret_text(self) -> str:
        """The secret key file's text, unencrypted (as `minisign -G -W` writes one) with its
        checksum filled in."""
        secret64 = self.seed + self.public.raw
        body = (_ALG + _KDF_NONE + _CHECKSUM_ALG + bytes(32 + 8 + 8) + self.public.keynum
                + secret64 + _checksum(self.public.keynum, secret64))
        return (f"{UNTRUSTED_PREFIX}rocforge secret key {self.key_id} (unencrypted)\n"
                f"{base64.b64encode(body).decode('ascii')}\n")


@dataclass(frozen=True)
class Revocation:
    """A key's own signed statement that it is no longer to be trusted (substitute/keys.py reads
    it from a store): `compromised`, nothing it ever signed is trusted; `retired`, only what it
    signed (as the signature's own time claims) before `revoked_at`."""

    key_id: str
    reason: str  # "compromised" | "retired"
    revoked_at: int  # seconds since the epoch
    digest: str  # the revocation document's sha256
    where: str  # the store it was read from
    key_text: str = ""  # the whole public key it revokes: two keys may share a key number

    def words(self) -> str:
        from rocforge_build.trusted_entry import format_time

        return (f"revocation {self.digest[:19]} ({self.reason}, {format_time(self.revoked_at)}) "
                f"read from {self.where}")


@dataclass(frozen=True, eq=False)
class TrustedKey(PublicKey):
    """A key of `substitute.trusted_keys` with what bounds its trust: its window (seconds since
    the epoch, None: open), the keys it was trusted through (`via`, nearest first) and the
    revocation that ends it (its own, or a compromised key's it came through)."""

    not_before: int | None = None
    not_after: int | None = None
    via: tuple[str, ...] = ()
    revoked: Revocation | None = None


# how far in the future a signature's claimed time may lie (two machines' clocks disagree)
CLOCK_SKEW = 300


def trust_problem(key: PublicKey | None, claimed: int | None, now: float | None = None) -> str | None:
    """Why a signature that holds under `key` is still not trusted, in one phrase, or None.

    The key's window must cover NOW (a key past its not-after trusts nothing any more, whatever its
    signatures claim) and, when the signed artifact claims a signing time (`made_at`, an image's
    `created`), that time too: a claim is the signer's word, forgeable by whoever holds the key,
    so it can only narrow trust, never widen it.  A compromised key trusts nothing; a retired one
    only what claims a time before its revocation (OpenPGP's rule for a "retired" or "superseded"
    revocation, RFC 4880 5.2.3.23)."""
    if not isinstance(key, TrustedKey):
        return None
    from rocforge_build.trusted_entry import format_time

    now = time.time() if now is None else now
    if claimed is not None and claimed > now + CLOCK_SKEW:
        return (f"the key {key.key_id}'s signature claims the time {format_time(claimed)}, in the "
                "future")
    revoked = key.revoked
    if revoked is not None:
        itself = revoked.key_text == key.text if revoked.key_text else revoked.key_id == key.key_id
        whose = (f"the key {key.key_id} is" if itself else
                 f"the key {key.key_id} came through the key {revoked.key_id}, which is")
        if revoked.reason == "compromised":  # (only a compromised predecessor ends a successor)
            return f"{whose} revoked as compromised by its {revoked.words()}: nothing it signed is trusted"
        if claimed is None:
            return f"{whose} revoked by its {revoked.words()}, and the signature claims no time before it"
        if claimed >= revoked.revoked_at:
            return f"{whose} revoked by its {revoked.words()}, and signed at {format_time(claimed)}, not before it"
    for when, what in ((now, "now"), (claimed, "the signing time it claims")):
        if when is None:
            continue
        if (key.not_before is not None and when < key.not_before) or (
                key.not_after is not None and when >= key.not_after):
            shown = "now" if what == "now" else f"{what}, {format_time(when)},"
            return (f"the key {key.key_id} is trusted {_window_words(key)} (substitute.trusted_keys"
                    f"{', through ' + ' and '.join(key.via) if key.via else ''}), and {shown} is outside it")
    return None


def _window_words(key: TrustedKey) -> str:
    from rocforge_build.trusted_entry import format_time

    if key.not_before is not None and key.not_after is not None and key.not_before >= key.not_after:
        return "at no time (its window and the one it came through do not meet)"
    since = f"from {format_time(key.not_before)}" if key.not_before is not None else ""
    until = f"until {format_time(key.not_after)}" if key.not_after is not None else ""
    return " ".join(x for x in (since, until) if x) or "always"


def claimed_time(text: object) -> int | None:
    """A signed document's `made_at` (or an image's `created`) as rocforge writes it
    (YYYY-MM-DDTHH:MM:SSZ), or None for anything else: no claim, which narrows nothing."""
    from rocforge_build.trusted_entry import parse_time

    if not isinstance(text, str) or len(text) != 20:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Verified:
    """A signature that holds: the trusted key that made it and its trusted comment."""

    key_id: str
    trusted_comment: str
    key: PublicKey | None = None  # the trusted key it holds under (its window and revocation)


def key_id_of(keynum: bytes) -> str:
    """The key id as 16 hex digits (minisign prints the same number without its leading zeros):
    the form registries' signer annotations carry and compare."""
    return f"{int.from_bytes(keynum, 'little'):016X}"


def _checksum(keynum: bytes, secret64: bytes) -> bytes:
    return hashlib.blake2b(_ALG + keynum + secret64, digest_size=32).digest()


def _b64(text: str, length: int, what: str) -> bytes:
    """Strict base64 of exactly `length` bytes, else one line naming `what`."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise SignatureError(f"the {what} is not base64") from None
    if len(raw) != length:
        raise SignatureError(f"the {what} is {len(raw)} bytes, not {length}")
    return raw


def _printable_problem(comment: str) -> str | None:
    """What makes a comment unsafe to sign or show, by minisign's rule (`is_printable`): any
    control character but tab (C0, DEL, C1), or a lone surrogate that is no UTF-8 at all."""
    if len(comment) > MAX_COMMENT:
        return f"is {len(comment)} characters, more than {MAX_COMMENT}"
    for ch in comment:
        o = ord(ch)
        if (o < 0x20 and ch != "\t") or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF:
            return f"holds the control character {ch!r}"
    return None


def generate() -> KeyPair:
    """A new key pair with a random key number."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes_raw()
    return KeyPair(PublicKey(secrets.token_bytes(_KEYNUM), public), private.private_bytes_raw())


def sign(data: bytes, pair: KeyPair, trusted_comment: str) -> str:
    """A prehashed minisign signature of `data` whose trusted comment is `trusted_comment`."""
    problem = _printable_problem(trusted_comment)
    if problem:
        raise SignatureError(f"a trusted comment {problem}")
    private = Ed25519PrivateKey.from_private_bytes(pair.seed)
    signature = private.sign(hashlib.blake2b(data, digest_size=64).digest())
    global_signature = private.sign(signature + trusted_comment.encode("utf-8"))
    line = base64.b64encode(_ALG_PREHASHED + pair.public.keynum + signature).decode("ascii")
    return (f"{UNTRUSTED_PREFIX}signature from rocforge key {pair.key_id}\n{line}\n"
            f"{TRUSTED_PREFIX}{trusted_comment}\n"
            f"{base64.b64encode(global_signature).decode('ascii')}\n")


def verify(data: bytes, signature_text: str, trusted: Sequence[PublicKey]) -> Verified:
    """The key and trusted comment of a signature of `data` by one of the `trusted` keys whose
    signature and comment signature both hold; SignatureError with one line for anything else."""
    if not isinstance(signature_text, str) or len(signature_text) > MAX_SIGNATURE_TEXT:
        raise SignatureError(f"a signature must be a text of at most {MAX_SIGNATURE_TEXT} bytes")
    if len(signature_text.encode("utf-8", "surrogatepass")) > MAX_SIGNATURE_TEXT:
        raise SignatureError(f"a signature must be a text of at most {MAX_SIGNATURE_TEXT} bytes")
    lines = [line.removesuffix("\r") for line in signature_text.split("\n")]
    if len(lines) == 5 and lines[4] == "":
        lines = lines[:4]
    if len(lines) != 4:
        raise SignatureError("a signature is four lines (minisign's format)")
    untrusted, sig_line, trusted_line, global_line = lines
    if not untrusted.startswith(UNTRUSTED_PREFIX) or len(untrusted) > MAX_COMMENT:
        raise SignatureError(f"a signature's first line must be {UNTRUSTED_PREFIX!r}... "
                             f"(at most {MAX_COMMENT} characters)")
    if not trusted_line.startswith(TRUSTED_PREFIX):
        raise SignatureError(f"a signature's third line must start with {TRUSTED_PREFIX!r}")
    comment = trusted_line[len(TRUSTED_PREFIX):]
    problem = _printable_problem(comment)
    if problem:
        raise SignatureError(f"a signature's trusted comment {problem}")
    raw = _b64(sig_line, _SIGNATURE_LEN, "signature")
    global_signature = _b64(global_line, 64, "comment signature")
    algorithm, keynum, signature = raw[:2], raw[2:2 + _KEYNUM], raw[2 + _KEYNUM:]
    if algorithm not in (_ALG_PREHASHED, _ALG):
        raise SignatureError(f"a signature of algorithm {algorithm!r}, not Ed25519 ({_ALG_PREHASHED!r})")
    key_id = key_id_of(keynum)
    keys = [k for k in trusted if k.keynum == keynum]
    if not keys:
        raise SignatureError(f"signed by the key {key_id}, which is not trusted")
    signed = hashlib.blake2b(data, digest_size=64).digest() if algorithm == _ALG_PREHASHED else data
    for key in keys:  # two trusted keys may share a key number; either may have signed
        public = Ed25519PublicKey.from_public_bytes(key.raw)
        try:
            public.verify(signature, signed)
        except InvalidSignature:
            continue
        try:
            public.verify(global_signature, signature + comment.encode("utf-8"))
        except InvalidSignature:
            raise SignatureError(f"the trusted comment's signature (key {key_id}) does not "
                                 "match: the comment was altered") from None
        return Verified(key_id, comment, key)
    raise SignatureError(f"the signature by the key {key_id} does not match the data")


def trusted_keys_from_config(values: list[str]) -> list[TrustedKey]:
    """The keys of `substitute.trusted_keys`, each once, each with its window (the window of an
    entry trusted `via` another is cut to that key's, along the whole chain: a rotation never
    grants more than the key it came from had); a ConfigError naming the entry that is wrong."""
    from rocforge_build.trusted_entry import key_id_of_text, parse_all

    if not isinstance(values, (list, tuple)):
        raise ConfigError("substitute.trusted_keys must be a list of public keys",
                          "set it with `rocforge config set substitute.trusted_keys '[\"RW...\"]'`")
    if len(values) > MAX_TRUSTED_KEYS:
        raise ConfigError(f"substitute.trusted_keys holds {len(values)} keys, more than "
                          f"{MAX_TRUSTED_KEYS}")
    try:
        entries = parse_all(list(values))
    except ValueError as exc:
        raise ConfigError(f"substitute.trusted_keys{exc}",
                          "give a public key as `rocforge key generate` or `minisign -G` printed it "
                          "(RW...), optionally followed by not-before=, not-after=, via= "
                          "(docs/guides/substitutes.md)") from None
    by_id = {key_id_of_text(e.key_text): e for e in entries}
    keys: list[TrustedKey] = []
    for entry in entries:
        base = PublicKey.parse(entry.key_text)
        not_before, not_after, chain = entry.not_before, entry.not_after, []
        step = entry
        while step.via is not None:  # parse_all refused loops and dangling names
            chain.append(step.via)
            step = by_id[step.via]
            not_before = _later(not_before, step.not_before)
            not_after = _earlier(not_after, step.not_after)
        if not_before is not None and not_after is not None and not_before >= not_after:
            not_after = not_before  # an empty window: trusted at no time
        key = TrustedKey(base.keynum, base.raw, not_before=not_before, not_after=not_after,
                         via=tuple(chain))
        if key not in keys:
            keys.append(key)
    return keys


def _later(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _earlier(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def parse_secret_key(text: str, where: str) -> KeyPair:
    """A key pair from a secret key file's text (unencrypted); one line naming `where` for a
    malformed, encrypted or inconsistent key."""
    lines = text.strip().splitlines()
    if len(lines) != 2 or not lines[0].startswith(UNTRUSTED_PREFIX.rstrip()):
        raise ConfigError(f"{where} is not a minisign secret key (a comment line, then base64)")
    try:
        raw = _b64(lines[1].strip(), _SECRET_LEN, "secret key")
    except SignatureError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    if raw[:2] != _ALG or raw[4:6] != _CHECKSUM_ALG:
        raise ConfigError(f"{where}: not an Ed25519 secret key with a BLAKE2b checksum")
    if raw[2:4] == _KDF_SCRYPT:
        raise ConfigError(f"{where} is encrypted with a password; rocforge signs unattended "
                          "with an unencrypted key",
                          "make one with `rocforge key generate` or `minisign -G -W`")
    if raw[2:4] != _KDF_NONE:
        raise ConfigError(f"{where}: unknown key derivation {raw[2:4]!r}")
    keynum = raw[_KEYNUM_AT:_KEYNUM_AT + _KEYNUM]
    secret64 = raw[_KEYNUM_AT + _KEYNUM:_CHECKSUM_AT]
    checksum = raw[_CHECKSUM_AT:]
    if checksum != bytes(32) and checksum != _checksum(keynum, secret64):
        raise ConfigError(f"{where}: the secret key's checksum does not match (altered or damaged)")
    seed, public = secret64[:32], secret64[32:]
    if Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw() != public:
        raise ConfigError(f"{where}: the secret key's public half does not match its seed")
    return KeyPair(PublicKey(keynum, public), seed)


def read_secret_key(path: Path) -> KeyPair:
    """The key pair of a secret key file that is a regular file of the user's, readable by no
    one else (ssh's rule for private keys), never through a symbolic link."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConfigError(f"no secret key at {path}",
                          "make one with `rocforge key generate`, or name yours with "
                          "substitute.signing_key") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link; a secret key is read only from a "
                              "regular file", "name the file itself") from None
        raise ConfigError(f"cannot read the secret key {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file; it cannot be a secret key")
        if st.st_uid not in (os.geteuid(), 0):
            raise ConfigError(f"{path} belongs to another user (uid {st.st_uid}); a secret key "
                              "must be your own")
        if st.st_mode & 0o077:
            raise ConfigError(f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):04o}); "
                              "a secret key must be readable by its owner alone",
                              f"chmod 600 {path}")
        if st.st_size > MAX_KEY_TEXT:
            raise ConfigError(f"{path} is {st.st_size} bytes; a secret key is two short lines")
        data = os.read(fd, MAX_KEY_TEXT + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the secret key {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a minisign secret key (not text)") from None
    return parse_secret_key(text, str(path))


def _write_new(path: Path, text: str, mode: int) -> Path:
    """`text` in a new temporary file beside `path` (created exclusively, never through a link)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; 0600 stays 0600
        view = memoryview(text.encode("ascii"))
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return temp


def write_key_pair(secret_path: Path, public_path: Path, pair: KeyPair) -> None:
    """The secret key (mode 0600) and public key files, each put in place whole by a hard link
    that fails if anything (a file, a symbolic link) is already there: no key is overwritten
    and nothing is written when either path is taken."""
    secret_path, public_path = Path(secret_path), Path(public_path)
    for path in (secret_path, public_path):
        if os.path.lexists(path):
            raise ConfigError(f"{path} already exists; rocforge never overwrites a key",
                              "move it away first, or write the new pair elsewhere (--out DIR)")
    for folder in dict.fromkeys((secret_path.parent, public_path.parent)):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot make the directory {folder} for the key pair: "
                              f"{exc.strerror or exc}") from None
    temps: list[Path] = []
    placed: list[Path] = []
    try:
        temps.append(_write_new(secret_path, pair.secret_text(), 0o600))
        temps.append(_write_new(public_path, pair.public.file_text(), 0o644))
        for temp, path in zip(temps, (secret_path, public_path), strict=True):
            os.link(temp, path, follow_symlinks=False)
            placed.append(path)
    except OSError as exc:
        for path in placed:  # the pair is written whole or not at all
            path.unlink(missing_ok=True)
        where = exc.filename if exc.filename else secret_path
        if exc.errno == errno.EEXIST:
            raise ConfigError(f"{exc.filename2 or where} already exists; rocforge never "
                              "overwrites a key", "move it away first, or write the new pair "
                              "elsewhere (--out DIR)") from None
        raise ConfigError(f"cannot write the key pair at {where}: {exc.strerror or exc}") from None
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
