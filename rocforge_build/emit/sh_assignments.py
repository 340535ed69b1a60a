"""Where a shell file that root sources sets a variable, found without running it.

`find` reads the file's bytes with a small sh lexer (quotes, `$(...)`, backticks, comments,
backslash-newline) and answers with the one line that sets the name when that line is a plain
`NAME=WORD` at the file's top level, valid UTF-8, with nothing after it but a comment; any other
way of setting it (`export`, indentation, a continuation, a second assignment, an `if`, a
self-reference, a value the shell computes) is `Unclear`, so a caller edits only what it
understands and leaves the rest to the user (sh(1) POSIX, "Shell Command Language").
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

# Words that open or continue a compound command: a line after one may not run at top level.
_COMPOUND = frozenset(b"if then else elif fi case esac for while until do done select function { } ! [[".split())
_ASSIGN = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*=")
# A WORD sh expands to nothing but itself: single-quoted, double-quoted with no `$` or backtick,
# backslash-escaped and bare inert bytes, joined; never a backslash before a line break.
_WORD = rb"""(?:'[^'\n]*'|"(?:[^"$`\\\n]|\\[^\n])*"|\\[^\n]|[A-Za-z0-9@%+=:,./_-])*"""


@dataclass(frozen=True)
class Simple:
    line_no: int  # 1-based
    line: str  # the whole line, without its newline
    word: str  # the right-hand side as written
    suffix: str  # what follows the word: spaces and an optional comment


@dataclass(frozen=True)
class Unclear:
    why: str


@dataclass(frozen=True)
class Absent:
    appendable: bool  # a line added at the end would run at top level, on its own line


@dataclass
class _Scan:
    code: bytearray  # the file with comments blanked
    starts: set[int]  # 0-based lines that begin a command at top level, before any compound command
    problem: str | None = None


def _skip_quoted(data: bytes, i: int, close: int) -> int:
    """The index after the quote that closes the one before `data[i]`; -1 at end of file."""
    n = len(data)
    while i < n:
        c = data[i]
        if c == close:
            return i + 1
        if close == ord("'"):
            i += 1
        elif c == ord("`") and close != ord("`"):
            i = _skip_quoted(data, i + 1, ord("`"))
        else:
            i = _skip_unit(data, i)
        if i < 0:
            return -1
    return -1


def _skip_unit(data: bytes, i: int) -> int:
    """The index after what starts at `data[i]` outside single quotes: a backslash with the byte
    it escapes, a whole `$(...)` or `${...}`, or one byte; -1 at end of file."""
    if data[i] == ord("\\"):
        return i + 2
    if data[i] == ord("$") and data[i + 1:i + 2] in (b"(", b"{"):
        return _skip_nested(data, i + 2, data[i + 1])
    return i + 1


def _skip_nested(data: bytes, i: int, opener: int) -> int:
    """The index after the `)` or `}` that closes `$(` or `${`; -1 at end of file."""
    close, depth, n = (ord(")") if opener == ord("(") else ord("}")), 1, len(data)
    while i < n:
        c = data[i]
        if c in b"'\"`":
            i = _skip_quoted(data, i + 1, c)
            if i < 0:
                return -1
            continue
        if c == ord("\\"):
            i += 2
            continue
        if c == opener:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _word_end(data: bytes, i: int) -> int:
    """The index after the sh word starting at `data[i]`; -1 if a quote runs to end of file."""
    n = len(data)
    while i < n and data[i] not in b" \t\n;&|<>()":
        c = data[i]
        i = _skip_quoted(data, i + 1, c) if c in b"'\"`" else _skip_unit(data, i)
        if i < 0:
            return -1
    return min(i, n)


def scan(data: bytes) -> _Scan:
    """Comments blanked, and the lines a command starts at top level; `problem` where the lexer
    stops (a here-document, an unterminated quote): nothing after it is understood."""
    out = _Scan(bytearray(data), set())
    i, n, line, flat, cmd_pos, line_start, joined = 0, len(data), 0, True, True, True, False
    while i < n:
        if line_start:
            if flat and not joined:  # after `&&`, `||` or `|` a line runs only if the last did
                out.starts.add(line)
            line_start = False
        c = data[i]
        if c == ord("\n"):
            line, cmd_pos, line_start, i = line + 1, True, True, i + 1
        elif c in b" \t":
            i += 1
        elif c == ord("#"):
            end = data.find(b"\n", i)
            end = n if end < 0 else end
            out.code[i:end] = b" " * (end - i)
            i = end
        elif c in b";&|":
            joined = c == ord("|") or b"&&" in (data[i:i + 2], data[i - 1:i + 1])
            cmd_pos, i = True, i + 1
        elif data[i:i + 2] == b"<<":
            out.problem = f"a here-document on line {line + 1}"
            return out
        elif c in b"<>":
            i += 1
        elif c in b"()":
            flat, cmd_pos, i = False, True, i + 1
        else:
            j = _word_end(data, i)
            if j < 0:
                out.problem = f"a quote opened on line {line + 1} is never closed"
                return out
            word = data[i:j]
            if cmd_pos and word in _COMPOUND:
                flat = False
            elif cmd_pos and not _ASSIGN.match(word):
                cmd_pos = False
            line += word.count(b"\n")
            i, joined = j, False
    return out


def find(data: bytes, name: str) -> Simple | Unclear | Absent:
    """How the file `data` sets `name` (see the module's docstring)."""
    try:
        s = scan(data)
    except RecursionError:
        return Unclear("the file nests `$(`, `${` or quotes deeper than rocforge follows")
    mention = re.compile(rb"(?<![A-Za-z0-9_])" + name.encode() + rb"(?![A-Za-z0-9_])")
    breaks = [m.start() for m in re.finditer(rb"\n", data)]
    lines = sorted({bisect.bisect_left(breaks, m.start()) for m in mention.finditer(s.code)})
    if s.problem:
        return Unclear(f"the file holds {s.problem}, which rocforge does not parse")
    if not lines:
        return Absent(appendable=data == b"" or data.endswith(b"\n"))
    if len(lines) > 1:
        shown = ", ".join(str(n + 1) for n in lines[:5]) + (", ..." if len(lines) > 5 else "")
        return Unclear(f"{name} appears on lines {shown}")
    raw = data.split(b"\n")[lines[0]]
    where = f"{name} on line {lines[0] + 1}"
    m = re.fullmatch(re.escape(name.encode()) + b"=(" + _WORD + rb")((?:[ ]+#.*)?[ ]*)", raw)
    if lines[0] not in s.starts or m is None:
        return Unclear(f"{where} is not a plain {name}=VALUE line at the file's top level "
                       "(export, indentation, a continuation, an if, or a value the shell computes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Unclear(f"{where} is not valid UTF-8")
    if not text.isprintable():
        return Unclear(f"{where} holds a control character (a tab or a carriage return)")
    return Simple(lines[0] + 1, text, m.group(1).decode(), m.group(2).decode())
