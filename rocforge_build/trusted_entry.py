"""One entry of `substitute.trusted_keys`, read strictly, in pure Python (no cryptography, no
datetime: `rocforge config set` and every read of the config judge an entry as signing.py does).

An entry is a public key line, optionally followed by options, each `NAME=VALUE`, separated by
single spaces:

    RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3
    RWQf6LRC... not-before=2026-01-01 not-after=2027-01-01T00:00:00Z
    RWRnew...  not-before=2026-11-29T08:00:00Z via=8A6E2F0C1B3D4E5F

- `not-before`, `not-after`: the key's window, UTC, `YYYY-MM-DD` (its midnight) or
  `YYYY-MM-DDTHH:MM:SSZ`; a key is trusted at a time t when not-before <= t < not-after;
- `via`: the key id (16 hex digits) of the key this one was trusted through (`rocforge key
  trust-rotation` writes it): this key is never trusted past that key's window, nor once that key
  is revoked as compromised.  The key it names must be an entry of the same list, and no chain of
  `via` may loop.

A plain entry (the key alone) keeps its meaning: trusted at any time, until revoked."""

from __future__ import annotations

import re

from rocforge_build.ed25519_point import public_key_problem

OPTIONS = ("not-before", "not-after", "via")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2}):(\d{2})Z)?", re.ASCII)
_KEY_ID = re.compile(r"[0-9A-F]{16}")
MAX_ENTRY = 512


class Entry:
    """A parsed entry: the key line, its window (seconds since the epoch, None: open) and the key
    id it came through (None: trusted directly)."""

    __slots__ = ("key_text", "not_before", "not_after", "via")

    def __init__(self, key_text: str, not_before: int | None, not_after: int | None, via: str | None):
        self.key_text, self.not_before, self.not_after, self.via = key_text, not_before, not_after, via


def parse_time(text: str) -> int:
    """Seconds since the epoch of `YYYY-MM-DD` (midnight UTC) or `YYYY-MM-DDTHH:MM:SSZ`; ValueError
    with what is wrong for anything else (another zone, fractions, a 30th of February)."""
    m = _DATE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError("is not a UTC time YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ")
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    hour, minute, second = (int(m[4]), int(m[5]), int(m[6])) if m[4] else (0, 0, 0)
    if not 1970 <= year <= 9999 or not 1 <= month <= 12:
        raise ValueError("is not a date between 1970 and 9999")
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days_in = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
    if not 1 <= day <= days_in or hour > 23 or minute > 59 or second > 59:
        raise ValueError("is not a real date and time")
    return _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second


def format_time(seconds: int) -> str:
    """`YYYY-MM-DDTHH:MM:SSZ` of seconds since the epoch."""
    days, rest = divmod(int(seconds), 86400)
    y, m, d = _civil_from_days(days)
    return f"{y:04d}-{m:02d}-{d:02d}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}Z"


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 (H. Hinnant's days_from_civil)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


def key_id_of_text(key_text: str) -> str:
    """The key id (16 uppercase hex digits, minisign's little-endian key number) of a key line
    that public_key_problem accepted."""
    import base64

    raw = base64.b64decode(key_text.encode("ascii"), validate=True)
    return f"{int.from_bytes(raw[2:10], 'little'):016X}"


def parse(text: object) -> Entry:
    """An entry, or ValueError with one phrase saying what is wrong (it follows the entry's
    place in the list in the caller's message)."""
    if not isinstance(text, str):
        raise ValueError(f"is a {type(text).__name__}, not a text (a public key line RW...)")
    if len(text) > MAX_ENTRY:
        raise ValueError(f"is {len(text)} characters, more than {MAX_ENTRY}")
    parts = text.strip().split(" ")
    wrong = public_key_problem(parts[0])
    if wrong:
        raise ValueError(wrong)
    seen: dict[str, str] = {}
    for part in parts[1:]:
        name, eq, value = part.partition("=")
        if not eq or name not in OPTIONS:
            shown = part[:32] + ("..." if len(part) > 32 else "")
            raise ValueError(f"has {shown!r}: after the key come only {', '.join(o + '=...' for o in OPTIONS)}, "
                             "separated by single spaces")
        if name in seen:
            raise ValueError(f"gives {name} twice")
        seen[name] = value
    window = []
    for name in ("not-before", "not-after"):
        if name not in seen:
            window.append(None)
            continue
        try:
            window.append(parse_time(seen[name]))
        except ValueError as exc:
            raise ValueError(f"{name}={seen[name][:32]!r} {exc}") from None
    not_before, not_after = window
    if not_before is not None and not_after is not None and not_before >= not_after:
        raise ValueError("has not-before at or after not-after: a window no time is inside")
    via = seen.get("via")
    if via is not None and not _KEY_ID.fullmatch(via):
        raise ValueError(f"via={via[:32]!r} is not a key id (16 uppercase hex digits)")
    return Entry(parts[0], not_before, not_after, via)


def parse_all(values: list) -> list[Entry]:
    """Every entry of the list, and the rules between them: a `via` names another entry's key, and
    no chain of `via` loops; ValueError starting with the entry's place (`[2] ...`)."""
    entries: list[Entry] = []
    for index, value in enumerate(values):
        try:
            entries.append(parse(value))
        except ValueError as exc:
            shown = value[:24] + ("..." if len(value) > 24 else "") if isinstance(value, str) else ""
            raise ValueError(f"[{index}]{f' ({shown!r})' if shown else ''} {exc}") from None
    ids: dict[str, Entry] = {}
    shared: set[str] = set()
    texts: dict[str, int] = {}
    for index, entry in enumerate(entries):
        key_id = key_id_of_text(entry.key_text)
        if key_id in ids and ids[key_id].key_text != entry.key_text:
            shared.add(key_id)
        ids.setdefault(key_id, entry)
        first = texts.setdefault(entry.key_text, index)
        if first != index and values[first].strip() != values[index].strip():
            raise ValueError(f"[{index}] gives the key of [{first}] again with other options: "
                             "one entry per key")
    for index, entry in enumerate(entries):
        seen = {key_id_of_text(entry.key_text)}
        step = entry
        while step.via is not None:
            if step.via in seen:
                raise ValueError(f"[{index}] has a chain of via that loops (back to {step.via})")
            if step.via in shared:
                raise ValueError(f"[{index}] is trusted via the key id {step.via}, which two entries "
                                 "share: via must name one key")
            if step.via not in ids:
                raise ValueError(f"[{index}] is trusted via the key {step.via}, which is no entry of the list "
                                 "(keep the key it came through, or drop via= to trust it on its own)")
            seen.add(step.via)
            step = ids[step.via]
    return entries
