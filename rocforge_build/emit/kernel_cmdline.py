"""Kernel command lines and the files that hold them (`/etc/default/grub`, systemd-boot entries,
`/etc/kernel/cmdline`): the only code that writes them, and that reads GRUB's lines back.

A parameter is `name[=value]`, and a value may be double-quoted to hold spaces, with no quote
inside (the kernel's admin-guide/kernel-parameters, "The kernel's command-line parameters").
`/etc/default/grub` is a shell file that grub-mkconfig sources as root, so a value is written
back single-quoted unless every byte is inert: a `$(...)` the user had single-quoted stays
data.  A variable is rewritten only where `sh_assignments.find` understands every line that sets
it (one plain `NAME=WORD` line); the rewrite replaces that line, by its number, with byte-exact
content under LC_ALL=C, and only while the line still holds what the plan read.
"""

from __future__ import annotations

from rocforge_build import shellsafe
from rocforge_build.emit import sh_assignments
from rocforge_build.emit.sh_assignments import Absent, Simple, Unclear
from rocforge_build.errors import UsageError

GRUB_FILE = "/etc/default/grub"
GRUB_VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
GRUB_ADD_TO = "GRUB_CMDLINE_LINUX_DEFAULT"  # what Debian's update-grub adds to normal boots only
HINT = "a kernel parameter is name[=value]; a value may be double-quoted to hold spaces"
# Bytes that mean nothing to sh inside double quotes (and nothing to sed after escaping).
_INERT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                   " @%+=:,./-_~^[]{}#*?!<>()&;|")


def param_problem(word: object) -> str | None:
    """Why `word` is not one kernel parameter (after the kernel's own unquoting), or None."""
    if not isinstance(word, str) or word == "":
        return f"{word!r} is not a kernel parameter"
    if '"' in word or not word.isprintable():
        return f"{word!r} holds a double quote or a control character"
    name = word.split("=", 1)[0]
    if name == "" or any(c.isspace() for c in name):
        return f"{word!r} has no parameter name"
    return None


def line(words: list[str]) -> str:
    """Parameters as one command line: a value with a space is double-quoted (`a="b c"`)."""
    out = []
    for w in words:
        problem = param_problem(w)
        if problem:
            raise UsageError(f"kernel command line: {problem}", HINT)
        if any(c.isspace() for c in w):
            name, _, value = w.partition("=")
            w = f'{name}="{value}"'
        out.append(w)
    return " ".join(out)


def _double_quoted(rhs: str, i: int, out: list[str]) -> int | None:
    """The end of the double-quoted part starting after `rhs[i-1]`, or None if sh would expand."""
    while i < len(rhs):
        c = rhs[i]
        if c == '"':
            return i + 1
        if c in "$`":
            return None
        if c == "\\" and i + 1 < len(rhs) and rhs[i + 1] in '$`"\\':
            c, i = rhs[i + 1], i + 1
        out.append(c)
        i += 1
    return None


def literal(rhs: str) -> str | None:
    """The value sh gives an assignment's right-hand side, or None where sh would run or expand
    something to get it (`$`, backticks, an unquoted `;`, `|`, `&`, redirections) or cannot
    parse it: such a line is the user's to edit."""
    out: list[str] = []
    i = 0
    while i < len(rhs):
        c = rhs[i]
        if c == "'":
            end = rhs.find("'", i + 1)
            if end < 0:
                return None
            out.append(rhs[i + 1:end])
            i = end + 1
        elif c == '"':
            end = _double_quoted(rhs, i + 1, out)
            if end is None:
                return None
            i = end
        elif c == "\\" and i + 1 < len(rhs):
            out.append(rhs[i + 1])
            i += 2
        elif c.isspace():
            rest = rhs[i:].lstrip()
            return "".join(out) if rest == "" or rest.startswith("#") else None
        elif c in "$`;&|<>()":
            return None
        else:
            out.append(c)
            i += 1
    return "".join(out)


def grub_find(data: bytes) -> dict[str, Simple | Unclear | Absent]:
    """How /etc/default/grub's bytes set each kernel command-line variable."""
    return {var: sh_assignments.find(data, var) for var in GRUB_VARS}


def grub_lines(data: bytes | str) -> list[tuple[str, str | None]]:
    """(variable, value) of each `GRUB_CMDLINE_LINUX(_DEFAULT)` the file sets, as sh would read
    the value; None where rocforge does not understand how the file sets it."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return [(var, literal(f.word) if isinstance(f, Simple) else None)
            for var, f in grub_find(raw).items() if not isinstance(f, Absent)]


def grub_assignment(var: str, words: list[str]) -> str:
    """`VAR="..."` (or `VAR='...'` when a byte would mean something to sh)."""
    if var not in GRUB_VARS:
        raise UsageError(f"{var!r} is not a GRUB kernel command-line variable")
    value = line(words)
    if all(c in _INERT for c in value):
        return f'{var}="{value}"'
    return f"{var}={shellsafe.sh_quote(value)}"


def sed_replace(path: str, line_regex: str, new_line: str) -> str:
    """`sudo env LC_ALL=C sed -i.rocforge.bak` (bytes, whatever the locale) replacing each line
    that starts with `line_regex` (a fixed pattern of this module's callers) by `new_line`, with
    the user's file kept as `.rocforge.bak`."""
    problem = shellsafe.word_problem(new_line)
    if problem:
        raise UsageError(f"{path}: {problem}", HINT)
    repl = new_line.replace("\\", "\\\\").replace("&", "\\&").replace("|", "\\|")
    script = f"s|^{line_regex}.*|{repl}|"
    return f"sudo env LC_ALL=C sed -i.rocforge.bak {shellsafe.sh_quote(script)} {shellsafe.sh_word(path)}"


def grub_rewrite(var: str, found: Simple, words: list[str], path: str = GRUB_FILE) -> str:
    """The command that sets line `found.line_no` of /etc/default/grub to `var="words"` (the
    line's comment kept), with the user's file kept as `.rocforge.bak`; it stops with one line
    on stderr if that line no longer holds what the plan read."""
    new = grub_assignment(var, words) + found.suffix
    for text in (found.line, new):
        problem = shellsafe.word_problem(text)
        if problem:
            raise UsageError(f"{path}: {problem}", HINT)
    repl = new.replace("\\", "\\\\").replace("&", "\\&").replace("|", "\\|")
    n, file = found.line_no, shellsafe.sh_word(path)
    return (f'if [ "$(LC_ALL=C sed -n {n}p {file})" = {shellsafe.sh_quote(found.line)} ]; then '
            f"sudo env LC_ALL=C sed -i.rocforge.bak {shellsafe.sh_quote(f'{n}s|.*|{repl}|')} {file}; "
            f"else echo {shellsafe.sh_quote(f'rocforge: {path} line {n} changed since this plan was made; run rocforge host plan again')} >&2; "
            "exit 1; fi")


def grub_append(words: list[str]) -> str:
    """The command that adds a `GRUB_ADD_TO` line to /etc/default/grub (it had none)."""
    return shellsafe.tee_line(grub_assignment(GRUB_ADD_TO, words), GRUB_FILE, append=True)


def loader_options(path: str, words: list[str]) -> str:
    """The command that sets a systemd-boot entry's `options` line (not a shell file)."""
    return sed_replace(path, "options[[:space:]]", "options " + line(words))


def kernel_cmdline_file(words: list[str]) -> str:
    """The command that writes /etc/kernel/cmdline (read by kernel-install and UKIs)."""
    return shellsafe.tee_line(line(words), "/etc/kernel/cmdline")


def grubby(add: list[str], remove: list[str]) -> str:
    """`grubby --update-kernel=ALL` removing and adding parameters (Fedora)."""
    parts = ["sudo grubby --update-kernel=ALL"]
    if remove:
        parts.append("--remove-args=" + shellsafe.sh_word(line(remove)))
    if add:
        parts.append("--args=" + shellsafe.sh_word(line(add)))
    return " ".join(parts)


def kernelstub(add: list[str], remove: list[str]) -> list[str]:
    """`kernelstub -d`/`-a`, one parameter each (Pop!_OS)."""
    return ([f"sudo kernelstub -d {shellsafe.sh_word(line([w]))}" for w in remove] +
            [f"sudo kernelstub -a {shellsafe.sh_word(line([w]))}" for w in add])
