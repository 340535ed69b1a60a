"""The env script's warnings also go to stderr: `eval "$(rocforge env)"` never shows a comment.
Stdlib only, so the cached start-up path can print them from a stored script."""

from __future__ import annotations

import sys

COMMENT = "# warning: "


def as_comments(warnings) -> list[str]:
    from rocforge_build.shellsafe import one_line  # not on the cached path, which only prints

    return [COMMENT + one_line(w) for w in warnings]


def to_stderr(warnings) -> None:
    for w in warnings:
        sys.stderr.write(f"rocforge: warning: {w}\n")


def from_script(output: str) -> list[str]:
    """The warnings of a script served from the env cache (its `# warning: ` comments)."""
    return [line[len(COMMENT):] for line in output.split("\n") if line.startswith(COMMENT)]
