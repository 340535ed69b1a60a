"""Which shell is asking: `rocforge env | source` in fish must get fish syntax even when the login
shell in `$SHELL` is bash.  The parent process (the shell running the pipeline or the command
substitution) tells; `$SHELL` only when the parent is not a known shell (a script under `sh`,
a Python test harness).  Stdlib `os` only: this runs on every shell start-up."""

from __future__ import annotations

import os

KNOWN = ("bash", "zsh", "fish")


def _parent_name(proc: str = "/proc") -> str:
    try:
        with open(os.path.join(proc, str(os.getppid()), "comm"), encoding="utf-8",
                  errors="replace") as fh:
            name = fh.read().strip()
    except OSError:
        return ""
    return name.lstrip("-")  # a login shell's comm can read "-bash"


def calling_shell(environ=os.environ) -> str:
    """`bash`, `zsh` or `fish`: the parent process if it is one of them, else `$SHELL`'s name,
    else bash.  `ROCFORGE_SHELL` (used by tests and wrappers) wins over both."""
    for name in (environ.get("ROCFORGE_SHELL", ""), _parent_name(),
                 os.path.basename(environ.get("SHELL", ""))):
        if name in KNOWN:
            return name
    return "bash"
