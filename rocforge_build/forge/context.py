"""The facts of one build request, each found once: the recipe read, the GPU target looked up,
the source resolved and read, each toolchain detected, the backend chosen, the prefix, the
dependencies' own contexts and the inputs stamp.  `make_plan` and the up-to-date check start from
the same context, so they cannot disagree, and nothing is asked of git, the resolver or the
recipe file twice in one command.

A context is a value: `read()` (a build) or `read_cached()` (a dry run: never a download) gives a
new context with the source's tree; everything derived from it is computed on first use.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from rocforge_build import __version__
from rocforge_build.discover import targets
from rocforge_build.download import sha256_file
from rocforge_build.errors import ConfigError, NetworkError, UsageError
from rocforge_build.forge import conditions, recipes, sources
from rocforge_build.forge.backend_choice import (
    BackendChoice,
    backend_without_source,
    check_before_fetch,
    choose_backend,
)
from rocforge_build.forge.locations import MANIFEST, default_prefix
from rocforge_build.forge.plan_deps import Built, existing_build
from rocforge_build.forge.request import Request
from rocforge_build.forge.substitute_key import SubstituteKey, SubstitutePolicy, key_fields
from rocforge_build.forge.toolchains import Toolchain, detect, host_identity
from rocforge_build.proc import run

# the user's environment that changes what CMake builds (part of the stamp)
BUILD_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "HIPFLAGS", "HIPCXX",
             "VULKAN_SDK", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH")


class Toolchains:
    """The toolchains of one request, each kind detected at most once (a HIP detection runs the
    ROCm resolver over every install on the machine)."""

    def __init__(self, root, target: str, request: Request):
        self._root, self._target, self._request = root, target, request
        self._found: dict[str, Toolchain] = {}

    def __getitem__(self, kind: str) -> Toolchain:
        if kind not in self._found:
            self._found[kind] = detect(kind, self._root, self._target, self._request.environ,
                                       rocm=self._request.rocm)
        return self._found[kind]


@dataclass(frozen=True)
class Needed:
    """A `[[depends]]` rule that holds: the dependency's own context (built or planned here), or
    an existing rocforge build of it used as it is."""

    rule: recipes.Rule
    because: str
    request: Request
    context: BuildContext | None
    built: Built | None = None

    @property
    def prefix(self) -> Path:
        return self.context.prefix if self.context is not None else self.built.prefix

    @property
    def stamp(self) -> str:
        return self.context.stamp if self.context is not None else self.built.stamp


@dataclass(frozen=True)
class Dependencies:
    needed: tuple[Needed, ...] = ()
    include_dirs: tuple[Path, ...] = ()  # the headers this build's own checks then see
    after_fetch: tuple[conditions.AfterFetch, ...] = ()  # what only an unread source decides


@dataclass(frozen=True, eq=False)
class BuildContext:
    request: Request
    root: object  # rootfs.Root: the inspected host
    recipe: recipes.Recipe
    target: targets.Target | None
    source: sources.Source
    toolchains: Toolchains
    fetched: sources.Fetched | None = None  # None: the source is not read yet
    stack: tuple[str, ...] = ()  # the recipes that depend on this one (a cycle is an error)

    @classmethod
    def of(cls, request: Request, root, *, stack: tuple[str, ...] = ()) -> BuildContext:
        recipe = recipes.load(request.recipe)
        target = target_of(recipe, request)
        source = sources.source_for(recipe, ref=request.ref, source=request.source)
        return cls(request, root, recipe, target, source,
                   Toolchains(root, target.name if target else "", request), stack=stack)

    # -- the source --------------------------------------------------------------------------

    def read(self) -> BuildContext:
        """This context with its source fetched (cached by identity: a git source asks its
        server once, here)."""
        if self.fetched is not None and self.fetched.read:
            return self
        known = self.fetched.identity if self.fetched is not None else ""
        try:
            return self._with(self.source.fetch(known or self.source.identify()))
        except NetworkError as exc:  # the download's own hint names listing options a build lacks
            raise NetworkError(exc.message, "a build downloads its source only to compile it: give a "
                               "local copy (--source PATH), or take the build from a substitute store, "
                               "which needs no source (`--substitute-only`; docs: Share verified builds)"
                               ) from None

    def identified(self) -> BuildContext:
        """This context with its source's identity but not yet its tree, where the identity is
        known without a download (a pinned sha256, the commit a ref names: one `git ls-remote`,
        a tree in the cache or on this host): the up-to-date check, the substitute key and a
        store's pull need no more.  Read when only the tree can say which backend is built,
        which dependencies it needs or where the prefix is."""
        if self.fetched is not None:
            return self
        identity = self.source.identify() if self.source.remote else ""
        if not identity:  # a local tree is read in place; an unpinned tarball only by its download
            return self.read()
        ctx = self._with(self.source.identified(identity))
        if ctx.source_read:
            return ctx
        if ctx.backend.alternatives or any(a.rule in ("depends", "headers")
                                           for a in ctx.dependencies.after_fetch):
            return ctx.read()
        return ctx

    def read_cached(self) -> BuildContext:
        """A dry run's: the source as far as it is on this machine, never a download."""
        if self.fetched is not None:
            return self
        return self._with(self.source.without_download())

    def _with(self, fetched: sources.Fetched) -> BuildContext:
        ctx = replace(self, fetched=fetched)
        if fetched.read:
            self.source.check_version(self.recipe.name, ctx.source_version)
        return ctx

    @property
    def source_read(self) -> bool:
        return self.fetched is not None and self.fetched.read

    @property
    def pinned_version(self) -> str | None:
        """The version of the recipe's own pinned tarball, known before it is read."""
        return self.source.pinned_version

    @cached_property
    def source_version(self) -> str | None:
        return source_version(self.recipe, self.fetched) if self.source_read else None

    @cached_property
    def source_facts(self) -> conditions.SourceFacts | None:
        return conditions.SourceFacts(self.fetched.tree, self.source_version) if self.source_read else None

    # -- facts, backend, prefix ----------------------------------------------------------------

    @property
    def target_name(self) -> str:
        return self.target.name if self.target else ""

    @cached_property
    def cpu_flags(self) -> frozenset[str] | None:
        return conditions.cpu_flags(self.root)

    def facts(self, backend: str, include_dirs: tuple[Path, ...] = ()) -> conditions.Facts:
        """The facts a backend is judged by; `include_dirs` (dependencies' headers) first."""
        tc = self.toolchains[self.recipe.backends[backend].toolchain]
        return conditions.Facts(  # no target (None): a CPU or Vulkan build for no GPU target
            target=self.target.name if self.target else None,
            families=self.target.therock_groups if self.target else (), backend=backend,
            rocm_version=tc.rocm_version, source=self.source_facts,
            host=conditions.HostFacts(
                include_dirs=(*include_dirs, *tc.include_dirs), path=tc.path,
                probe_glslc=tc.probe_glslc, cpu_flags=self.cpu_flags,
                rocm_root=Path(tc.env["ROCM_PATH"]) if tc.env.get("ROCM_PATH") else None),
            toolchain_found=tc.missing is None, rocblas_hipblaslt=tc.rocblas_hipblaslt,
            pinned_version=self.pinned_version)

    @cached_property
    def backend(self) -> BackendChoice:
        """--backend, else the recipe's `[[default]]` rules over these facts; before the source
        is read, as far as the rules decide without it."""
        if self.source_read:
            return choose_backend(self.recipe, self.request.backend, self.facts)
        return backend_without_source(self.recipe, self.request.backend, self.facts)

    @property
    def toolchain(self) -> Toolchain:
        return self.toolchains[self.recipe.backends[self.backend.name].toolchain]

    @cached_property
    def prefix(self) -> Path:
        if self.request.prefix:
            return Path(self.request.prefix).expanduser().resolve()
        kind = self.recipe.backends[self.backend.name].toolchain
        return default_prefix(self.recipe.name, self.target_name, self.backend.name, kind)

    # -- dependencies and the stamp --------------------------------------------------------------

    @cached_property
    def dependencies(self) -> Dependencies:
        """Each `[[depends]]` rule that holds, with the dependency's context read as this one is
        (fetched for a build, from the cache for a dry run), or the existing build it uses."""
        facts = self.facts(self.backend.name)
        needed: list[Needed] = []
        after_fetch: list[conditions.AfterFetch] = []
        for rule in self.recipe.of("depends"):
            verdict = conditions.judge_rule(rule, facts, "depends", rule.get("recipe"),
                                            reason=rule.get("reason"),
                                            evidence=rule.get("evidence"))
            if verdict.after_fetch:
                after_fetch.append(verdict.after_fetch)
            if verdict.holds:
                needed.append(self._dependency(rule, verdict.why))
        includes: list[Path] = []
        for item in needed:
            headers = item.rule.get("source_include")
            if (item.prefix / "include").is_dir():
                includes.append(item.prefix / "include")
            elif item.context is None or not headers:
                continue
            elif not item.context.source_read:
                after_fetch.append(conditions.AfterFetch(
                    rule="headers", name=item.context.recipe.name, reason=item.rule.get("reason"),
                    when=f"{headers} of its source (not fetched) is read after its fetch: "
                         "until then the header checks above read the toolchain's"))
            else:
                includes.append(item.context.fetched.tree / headers)
        return Dependencies(tuple(needed), tuple(includes), tuple(after_fetch))

    def _dependency(self, rule: recipes.Rule, why: str) -> Needed:
        name = rule.get("recipe")
        beside = self.recipe.path.parent / (name if name.endswith(".toml") else f"{name}.toml")
        request = self.request.for_dependency(str(beside) if beside.is_file() else name,
                                              rule.get("backend"))
        cycle = ConfigError(f"recipe {self.recipe.name}: dependency cycle "
                            f"{' -> '.join((*self.stack, self.recipe.name, name))}")
        if name in self.stack:
            raise cycle
        dep = BuildContext.of(request, self.root, stack=(*self.stack, self.recipe.name))
        if dep.recipe.name in self.stack:
            raise cycle
        built = existing_build(dep.recipe.name, request.target) if rule.get("use_existing") else None
        if built is not None:
            because = (f"{why}; the existing rocforge {dep.recipe.name} build for {request.target} "
                       f"at {built.prefix} (from {built.source}, {built.built_at}) is used as it "
                       f"is, nothing is fetched; `rocforge build {dep.recipe.name} --target "
                       f"{request.target}` replaces it")
            return Needed(rule, because, request, None, built)
        dep = dep.read() if self.source_read else dep.read_cached()
        if rule.get("use_existing"):
            from rocforge_build import paths

            why += (f"; no rocforge {dep.recipe.name} build for {request.target} in "
                    f"{paths.builds_prefix()}: one is built from {dep.source.location}")
        return Needed(rule, why, request, dep)

    @cached_property
    def stamp(self) -> str:
        """Over every input that decides the build (recipe text, patch files, source identity,
        request, toolchain, the user's build environment) and the dependencies' stamps; "" for
        an unread source whose identity only the download gives."""
        fetched = self.fetched
        own = self._own_stamp() if fetched is not None and (fetched.read or fetched.identity) else ""
        dep_stamps = [d.stamp for d in self.dependencies.needed]
        if not dep_stamps:
            return own
        return hashlib.sha256(json.dumps([own, dep_stamps]).encode()).hexdigest()

    def _own_stamp(self) -> str:
        recipe, req = self.recipe, self.request
        patches_dir = recipe.patches_dir
        parts = {
            "rocforge": __version__,
            "recipe": recipe.text,
            "patches": {p.name: sha256_file(p) for p in sorted(patches_dir.glob("*.patch"))}
            if patches_dir.is_dir() else {},
            "identity": self.fetched.identity,
            "target": req.target,
            "backend": self.backend.name,
            "no_cache": req.no_cache,
            "build_targets": list(req.build_targets),
            "prefix": str(self.prefix),
            "toolchain": self.toolchain.to_json(),
            "host": host_identity(req.environ),
            "environ": {k: req.environ.get(k) for k in BUILD_ENV},
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    @cached_property
    def substitute_key(self) -> tuple[SubstituteKey | None, str]:
        """(the key a substitute store names this build by, "") or (None, why it has none)."""
        source, fetched = self.source, self.fetched
        if fetched is None or not fetched.identity:
            return None, "the source's identity is known only after it is downloaded"
        kind, identity = source.kind, fetched.identity
        if isinstance(source, sources.LocalSource):  # named by its commit or contents, not its stats
            try:
                kind, identity = source.shared_identity(fetched)
            except sources.NotNameable as exc:
                return None, f"the local tree {source.location}: {exc}"
        deps = []
        for dep in self.dependencies.needed:
            if dep.context is None:
                deps.append({"recipe": dep.request.recipe, "existing_build": dep.built.stamp})
                continue
            key, why = dep.context.substitute_key
            if key is None:
                return None, f"its dependency {dep.request.recipe}: {why}"
            deps.append({"recipe": dep.request.recipe, "key": key.digest})
        req = self.request
        return SubstituteKey.of_fields(key_fields(
            recipe=self.recipe, source_kind=kind, identity=identity,
            target=req.target or "", backend=self.backend.name, build_targets=req.build_targets,
            toolchain=self.toolchain, environ=req.environ, cpu_flags=self.cpu_flags,
            dependencies=deps)), ""

    @cached_property
    def substitute_policy(self) -> SubstitutePolicy:
        return SubstitutePolicy.from_settings(self.request.substitutes, self.request.settings)



def preflight(context: BuildContext) -> None:
    """What `rocforge build` (and its dry run) checks before the source is downloaded or
    unpacked: a user prefix rocforge may not replace, then no toolchain for any backend the
    build could choose, or a `[[stop]]` that holds whatever the source says.  A local tree is
    read in place: nothing to spare, no check."""
    if context.source.kind == "local":
        return
    if context.request.prefix:
        from rocforge_build import replace as swap

        swap.check_replaceable(Path(context.request.prefix).expanduser().resolve(), MANIFEST,
                               "--prefix", path_list=True)
    check_before_fetch(context.recipe, context.request.backend, context.facts,
                       context.toolchains.__getitem__)


def target_of(recipe: recipes.Recipe, req: Request) -> targets.Target | None:
    """The request's GPU target; None for a build whose backend needs none (`--backend cpu` or
    `vulkan` where no GPU is given or detected: their toolchains compile for no GPU target)."""
    if req.target:
        return targets.get_target(req.target)
    backend = recipe.backends.get(req.backend or "")
    if backend is None or backend.toolchain == "hip":
        raise UsageError("no GPU target was given and none was detected", targets.choices_hint())
    return None


def needs_gpu_target(recipe_ref: str, backend: str | None) -> bool:
    """Whether a build of the recipe with this backend (None: the recipe's choice) needs one."""
    be = recipes.load(recipe_ref).backends.get(backend or "")
    return be is None or be.toolchain == "hip"


def source_version(recipe: recipes.Recipe, fetched: sources.Fetched) -> str | None:
    """The version the recipe's `[source] version` probes read from the tree (git describe, a
    version file); None when none says."""
    for probe in recipe.source.version:
        if probe.get("git") == "describe":
            if (fetched.root / ".git").exists():
                res = run(["git", "-C", fetched.root, "describe", "--tags"], check=False)
                if res.returncode == 0:
                    return res.stdout.strip()
            if fetched.spec.ref_name:  # fetched from git by a tag or branch (exported without .git)
                return fetched.spec.ref_name
        if "file" in probe:
            f = fetched.root / probe["file"]
            if f.is_file():
                m = re.search(probe.get("regex", r"(.+)"), f.read_text(errors="replace"), re.M)
                if m:  # several groups (major, minor, patch on separate lines) join with dots
                    return ".".join(g.strip() for g in m.groups() if g) if m.re.groups > 1 \
                        else m.group(1).strip()
    return None
