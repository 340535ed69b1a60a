"""An existing rocforge build a `[[depends]]` rule with `use_existing` takes as it is, found in
the builds directory by its manifest (forge/context.py decides which dependencies a build has)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.forge.locations import default_prefix


@dataclass(frozen=True)
class Built:
    """An existing rocforge build in the builds directory, found by its manifest."""

    recipe: str
    prefix: Path
    backend: str
    stamp: str
    source: str  # where it was built from, as its manifest says
    built_at: str

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "prefix": str(self.prefix), "backend": self.backend,
                "stamp": self.stamp, "source": self.source, "built_at": self.built_at}


def existing_build(recipe: str, target: str) -> Built | None:
    """The rocforge build of `recipe` for `target` in the builds directory, found by its manifest
    (every output it names still there): the default prefix first, else the newest."""
    base = paths.builds_prefix()
    if not base.is_dir():
        return None
    found = []
    for prefix in sorted(base.iterdir()):
        if prefix.name.startswith(".") or ".rocforge-" in prefix.name or not prefix.is_dir():
            continue
        m = read_manifest(prefix)
        if not m or m.get("recipe", {}).get("name") != recipe or m.get("target") != target:
            continue
        if not all(any(prefix.glob(str(o))) for o in m.get("outputs", [])):
            continue
        src = m.get("source", {})
        where = src.get("location") or src.get("url") or src.get("kind") or "?"
        found.append(Built(recipe, prefix, str(m.get("backend", "")), str(m.get("stamp", "")),
                           str(where), str(m.get("built_at", ""))))
    default = [b for b in found if b.prefix == default_prefix(recipe, target, b.backend)]
    return (default or sorted(found, key=lambda b: b.built_at, reverse=True) or [None])[0]
