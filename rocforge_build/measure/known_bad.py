"""Known llama.cpp faults at a serving shape: the recipe's `[[known_bad]]` entries applied to a
build and a shape, so that verify names the class of a failure and serve refuses the shape.

An entry holds when its `when` holds for the build's manifest (backend, source version, target)
and the shape is inside every limit it names: flash attention as `fa`, at least `parallel_min`
sequences in one unified KV cache, more than `cells_over` cells (context x sequences).
"""

from __future__ import annotations

import functools

from rocforge_build.errors import RocforgeError
from rocforge_build.forge import conditions

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from rocforge_build.measure.preset_values import PresetRange


def shape_matches(entry: dict, fa: bool, parallel: int, cells: int) -> bool:
    """Whether a shape (flash attention, sequences sharing one unified KV cache, the cache's
    cells) is inside the entry's limits."""
    if "fa" in entry and bool(fa) != entry["fa"]:
        return False
    if parallel < entry.get("parallel_min", 1):
        return False
    return cells > entry.get("cells_over", -1)


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
    return _packaged_entries(name)


@functools.lru_cache(maxsize=8)
def _packaged_entries(name: str) -> tuple[dict, ...]:
    """A packaged recipe's entries, read once per process (verify matches every failed check)."""
    from rocforge_build.forge import recipes

    try:
        return recipes.load(name).known_bad
    except RocforgeError:
        return ()


def find(manifest: dict, fa: bool, parallel: int, cells: int,
         entries: tuple[dict, ...] | None = None) -> dict | None:
    """The first known fault of this build at this shape, or None."""
    for entry in _recipe_entries(manifest) if entries is None else entries:
        if shape_matches(entry, fa, parallel, cells) and build_matches(entry, manifest):
            return entry
    return None


def served_shape(argv: list) -> tuple[bool, int, int]:
    """(flash attention, sequences in one unified KV cache, its cells) of a llama-server command:
    -np slots share one cache only with -kvu / --kv-unified (else each has its own: one sequence
    a cache, of -c / -np cells); flash attention counts as on only when asked for (`-fa on` or a
    bare `-fa` of older trees), since `auto` may leave it off."""
    words = [str(w) for w in argv]

    def after(*names: str) -> str | None:
        return next((words[i + 1] for i, w in enumerate(words[:-1]) if w in names), None)

    def number(*names: str, default: int) -> int:
        text = after(*names)
        return int(text) if text is not None and text.isascii() and text.isdigit() else default

    fa_word = after("-fa", "--flash-attn")
    fa = fa_word in ("on", "1", "true") or (
        any(w in ("-fa", "--flash-attn") for w in words) and fa_word not in ("off", "auto", "0", "false"))
    parallel = max(number("-np", "--parallel", default=1), 1)
    cells = number("-c", "--ctx-size", default=4096)
    if not {"-kvu", "--kv-unified"} & set(words):
        return fa, 1, cells // parallel
    return fa, parallel, cells


def preset_problem(r: PresetRange, build=None) -> tuple[str, str] | None:
    """(why, hint) when a preset range's llama-server command runs a shape its build is known to
    compute wrong; None when no entry of the build's recipe matches.  `build`: the range's
    LlamaBuild, already opened by the caller."""
    from rocforge_build.measure.llama_tools import LlamaBuild

    manifest = (build or LlamaBuild.open(r.prefix)).manifest
    fa, parallel, cells = served_shape(r.argv)
    entry = find(manifest, fa, parallel, cells)
    if entry is None:
        return None
    return (f"the preset serves {parallel} sequences in one unified KV cache of {cells} cells with "
            f"flash attention {'on' if fa else 'off'} on {r.prefix}, which matches a known "
            f"llama.cpp fault: {describe(entry)}",
            entry.get("hint") or "run `rocforge tune` again for another shape")


def describe(entry: dict) -> str:
    """The fault as one clause: its symptom and evidence."""
    return f"{entry['symptom']} ({'; '.join(entry['evidence'])})"


def name_failures(manifest: dict, checks: list) -> list:
    """Append to each failed check's reasons the known fault its shape and build match, so a
    failure of llama.cpp's own reads as that and not as a fault of this build's flags; returns
    `checks`."""
    for c in checks:
        if c.passed:
            continue
        entry = find(manifest, bool(c.fa), c.parallel, c.ctx * c.parallel)
        if entry is not None:
            c.failed.append(f"matches a known llama.cpp fault: {describe(entry)}")
    return checks
