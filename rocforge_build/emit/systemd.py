"""systemd service units: the only code that writes them.

Words are quoted by systemd.syntax(7) ("Quoting"): double quotes, `\\` and `"` escaped; `%` is
doubled everywhere (systemd.unit(5), "Specifiers"), `$` only in a command's arguments, where it
would expand a variable (systemd.service(5), "Command lines"; not in the program's path, nor in
`Environment=`, where systemd.exec(5) says "the $ character has no special meaning").  A line break, CR or NUL cannot be represented on a unit's
line, so such a value is refused; free text (the description, comments) is made one line.
"""

from __future__ import annotations

from rocforge_build import shellsafe
from rocforge_build.errors import UsageError

HINT = "a systemd unit's values cannot carry a line break or NUL byte; use --format shell"


def _checked(value: str, where: str) -> str:
    problem = shellsafe.word_problem(value)
    if problem:
        raise UsageError(f"{where}: {problem}", HINT)
    return value


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def exec_word(word: str) -> str:
    """One argument of `ExecStart=` (after the program): reaches the program byte for byte."""
    return _quoted(_checked(word, "ExecStart")).replace("$", "$$")


def exec_program(path: str) -> str:
    """The program of `ExecStart=`: systemd expands no variable in it, and refuses a name with a
    quote, backslash or control character ("Executable name contains special characters")."""
    if not path.startswith("/") or any(c in "\"'\\" or not c.isprintable() for c in path):
        raise UsageError(f"ExecStart: the program {path!r} is not an absolute path systemd can run "
                         "(no quote, backslash or control character)", HINT)
    return _quoted(path)


def env_assignment(name: str, value: str) -> str:
    """One `Environment=` assignment, `"NAME=value"`."""
    shellsafe.check_env(name, value, "Environment")
    return _quoted(f"{name}={value}")


def text(value: object) -> str:
    """Free text for `Description=`: one line, `%` doubled, and never ending in a backslash
    (which would continue onto the next line, systemd.syntax(7))."""
    return shellsafe.one_line(value).replace("%", "%%").rstrip("\\")


def service(*, comment: str, description: str, env: dict[str, str], argv: list[str]) -> str:
    """A user service that runs `argv` with `env`: one `[Unit]`, one `[Service]`, one `[Install]`."""
    if not argv:
        raise UsageError("ExecStart: the command is empty", HINT)
    lines = [shellsafe.comment(comment).rstrip("\\"), "[Unit]", f"Description={text(description)}",
             "After=network-online.target", "", "[Service]"]
    lines += [f"Environment={env_assignment(k, v)}" for k, v in env.items()]
    lines += ["ExecStart=" + " ".join([exec_program(argv[0]), *(exec_word(a) for a in argv[1:])]),
              "Restart=on-failure", "",
              "[Install]", "WantedBy=default.target"]
    return "\n".join(lines) + "\n"
