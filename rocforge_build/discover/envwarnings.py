"""The env script's warnings also go to stderr: `eval "$(rocforge env)"` never shows a comment.
Stdlib only, so the cached start-up path can print them from a stored script."""

from __future__ import annotations

import sys

COMMENT = "# warning: "


def as_comments(warnings) -> list[str]:
    from rocforge_build.shellsafe import one_line  # not on the cached path, which only prints

    return [COMMENT + one_line(w) for w in warnings]


def write_script(text: str) -> None:
    """The env script on stdout in the file system's own bytes: its paths must reach the shell as
    they are on disk, whatever encoding the terminal declares (PYTHONIOENCODING=ascii would turn
    a non-ASCII prefix into an escaped, wrong PATH entry)."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (a caller's StringIO): it takes the text itself
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    out.write(text.encode(sys.getfilesystemencoding(), "surrogateescape"))
    out.flush()


def to_stderr(warnings) -> None:
    for w in warnings:
        sys.stderr.write(f"rocforge: warning: {w}\n")


def from_script(output: str) -> list[str]:
    """The warnings of a script served from the env cache (its `# warning: ` comments)."""
    return [line[len(COMMENT):] for line in output.splitlines() if line.startswith(COMMENT)]
