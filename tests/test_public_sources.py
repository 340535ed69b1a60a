"""User-facing text cites what users can look up: a repository and issue/PR, an AMD doc, a
public notes repository — never the project's private field notes ("seed 004", "the brief",
"brief section 5"), which users do not have (issue 15, the newcomer trial)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"\bseed\s*0\d\d\b|\bbrief section\b|\bthe (field )?brief\b|shared/brief|shared/seeds",
                     re.IGNORECASE)


def _user_facing() -> list[Path]:
    roots = ["rocforge_build", "recipes", "patches", "containers", "docs"]
    files = [p for r in roots for p in (REPO / r).rglob("*") if p.is_file()
             and p.suffix in {".py", ".toml", ".patch", ".md", ".txt", ".j2", ".sh", ""}
             and "__pycache__" not in p.parts]
    return [REPO / "README.md", *files]


def test_no_private_notes_cited():
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}"
             for p in _user_facing()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if PRIVATE.search(line)]
    assert found == []
