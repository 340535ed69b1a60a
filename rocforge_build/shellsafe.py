"""The emitter of POSIX sh, bash, zsh, fish and dotenv text (with discover/envscript.py, which
writes `rocforge env`'s scripts from these pieces): which environment names and values can be
emitted, how each shell quotes, the sh statements and command lines rocforge writes, and how
any text becomes a one-line comment.  Other formats have their own emitter in emit/.

Recipes, build manifests, presets and bundles are data a user may have edited or been handed;
every emitter (`rocforge env`, the bundle `run` launcher, Containerfile ENV lines, `preset show
--shell`, `host plan`) goes through these helpers, so a name such as `X;touch f` or a value with
a newline can never become shell code or a line of its own.  Stdlib only, and light: `rocforge
env` imports it on every shell start-up.
"""

from __future__ import annotations

import sys

from rocforge_build.errors import UsageError

# POSIX.1-2017 XBD 8.1: names of environment variables "consist solely of uppercase letters,
# digits, and the <underscore> ... and do not begin with a digit"; lower case is allowed by
# every shell (bash, zsh, fish all take [A-Za-z_][A-Za-z0-9_]*), so that is the rule here.
# Checked without `re` (a few ms of start-up that `rocforge env` would pay for one pattern).
NAME_HINT = "an environment variable name is letters, digits and '_', not starting with a digit"
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_REST = _NAME_FIRST | frozenset("0123456789")


def is_env_name(name: object) -> bool:
    """`name` matches [A-Za-z_][A-Za-z0-9_]* (ASCII only)."""
    return (isinstance(name, str) and name != "" and name[0] in _NAME_FIRST
            and all(c in _NAME_REST for c in name))


def env_name_problem(name: object) -> str | None:
    """Why `name` cannot be an environment variable name, or None when it can."""
    if not is_env_name(name):
        return f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    return None


# Every character some reader of rocforge's output takes as the end of a line: Python's
# `str.splitlines` (LF, VT, FF, CR, FS, GS, RS, NEL, U+2028, U+2029), plus every other C0 control
# but TAB (NUL ends a C string; ESC and BS rewrite what a terminal shows).  One set, used by every
# emitter's check, so no value can carry a line (a dotenv `LD_PRELOAD=`) past one reader.
LINE_BREAKS = frozenset(chr(c) for c in range(0x20) if c != 0x09) | frozenset("\x85\u2028\u2029")
# What a terminal interprets beyond LINE_BREAKS: DEL, the C1 controls (U+009B is a one-byte CSI,
# the start of an ANSI sequence) and the bidi controls that reorder what a line shows
# (U+202A-202E, U+2066-2069): text a user reads as one plain line (a recipe's reason) holds none.
TERMINAL_CONTROLS = (LINE_BREAKS | frozenset(chr(c) for c in range(0x7f, 0xa0))
                     | frozenset(chr(c) for c in (*range(0x202a, 0x202f), *range(0x2066, 0x206a))))
BREAK_HINT = "a value or word cannot hold a line break, NUL or other control character"


def escaped(line: str) -> str:
    """`line` with every terminal control (line breaks, C0, C1, bidi) written as its escape
    (`\\x1b`): what text a server, a file or a build gave may show on a terminal, never drive it."""
    if line.isprintable():
        return line
    return "".join(c.encode("unicode_escape").decode("ascii") if c in TERMINAL_CONTROLS else c for c in line)


def line_break_problem(text: str) -> str | None:
    """Why `text` cannot stay on one line for every reader (a `LINE_BREAKS` character), or None."""
    if any(c in LINE_BREAKS for c in text):
        return f"{text!r} contains a line break, NUL or control character"
    return None


def env_value_problem(value: object) -> str | None:
    """Why `value` cannot be emitted as one variable's value (dotenv and Containerfile lines end
    at a line break; a NUL ends a C string), or None when it can."""
    if not isinstance(value, str):
        return f"{value!r} is not a string"
    return line_break_problem(value)


def check_env(name: object, value: object, where: str, error=UsageError) -> None:
    """Raise `error` (naming `where`: the file and key) unless `name=value` can be emitted."""
    problem = env_name_problem(name)
    if problem:
        raise error(f"{where}: {problem}", NAME_HINT)
    if value is not None:
        problem = env_value_problem(value)
        if problem:
            raise error(f"{where}: {name}: {problem}",
                        "environment values cannot carry a line break, NUL or control character")


def check_env_table(table: object, where: str, error=UsageError) -> dict[str, str]:
    """A `{name: value}` table read from a file, checked entry by entry (values as strings)."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise error(f"{where}: must be a table of NAME = \"value\"")
    for k, v in table.items():
        check_env(k, str(v), f"{where}.{k}" if env_name_problem(k) is None else where, error)
    return {k: str(v) for k, v in table.items()}


def sh_quote(value: str) -> str:
    """POSIX single quotes (sh, bash, zsh): nothing inside is special but `'` itself."""
    return "'" + value.replace("'", "'\\''") + "'"


def fish_quote(value: str) -> str:
    """fish single quotes: `\\` and `'` are the only escapes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def one_line(text: object) -> str:
    """`text` on one line: every run of whitespace or unprintable characters (newline, CR, NUL,
    escape, U+2028 ...) becomes one space, so it cannot end a comment or a script line."""
    line = str(text)
    if not line.isprintable():
        line = "".join(c if c.isprintable() else " " for c in line)
    return " ".join(line.split())


def comment(text: object, lead: str = "# ") -> str:
    """A comment line for sh, bash, zsh, fish, dotenv and Containerfiles alike."""
    return lead + one_line(text)


def write_script(text: str) -> None:
    """The one writer of every script and format rocforge prints (env scripts, presets, serve
    --dry-run, host plans, container commands): on stdout in the file system's own bytes, so a
    value reaches the shell, YAML or unit file as it is on disk, whatever encoding the terminal
    declares (PYTHONIOENCODING=ascii and the CLI's backslashreplace would print `é` as `\\xe9`)."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (a caller's StringIO): it takes the text itself
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    out.write(text.encode(sys.getfilesystemencoding(), "surrogateescape"))
    out.flush()


# -- POSIX sh statements: the only code that writes them (bash and zsh read the same) -------------
SHEBANG = "#!/bin/sh"
# Bytes a word may hold and stay bare: shlex.quote's set, checked without `re`.
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789@%+=:,./-_")


def word_problem(word: object) -> str | None:
    """Why `word` cannot be one argument of a command line, or None: a NUL ends a C string (no
    program can receive it), a line break would split a line a person copies or a pipe reads."""
    if not isinstance(word, str):
        return f"{word!r} is not a string"
    return line_break_problem(word)


def sh_word(word: str) -> str:
    """One sh word: bare when every byte is inert, else single-quoted (`sh_quote`); a leading
    `=` is quoted too, since zsh expands `=cmd` to a path (zshexpn(1), "Filename Expansion")."""
    if word and word[0] != "=" and all(c in _BARE for c in word):
        return word
    return sh_quote(word)


def sh_command(argv: list[str], env: dict[str, str] | None = None, where: str = "the command",
               error=UsageError) -> str:
    """`env NAME=value ... ARGV` as one sh line; names and words checked, every word quoted."""
    if not argv:
        raise error(f"{where} is empty", "a command needs at least the program")
    for w in argv:
        problem = word_problem(w)
        if problem:
            raise error(f"{where}: {problem}", BREAK_HINT)
    words = []
    for k, v in (env or {}).items():
        check_env(k, v, f"{where}: env", error)
        words.append(f"{k}={sh_word(v)}")
    return " ".join((["env", *words] if words else []) + [sh_word(w) for w in argv])


def sh_export(name: str, value: str) -> str:
    """`export NAME='value'` (checked by `check_env` first)."""
    check_env(name, value, "an export line")
    return f"export {name}={sh_quote(value)}"


def sh_dispatch(var: str, lines: dict[str, str], default: str) -> list[str]:
    """A `case` on `$VAR` (default `default`) that execs the `sh_command` line its value names,
    with the script's arguments; any other value is refused.  No function is defined, so no
    name from data (`if`, `exec`, `env`, `esac`) can become a keyword, a builtin or a command
    another line calls; each pattern is quoted, so none is read as a reserved word."""
    for n in [var, default, *lines]:
        check_env(n, None, "a shell dispatch name")
    names = " ".join(lines)
    return ([f'case "${{{var}:-{default}}}" in']
            + [f'    {sh_quote(n)}) exec {line} "$@" ;;' for n, line in lines.items()]
            + [f"    *) echo {sh_quote(f'{var} must be one of: {names}')} >&2; exit 2 ;;", "esac"])


def tee_line(text: str, path: str, append: bool = False) -> str:
    """`... | sudo tee [-a] PATH` writing `text` plus a newline, exactly (printf, since dash's
    echo reads backslashes), for a host change a person reviews and runs."""
    problem = word_problem(text)
    if problem:
        raise UsageError(f"a line for {path}: {problem}")
    printer = f"echo {sh_word(text)}" if "\\" not in text and not text.startswith("-") else \
        f"printf '%s\\n' {sh_quote(text)}"
    return f"{printer} | sudo tee {'-a ' if append else ''}{sh_word(path)}"


def dotenv_line(name: str, value: str) -> str:
    """`NAME=value`, literal (Docker/Podman `--env-file`: no quoting, no expansion)."""
    check_env(name, value, "a dotenv line")
    return f"{name}={value}"
