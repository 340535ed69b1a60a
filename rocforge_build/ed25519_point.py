"""Whether 32 bytes are an Ed25519 public key a signature can be trusted under, and whether a
minisign public key line is one: pure Python (no PyCA cryptography), so `rocforge config set
substitute.trusted_keys` and every read of the config judge a key as signing.py does, at the
cost of a few big-integer operations.

OpenSSL accepts a small-order key, under which one signature holds for many messages (the
all-zero key and the all-zero signature verify "x"); libsodium, and so minisign, refuses the 8
small-order points and their non-canonical encodings (ed25519_ref10.c `ge25519_has_small_order`
and `ge25519_is_canonical`).  Here a key must be RFC 8032 5.1.3's canonical encoding of a point
of the curve, and [8]P must not be the identity: that refuses every one of libsodium's list."""

from __future__ import annotations

import base64
import binascii

P = 2**255 - 19
D = -121665 * pow(121666, P - 2, P) % P
_SQRT_M1 = pow(2, (P - 1) // 4, P)
PUBLIC_KEY_BYTES = 2 + 8 + 32  # b"Ed", the key number, the Ed25519 key (minisign.h)
SMALL_ORDER = ("a small-order point (the identity or another of the 8 points of order 1, 2, 4 "
               "or 8, under which one signature holds for many messages)")


def point_problem(encoded: bytes) -> str | None:
    """What makes 32 bytes no usable Ed25519 public key, or None when they are one."""
    if not isinstance(encoded, bytes) or len(encoded) != 32:
        return "not 32 bytes"
    y = int.from_bytes(encoded, "little") & ((1 << 255) - 1)
    sign = encoded[31] >> 7
    if y >= P:
        return "a non-canonical encoding (its y is not below 2^255 - 19)"
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    if x2 == 0:
        if sign:
            return "a non-canonical encoding (x is 0 but the sign bit is set)"
        x = 0
    else:
        x = pow(x2, (P + 3) // 8, P)
        if (x * x - x2) % P:
            x = x * _SQRT_M1 % P
        if (x * x - x2) % P:
            return "not a point of the curve"
        if x & 1 != sign:
            x = P - x
    point = (x, y, 1, x * y % P)
    for _ in range(3):
        point = _double(point)
    if point[0] % P == 0 and (point[1] - point[2]) % P == 0:
        return SMALL_ORDER
    return None


def _double(point: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """P + P in extended coordinates (RFC 8032 5.1.4's addition)."""
    x, y, z, t = point
    a = (y - x) * (y - x) % P
    b = (y + x) * (y + x) % P
    c = 2 * t * t * D % P
    d = 2 * z * z % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % P, g * h % P, f * g % P, e * h % P


def public_key_problem(text: object) -> str | None:
    """What makes `text` no minisign public key line (RW...) rocforge trusts, or None."""
    if not isinstance(text, str) or len(text) > 4096:
        return "is not a minisign public key (RW... as `rocforge key generate` prints it)"
    try:
        raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return "is not a minisign public key: not base64 (RW... as `rocforge key generate` prints it)"
    if len(raw) != PUBLIC_KEY_BYTES:
        return (f"is not a minisign public key: {len(raw)} bytes, not {PUBLIC_KEY_BYTES} "
                "(RW... as `rocforge key generate` prints it)")
    if raw[:2] != b"Ed":
        return f"is a public key of algorithm {raw[:2]!r}, not Ed25519 (b'Ed')"
    wrong = point_problem(raw[10:])
    return f"is no usable Ed25519 key: {wrong}" if wrong else None
