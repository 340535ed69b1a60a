"""A reader for the plain TOML that rocforge's own data files are written in, so `rocforge env`
does not import tomllib (typing, string, datetime and its regular expressions) and run its
character-by-character parser at every uncached shell start-up (docs/measurements/env.md).

The subset: comments; `[table.sub]` headers of bare keys; `key = value` with a bare key; values
that are basic strings without escapes, literal strings, decimal integers, hexadecimal
integers, decimal floats without exponent, booleans, and arrays of these (nested, over several
lines, comments and a trailing comma inside).  `loads` raises `Unsupported` for any text outside
it, valid TOML or not (escapes, multi-line strings, dotted or quoted keys, inline tables,
arrays of tables, dates, exponents, underscores in numbers, inf/nan, CR line ends, a key or
table defined twice, control characters, arrays nested deeper than MAX_DEPTH): the caller then reads the text with tomllib, which
gives the value or words the error.  For text inside the subset the result equals tomllib's
(tests/test_toml_subset.py checks every data file and mutated copies of them against tomllib).
This module imports nothing.
"""

from __future__ import annotations

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_BLANK = " \t"  # TOML's whitespace
MAX_DEPTH = 32  # arrays in arrays: rocforge's data nests two deep, and this bound keeps the
# reader's recursion far below Python's limit whatever a file holds
TOO_DEEP = "values nested too deeply to read (arrays or tables inside one another)"


class Unsupported(ValueError):
    """The text is outside the subset (and may or may not be valid TOML): use tomllib."""


def loads(text: str) -> dict:
    """The TOML document `text` as tomllib.loads gives it, or `Unsupported`."""
    _check_characters(text)
    root: dict = {}
    table = root
    defined: set[tuple[str, ...]] = set()
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].strip(_BLANK)
        i += 1
        if not line or line[0] == "#":
            continue
        if line[0] == "[":
            table = _header(line, root, defined)
            continue
        eq = line.find("=")
        if eq < 0:
            raise Unsupported("not `key = value`")
        key = _key(line[:eq])
        if key in table:
            raise Unsupported(f"{key} defined twice")
        value, rest, i = _value(line[eq + 1:].lstrip(_BLANK), lines, i)
        _line_end(rest)
        table[key] = value
    return root


def tomllib_loads(text: str) -> dict | None:
    """tomllib.loads(text), None where `text` is not TOML: for the files discovery meets only
    sometimes (a build's manifest, rocforge-install.toml, the choice table), with tomllib
    imported when one is there rather than at every `rocforge env`."""
    import tomllib

    try:
        return tomllib_parse(text)
    except tomllib.TOMLDecodeError:
        return None


def tomllib_parse(text: str) -> dict:
    """tomllib.loads(text), where a document nested past Python's recursion limit (or too large
    to hold) raises the tomllib.TOMLDecodeError every reader already turns into its own
    one-line error for a syntax error, rather than a RecursionError no reader expects."""
    import tomllib

    try:
        return tomllib.loads(text)
    except (RecursionError, MemoryError):
        pass  # outside the handler: the deep stack is released before the error is raised
    error = tomllib.TOMLDecodeError.__new__(tomllib.TOMLDecodeError)
    ValueError.__init__(error, TOO_DEEP)  # its own __init__ wants a position (Python 3.14)
    raise error


def _check_characters(text: str) -> None:
    """Control characters (other than tab and LF) are invalid in TOML comments and strings, and
    a CR is left to tomllib."""
    rest = text.replace("\n", "").replace("\t", "")
    if not rest.isprintable() and any(ord(c) < 0x20 or c == "\x7f" for c in rest):
        raise Unsupported("control character")


def _key(text: str) -> str:
    key = text.strip(_BLANK)
    if not key or not _BARE.issuperset(key):
        raise Unsupported(f"not a bare key: {key!r}")
    return key


def _header(line: str, root: dict, defined: set[tuple[str, ...]]) -> dict:
    end = line.find("]")
    if line.startswith("[[") or end < 0:
        raise Unsupported("array of tables or unclosed header")
    _line_end(line[end + 1:])
    path = tuple(_key(part) for part in line[1:end].split("."))
    if path in defined:
        raise Unsupported(f"table {'.'.join(path)} defined twice")
    defined.add(path)
    table = root
    for part in path:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise Unsupported(f"{part} is not a table")
    return table


def _line_end(rest: str) -> None:
    rest = rest.lstrip(_BLANK)
    if rest and rest[0] != "#":
        raise Unsupported(f"text after the value: {rest[:20]!r}")


def _value(s: str, lines: list[str], i: int, depth: int = 0) -> tuple[object, str, int]:
    """(value, the rest of its line, index of the next line) for the value starting `s`."""
    if not s:
        raise Unsupported("no value")
    first = s[0]
    if first in "\"'":
        if s.startswith(first * 3):
            raise Unsupported("multi-line string")
        end = s.find(first, 1)
        body = s[1:end]
        if end < 0 or (first == '"' and "\\" in body):
            raise Unsupported("unclosed string or an escape")
        return body, s[end + 1:], i
    if first == "[":
        return _array(s[1:], lines, i, depth + 1)
    j = 0
    while j < len(s) and s[j] not in " \t,]#":
        j += 1
    return _scalar(s[:j]), s[j:], i


def _scalar(tok: str) -> object:
    if tok == "true":
        return True
    if tok == "false":
        return False
    if tok.startswith("0x"):
        if len(tok) > 2 and _HEX.issuperset(tok[2:]):
            return int(tok[2:], 16)
        raise Unsupported(f"not a hexadecimal integer: {tok!r}")
    body = tok[1:] if tok[:1] in ("+", "-") else tok
    whole, dot, frac = body.partition(".")
    if not whole or not _DIGITS.issuperset(whole) or (len(whole) > 1 and whole[0] == "0"):
        raise Unsupported(f"not a plain number: {tok!r}")
    if not dot:
        return int(tok)
    if not frac or not _DIGITS.issuperset(frac):
        raise Unsupported(f"not a plain float: {tok!r}")
    return float(tok)


def _array(s: str, lines: list[str], i: int, depth: int) -> tuple[list, str, int]:
    if depth > MAX_DEPTH:
        raise Unsupported(f"arrays nested more than {MAX_DEPTH} deep")
    out: list = []
    while True:
        s, i = _skip(s, lines, i)
        if s[0] == "]":
            return out, s[1:], i
        value, s, i = _value(s, lines, i, depth)
        out.append(value)
        s, i = _skip(s, lines, i)
        if s[0] == "]":
            return out, s[1:], i
        if s[0] != ",":
            raise Unsupported("array items not separated by ','")
        s = s[1:]


def _skip(s: str, lines: list[str], i: int) -> tuple[str, int]:
    """Past blanks, comments and line ends inside an array, to its next character."""
    s = s.lstrip(_BLANK)
    while not s or s[0] == "#":
        if i >= len(lines):
            raise Unsupported("unclosed array")
        s = lines[i].lstrip(_BLANK)
        i += 1
    return s, i
