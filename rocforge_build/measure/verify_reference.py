"""The build verify compares against: the one given, else a CPU build of the same recipe and source
that already has what verify runs (reused as it is, never rebuilt), else one rocforge builds in its
own place, `<builds>/reference/`, which no `rocforge build` default prefix names and `rocforge
use`/`env` do not list — so a reference never replaces a build the user asked for."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from rocforge_build import paths
from rocforge_build.errors import UsageError
from rocforge_build.measure.llama_tools import MEASURE_TARGETS, BuildNotUsable, LlamaBuild

REFERENCE_DIR = "reference"  # below the builds directory: references only
MADE_FOR = "reference"  # the manifest's `made_for` in a reference rocforge built for verify
NEEDED = ("llama-perplexity",)  # what verify runs of the reference


def reference_dir() -> Path:
    return paths.builds_prefix() / REFERENCE_DIR


def _source_identity(manifest: dict) -> str | None:
    src = manifest.get("source")
    return str(src.get("identity") or src.get("commit") or "") or None if isinstance(src, dict) else None


def _recipe(manifest: dict) -> tuple[str, str] | None:
    r = manifest.get("recipe")
    return (str(r.get("name")), str(r.get("sha256"))) if isinstance(r, dict) and r.get("name") else None


def _packaged_recipe_sha(name: str) -> str | None:
    """The sha256 of the packaged recipe a reference of `name` is built from (None: no such recipe)."""
    from rocforge_build.errors import RocforgeError
    from rocforge_build.forge import recipes

    try:
        return hashlib.sha256(recipes.load(name).text.encode()).hexdigest()
    except RocforgeError:
        return None


def serves_as_reference(candidate: LlamaBuild, build: LlamaBuild) -> bool:
    """A CPU build of `build`'s source (identity) from the packaged recipe of its name (what
    `reference_request` would build), with every program verify runs of a reference."""
    theirs, mine = candidate.manifest, build.manifest
    ident, recipe = _source_identity(mine), _recipe(mine)
    return (candidate.backend == "cpu" and ident is not None and recipe is not None
            and _source_identity(theirs) == ident and _recipe(theirs) is not None
            and _recipe(theirs) == (recipe[0], _packaged_recipe_sha(recipe[0]))
            and all(candidate.has(p) for p in NEEDED))


def _packaged_patches(name: str) -> dict[str, str]:
    """{patch name: sha256} of the packaged recipe's patches directory."""
    from rocforge_build.errors import RocforgeError
    from rocforge_build.forge import recipes

    try:
        d = recipes.load(name).patches_dir
    except RocforgeError:
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.patch"))}


def is_default_plan(build: LlamaBuild) -> bool:
    """Whether `build` is what rocforge's reference is by definition: a CPU build of the packaged
    recipe as shipped (its sha256: every -D option comes from the recipe) with only that recipe's own
    patches, so nothing but the source and the host compiler decides its numbers, and comparing it
    with another build of that plan would compare a build with itself.  The manifest does not record
    the user's CC/CFLAGS (only the stamp hashes them), so they are not seen here.  `--cmake-target` subsets
    count as the default plan: they pick which programs are linked, not how any file is compiled."""
    m = build.manifest or {}
    recipe = _recipe(m)
    if build.backend != "cpu" or recipe is None or _source_identity(m) is None:
        return False
    if recipe[1] != _packaged_recipe_sha(recipe[0]):
        return False
    shipped = _packaged_patches(recipe[0])
    for p in m.get("patches") or []:
        if p.get("status") == "applied" and shipped.get(str(p.get("name"))) != p.get("sha256"):
            return False
    return True


def existing_reference(build: LlamaBuild) -> LlamaBuild | None:
    """A build already on disk that serves as `build`'s reference: the build itself when it is of
    the default plan (`is_default_plan`: nothing to compare), a reference rocforge built earlier,
    or a CPU build the user made of the default plan."""
    from rocforge_build.discover.builds import find_builds
    from rocforge_build.rootfs import Root

    if is_default_plan(build) and all(build.has(p) for p in NEEDED):
        return build
    candidates = [reference_prefix(build)]
    candidates += [Path(b.prefix) for b in find_builds(Root("/")) if b.backend == "cpu"]
    for prefix in candidates:
        if prefix.is_dir():
            candidate = LlamaBuild.open(prefix)
            if prefix != build.prefix and serves_as_reference(candidate, build) and is_default_plan(candidate):
                return candidate
    return None


def reference_prefix(build: LlamaBuild) -> Path:
    """Where rocforge builds `build`'s reference: named for its recipe and source identity."""
    m = build.manifest
    name = re.sub(r"[^A-Za-z0-9_-]", "_", (_recipe(m) or ("unknown", ""))[0])  # one name, no path
    key = hashlib.sha256(str(_source_identity(m)).encode()).hexdigest()[:12]
    return reference_dir() / f"{name}-cpu-{key}"


def reference_request(build: LlamaBuild, substitutes: str = "auto"):
    """The `Request` that builds `build`'s reference in its own place (`substitutes`: the
    request's mode, so under --substitute-only the reference too comes from a store or not at all)."""
    from rocforge_build.forge import recipes
    from rocforge_build.forge.plan import Request

    m = build.manifest
    if not m or _source_identity(m) is None or _recipe(m) is None:
        raise BuildNotUsable(f"{build.prefix} has no rocforge manifest naming its source",
                             "give --reference PREFIX (a CPU build of the same llama.cpp source)")
    recipe = recipes.load(m["recipe"]["name"])
    src = m.get("source", {})
    location = src.get("location")
    ref = (src.get("commit") or src.get("ref")) if src.get("kind") == "git" else None
    if location == recipe.source.url or (src.get("kind") == "git" and location == recipe.source.git):
        location = None
    return Request(recipe=recipe.name, target=m["target"], backend="cpu", source=location, ref=ref,
                   prefix=str(reference_prefix(build)), build_targets=MEASURE_TARGETS, made_for=MADE_FOR,
                   substitutes=substitutes)


def reference_for(build: LlamaBuild, reference: str | None, *, quiet: bool = False,
                  substitute=None, substitutes: str = "auto") -> LlamaBuild:
    """The reference build: the one given, else one on disk that serves (`existing_reference`),
    else one made now under `<builds>/reference/` (the user's own builds untouched): taken from a
    substitute store when `substitute` (substitute.from_stores, given by the caller) finds it there, else
    compiled, unless `substitutes` is "only"."""
    if reference:
        return LlamaBuild.open(reference)
    found = existing_reference(build)
    if found is not None:
        return found
    return _own_reference(build, quiet, substitute, substitutes)


def _own_reference(build: LlamaBuild, quiet: bool, substitute=None, substitutes: str = "auto") -> LlamaBuild:
    """rocforge's reference of `build`'s source in its own prefix: reused when built, else pulled
    or built now."""
    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.forge import pipeline
    from rocforge_build.rootfs import Root

    req = reference_request(build, substitutes)
    there = read_manifest(req.prefix)
    if there and there.get("made_for") == MADE_FOR:
        made = LlamaBuild.open(req.prefix)
        if serves_as_reference(made, build):  # built earlier from the same recipe and source: reused
            return made
    problem = there and pipeline.replacing_problem(Path(req.prefix), there, MADE_FOR, "another build")
    if problem:  # said before the source is fetched; the pipeline holds the same rule after it
        raise UsageError(problem, "move it away, or give --reference PREFIX (a CPU build of the same source)")
    out = pipeline.build(req, Root("/"), quiet=quiet, substitute=substitute)
    return LlamaBuild.open(out.prefix)


def same_build(build: LlamaBuild, ref: LlamaBuild) -> bool:
    """Whether `ref` is `build` itself: one prefix, or one build stamp (a copy of it)."""
    return build.prefix == ref.prefix or (build.stamp is not None and build.stamp == ref.stamp)


def refuse_self_compare(build: LlamaBuild, ref: LlamaBuild) -> None:
    """A build verified against itself compares nothing: one line, exit 2, never PASSED."""
    if same_build(build, ref):
        what = "the same prefix" if build.prefix == ref.prefix else "the same build (one stamp)"
        raise UsageError(f"nothing was compared: {build.prefix} is its own reference ({what})",
                         "verify compares a build with a different one (a hip or vulkan build with "
                         "its CPU reference); give --reference PREFIX of another build")


def independent_reference(build: LlamaBuild, reference: str | None, *, quiet: bool = False) -> LlamaBuild:
    """The build the serve canary compares `build`'s live server with: never `build` itself, since a
    server compared with its own build proves nothing.  The one given (another build), else verify's
    reference, else -- when `build` is rocforge's default-plan CPU reference -- the same plan built in
    rocforge's own prefix (`reference_prefix`, built once and reused), so a llama-server that differs
    from what verify and tune ran is still caught.  A UsageError "canary not run" when none can be had."""
    from rocforge_build.errors import RocforgeError

    hint = "give --reference PREFIX (another build of the same llama.cpp source)"
    ref = reference_for(build, reference, quiet=quiet)
    if same_build(build, ref) and reference is None and build.prefix != reference_prefix(build):
        try:
            ref = _own_reference(build, quiet)
        except RocforgeError as exc:
            raise UsageError(f"canary not run: no independent reference for {build.prefix}: {exc.message}", hint) from None
    if same_build(build, ref):
        raise UsageError(f"canary not run: {build.prefix} would be compared with itself ({ref.prefix})", hint)
    return ref
