"""A plan's dependencies: the `[[depends]]` rules whose `when` holds, each planned (its own
plan, recursively) or an existing rocforge build of it used as it is (`use_existing`, found in
the builds directory by its manifest), and the headers the build's own checks then see."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import ConfigError
from rocforge_build.forge import conditions, recipes

if TYPE_CHECKING:
    from rocforge_build.forge.plan import Plan, Request


@dataclass
class Dependency:
    """A recipe built first, for the same target, whose prefix this build uses: planned (`plan`),
    or an existing rocforge build of it used as it is (`built`: its prefix and manifest)."""

    request: Request
    reason: str
    because: str
    prepend: dict[str, str]  # variable -> directory of the dependency's prefix
    plan: Plan | None
    built: Built | None = None

    @property
    def recipe(self) -> str:
        return self.plan.recipe.name if self.plan else self.built.recipe

    @property
    def prefix(self) -> Path:
        return self.plan.prefix if self.plan else self.built.prefix

    @property
    def backend(self) -> str:
        return self.plan.backend if self.plan else self.built.backend

    @property
    def stamp(self) -> str:
        return self.plan.stamp if self.plan else self.built.stamp

    def to_json(self) -> dict:
        out = {"recipe": self.recipe, "target": self.request.target, "backend": self.backend,
               "prefix": str(self.prefix), "reason": self.reason, "because": self.because,
               "prepend": self.prepend, "stamp": self.stamp,
               "plan": self.plan.to_json() if self.plan else None}
        if self.built:  # an existing build used as it is: no plan, where it came from instead
            out["built"] = self.built.to_json()
        return out


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


def dependency_requests(recipe: recipes.Recipe, req: Request, facts: conditions.Facts,
                         stack: tuple[str, ...], pending: list[dict] | None = None
                         ) -> list[tuple[recipes.Rule, Request, str]]:
    """The `[[depends]]` rules whose `when` holds, as requests for the same target."""
    from rocforge_build.forge.plan import Request, _applies

    out = []
    for rule in recipe.of("depends"):
        holds, why = _applies(rule, facts, [] if pending is None else pending, "depends",
                              rule.get("recipe"), reason=rule.get("reason"))
        if not holds:
            continue
        name = rule.get("recipe")
        beside = recipe.path.parent / (name if name.endswith(".toml") else f"{name}.toml")
        ref = str(beside) if beside.is_file() else name
        if name in stack or recipes.load(ref).name in stack:
            raise ConfigError(f"recipe {recipe.name}: dependency cycle "
                              f"{' -> '.join((*stack, recipe.name, name))}")
        dep = Request(recipe=ref, target=req.target, backend=rule.get("backend"), jobs=req.jobs,
                      no_cache=req.no_cache, distribute=req.distribute, environ=req.environ,
                      rocm=req.rocm)
        out.append((rule, dep, why))
    return out


def plan_dependencies(recipe, req, facts, root, check_patches, stack, fetch: bool = True,
                       pending: list[dict] | None = None) -> list[Dependency]:
    """Plan each dependency (recursively), or take the existing rocforge build of it where the
    rule says `use_existing`; then let this build's header checks see the headers it will use:
    the installed ones when the dependency's prefix exists, else those in its source
    (`source_include`) — what the build will install."""
    from rocforge_build.forge.plan import make_plan

    deps, extra = [], []
    pending = [] if pending is None else pending
    for rule, dep_req, why in dependency_requests(recipe, req, facts, stack, pending):
        name = recipes.load(dep_req.recipe).name
        built = existing_build(name, dep_req.target) if rule.get("use_existing") else None
        if built is not None:
            because = (f"{why}; the existing rocforge {name} build for {dep_req.target} at "
                       f"{built.prefix} (from {built.source}, {built.built_at}) is used as it is, "
                       f"nothing is fetched; `rocforge build {name} --target {dep_req.target}` "
                       "replaces it")
            deps.append(Dependency(dep_req, rule.get("reason"), because,
                                   dict(rule.get("prepend", {})), None, built))
            if (built.prefix / "include").is_dir():
                extra.append(built.prefix / "include")
            continue
        dep_plan = make_plan(dep_req, root, check_patches=check_patches, fetch=fetch,
                             _stack=(*stack, recipe.name))
        if rule.get("use_existing"):
            why += (f"; no rocforge {name} build for {dep_req.target} in {paths.builds_prefix()}: "
                    f"one is built from {dep_plan.source.spec.location}")
        deps.append(Dependency(dep_req, rule.get("reason"), why, dict(rule.get("prepend", {})),
                               dep_plan))
        if (dep_plan.prefix / "include").is_dir():
            extra.append(dep_plan.prefix / "include")
        elif rule.get("source_include") and not dep_plan.source.read:
            pending.append({"rule": "headers", "name": name, "reason": rule.get("reason"),
                            "when": f"{rule.get('source_include')} of its source (not fetched) is "
                            "read after its fetch: until then the header checks above read the "
                            "toolchain's"})
        elif rule.get("source_include"):
            extra.append(dep_plan.source.tree / rule.get("source_include"))
    if extra and facts.host is not None:
        facts.host = conditions.HostFacts(include_dirs=(*extra, *facts.host.include_dirs),
                                          path=facts.host.path, probe_glslc=facts.host.probe_glslc,
                                          rocm_root=facts.host.rocm_root,
                                          cpu_flags=facts.host.cpu_flags)
    return deps


def existing_build(recipe: str, target: str) -> Built | None:
    """The rocforge build of `recipe` for `target` in the builds directory, found by its manifest
    (every output it names still there): the default prefix first, else the newest."""
    from rocforge_build.forge.plan import default_prefix

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
