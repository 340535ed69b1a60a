"""Known llama.cpp faults at a serving shape: the recipe's `[[known_bad]]` entries applied to a
build and a shape, so that verify names the class of a failure and serve refuses the shape.

An entry holds when its `when` holds for the build's manifest (backend, source version, target)
and the shape is inside every limit it names: flash attention as `fa`, at least `parallel_min`
sequences in one unified KV cache, more than `cells_over` cells (context x sequences).
"""

from __future__ import annotations

from typing import Any

from rocforge_build.errors import RocforgeError
from rocforge_build.forge import conditions


def shape_matches(entry: dict, fa: bool, parallel: int, ctx: int) -> bool:
    """Whether a shape (flash attention, sequences sharing one unified cache, context per
    sequence) is inside the entry's limits."""
    if "fa" in entry and bool(fa) != entry["fa"]:
        return False
    if parallel < entry.get("parallel_min", 1):
        return False
    return ctx * parallel > entry.get("cells_over", -1)


def build_matches(entry: dict, manifest: dict) -> bool:
    """Whether the entry's `when` holds for a build's manifest; a fact the manifest lacks (no
    source version) never matches: the entry claims only what was seen."""
    src = manifest.get("source") if isinstance(manifest.get("source"), dict) else {}
    version = src.get("version") or None
    facts = conditions.Facts(target=manifest.get("target"), backend=manifest.get("backend"),
                             pinned_version=str(version) if version else None)
    return conditions.judge(entry["when"], facts)[0] is True


def _recipe_entries(manifest: dict) -> tuple[dict, ...]:
    """The `[[known_bad]]` entries of the recipe the build was made from (none when the recipe
    is not a packaged one or cannot be read: a fault is only ever named from the recipe's data)."""
    from rocforge_build.forge import recipes

    name = (manifest.get("recipe") or {}).get("name") if isinstance(manifest.get("recipe"), dict) else None
    if not isinstance(name, str) or name not in recipes.available():
        return ()
    try:
        return recipes.load(name).known_bad
    except RocforgeError:
        return ()


def find(manifest: dict, fa: bool, parallel: int, ctx: int,
         entries: tuple[dict, ...] | None = None) -> dict | None:
    """The first known fault of this build at this shape, or None."""
    for entry in _recipe_entries(manifest) if entries is None else entries:
        if shape_matches(entry, fa, parallel, ctx) and build_matches(entry, manifest):
            return entry
    return None


def find_for_shape(manifest: dict, shape: dict[str, Any]) -> dict | None:
    """`find` for a verify Shape's or a preset's JSON shape (ctx, fa, parallel)."""
    try:
        ctx = int(shape.get("ctx") or 0)
        parallel = int(shape.get("parallel") or 1)
    except (TypeError, ValueError):
        return None
    return find(manifest, bool(shape.get("fa")), parallel, ctx)


def describe(entry: dict) -> str:
    """The fault as one clause: its symptom and evidence."""
    return f"{entry['symptom']} ({'; '.join(entry['evidence'])})"


def name_failures(manifest: dict, checks) -> None:
    """Append to each failed check's reasons the known fault its shape and build match, so a
    failure of llama.cpp's own reads as that and not as a fault of this build's flags."""
    for c in checks:
        if c.passed:
            continue
        entry = find(manifest, bool(c.fa), c.parallel, c.ctx)
        if entry is not None:
            c.failed.append(f"matches a known llama.cpp fault: {describe(entry)}")
