"""The build plan: everything a build will do, computed once, before anything runs.

`make_plan()` is a short sequence of named steps over the request's facts (backend and stops,
placeholders, options, environment, private venv, patches, commands, stamp); its `Plan` is what
`rocforge build --dry-run --json` prints and what `pipeline.execute()` carries out.  The stamp
covers every input (recipe text, patch files, source identity, request, toolchain, the user's
build environment) so an identical second build is recognised without planning (`quick_check`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import __version__, paths
from rocforge_build.discover import targets
from rocforge_build.discover.builds import read_manifest
from rocforge_build.download import sha256_file
from rocforge_build.errors import ConfigError, ToolchainError, UsageError
from rocforge_build.forge import conditions, patches, recipes, sources
from rocforge_build.forge.backend_choice import (
    backend_without_source,
    check_before_fetch,
    choose_backend,
    facts_maker,
)
from rocforge_build.forge.parallel import Parallel, for_plan
from rocforge_build.forge.plan_deps import (  # noqa: F401 - Built, existing_build: plan's API
    Built,
    Dependency,
    dependency_requests,
    existing_build,
    plan_dependencies,
)
from rocforge_build.forge.toolchains import GLSLC_FEATURES, Toolchain, host_identity
from rocforge_build.proc import run

MANIFEST = "rocforge-manifest.toml"
# the user's environment that changes what CMake builds (part of the stamp)
BUILD_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "HIPFLAGS", "HIPCXX",
             "VULKAN_SDK", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH")


@dataclass(frozen=True)
class Request:
    recipe: str
    target: str
    backend: str | None = None
    ref: str | None = None
    source: str | None = None
    prefix: str | None = None
    jobs: int | None = None
    force: bool = False
    no_cache: bool = False
    distribute: bool = False
    build_targets: tuple[str, ...] = ()
    environ: Mapping[str, str] | None = None
    rocm: str | None = None  # --rocm: the ROCm installation to build with


@dataclass
class Plan:
    recipe: recipes.Recipe
    target: str
    backend: str
    backend_reason: str
    source: sources.Fetched
    toolchain: Toolchain
    options: list[dict]  # {name, value, reason}
    env: dict[str, str]  # configure + build environment additions
    runtime_env: dict[str, str]
    env_reasons: dict[str, str]
    patches: list[patches.PatchPlan]
    patch_status: list[patches.PatchResult]
    notes: list[str]
    configure: list[str]
    build: list[str]
    install: list[str]
    smoke: list[list[str]]
    prefix: Path
    work: Path
    stamp: str
    launcher: str | None
    build_targets: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    dependencies: list[Dependency] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)  # {path, reason, because}
    export_env: dict[str, str] = field(default_factory=dict)  # what `rocforge env` exports
    venv: dict | None = None  # {path, requirements, packages, commands, reason}
    parallel: Parallel | None = None  # compiler cache, distribution, -j (forge/parallel.py)
    # a dry run of a source it did not download: every rule only the source decides, with the
    # condition ({rule, name, when, ...}), and the other backends the source may choose
    after_fetch: list[dict] = field(default_factory=list)
    backend_alternatives: tuple[str, ...] = ()

    @property
    def src_dir(self) -> Path:
        return project_dir(self.work, self.source.spec)

    @property
    def build_dir(self) -> Path:
        return self.work / "build"

    @property
    def log(self) -> Path:
        return self.work / "rocforge-build.log"

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.name,
            "recipe_path": str(self.recipe.path),
            "target": self.target,
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "source": self.source.to_json(),
            "patches": [p.to_json() for p in self.patch_status],
            "options": self.options,
            "configure": self.configure,
            "build": self.build,
            "install": self.install,
            "smoke": self.smoke,
            "env": self.env,
            "env_reasons": self.env_reasons,
            "runtime_env": self.runtime_env,
            "toolchain": self.toolchain.to_json(),
            "compiler_launcher": self.launcher,
            "notes": self.notes,
            "prefix": str(self.prefix),
            "work_dir": str(self.work),
            "log": str(self.log),
            "stamp": self.stamp,
            "dependencies": [d.to_json() for d in self.dependencies],
            "outputs": self.outputs,
            "export_env": self.export_env,
            "venv": self.venv,
            **(self.parallel.to_json() if self.parallel else {}),
            **({"after_fetch": self.after_fetch} if not self.source.read else {}),
            **({"backend_alternatives": list(self.backend_alternatives)}
               if self.backend_alternatives else {}),
        }


# -- the plan: named steps, one concern each ------------------------------------------------------

def make_plan(req: Request, root, *, check_patches: bool = True, fetch: bool = True,
              _stack: tuple[str, ...] = ()) -> Plan:
    """Plan a build: each step below has one concern and reads the facts of this request.
    `fetch=False` (a dry run): nothing is downloaded; a remote source that is not in the cache is
    not read, and what only it decides is listed in `after_fetch` with its condition."""
    (recipe, tgt, environ, fetched, backend, backend_reason, toolchain, facts, prefix,
     others) = _prepare(req, root, fetch=fetch)
    pending: list[dict] = []
    _rocm_fact(facts, toolchain)
    deps = plan_dependencies(recipe, req, facts, root, check_patches, _stack, fetch, pending)
    be = recipe.backends[backend]
    target = tgt.name if tgt else ""  # "": a CPU or Vulkan build for no GPU target
    notes = _backend_and_stops(recipe, backend, facts, target, toolchain, pending, others)
    work = work_dir(prefix)
    ctx = _placeholders(recipe, fetched, target, backend, prefix, toolchain, work)
    par = for_plan(recipe.of("jobs"), facts, root=root, requested_jobs=req.jobs,
                         no_cache=req.no_cache, distribute=req.distribute, kind=be.toolchain,
                         work=work, environ=environ)
    launcher = par.launcher
    ctx.update(jobs=str(par.jobs.jobs), tensile_cpu_threads=str(par.jobs.tensile_threads))
    notes += par.notes
    build_targets = tuple(req.build_targets) or recipe.build_targets
    options = _options(recipe, req, facts, ctx, toolchain, be.toolchain, launcher,
                       par.hip_launcher, pending) + par.options
    env, env_reasons, runtime_env, export_env = _environment(
        recipe, facts, ctx, toolchain, be.toolchain, par, environ, deps, pending)
    venv = _private_venv(recipe, fetched, work, env, env_reasons, environ)
    patch_plans, patch_status = _patches(recipe, facts, fetched, check_patches, pending)
    configure, build, install = _commands(recipe, par.build_jobs, fetched, work, prefix, options,
                                          build_targets)
    smoke = [list(r.get("run")) for r in recipe.of("smoke")
             if _applies(r, facts, pending, "smoke", " ".join(r.get("run")))[0]]
    stamp = (_inputs_stamp(recipe, req, fetched.identity, toolchain, prefix, backend, environ)
             if fetched.read or fetched.identity else "")  # "": the download gives the identity
    return Plan(recipe, target, backend, backend_reason, fetched, toolchain, options, env,
                runtime_env, env_reasons, patch_plans, patch_status, notes, configure, build,
                install, smoke, prefix, work, _with_deps(stamp, [d.stamp for d in deps]),
                launcher, build_targets, dependencies=deps,
                outputs=_outputs(recipe, facts, ctx, pending), export_env=export_env, venv=venv,
                parallel=par, after_fetch=pending, backend_alternatives=others)


def _applies(rule: recipes.Rule, facts: conditions.Facts, pending: list[dict], kind: str,
             name: str, **extra) -> tuple[bool, str]:
    """Whether a rule applies, and why.  One only the unread source can decide (a dry run
    downloads nothing) does not apply in the plan: it goes to `pending` with its condition."""
    holds, why = conditions.judge(rule.when, facts)
    if holds is None:
        pending.append({"rule": kind, "name": name, "when": why,
                        **{k: v for k, v in extra.items() if v is not None}})
        return False, why
    return holds, why


def work_dir(prefix: Path) -> Path:
    """The work area of the build that installs into `prefix`: source copy, build dir, log."""
    return paths.cache_dir() / "work" / hashlib.sha256(str(prefix).encode()).hexdigest()[:12]


def staging_dir(prefix: Path) -> Path:
    """Where the install goes before it replaces `prefix` (a sibling: the swap is a rename)."""
    return Path(f"{prefix}.rocforge-new")


def destdir(prefix: Path) -> Path:
    """`DESTDIR` of recipes that install with `ninja install`; moved to the staging dir after."""
    return Path(f"{prefix}.rocforge-destdir")


def venv_dir(work: Path) -> Path:
    """The recipe's private virtual environment, in the build dir (`{venv}` in recipe values)."""
    return work / "build" / "venv"


def project_dir(work: Path, spec: sources.SourceSpec) -> Path:
    """The CMake project in the work copy; a sparse monorepo checkout is copied whole (its
    projects reach into ../../shared/...) and the project is its subdirectory."""
    if spec.sparse and spec.subdir:
        return work / "src" / spec.subdir
    return work / "src"


def _backend_and_stops(recipe: recipes.Recipe, backend: str, facts: conditions.Facts,
                       target: str, toolchain: Toolchain, pending: list[dict],
                       others: tuple[str, ...] = ()) -> list[str]:
    """Refuse a backend the source lacks and every `[[stop]]` that holds; return the notes.
    With `others` (the source may still choose another backend) a stop of this one is not the
    build's: it is listed for after the fetch, as a missing toolchain of this backend is."""
    be = recipe.backends[backend]
    ok, why = conditions.judge(be.when, facts)
    if ok is None:  # the source decides whether it has the backend
        pending.append({"rule": "backend", "name": backend, "when": why,
                        **({"message": be.unavailable} if be.unavailable else {})})
    elif not ok and others:  # the source may choose another backend: not the build's error yet
        pending.append({"rule": "refused", "name": backend, "when": f"the source makes the backend "
                        f"{backend} ({why})",
                        **({"message": be.unavailable} if be.unavailable else {})})
    elif not ok:
        raise UsageError(
            f"backend {backend} is not available for this source: {why}"
            + (f". {be.unavailable}" if be.unavailable else ""), be.hint)
    chosen = f"the source makes the backend {backend}"
    for rule in recipe.of("stop"):
        hint = rule.get("hint")
        hint = hint.replace("{target}", target) if hint else None
        holds, why = _applies(rule, facts, pending, "stop", rule.get("message"), hint=hint)
        if holds and others:
            pending.append({"rule": "stop", "name": rule.get("message"), "when": f"{chosen} ({why})",
                            **({"hint": hint} if hint else {})})
        elif holds:
            raise ToolchainError(f"{rule.get('message')} ({why})", hint)
    if others and toolchain.missing:
        pending.append({"rule": "toolchain", "name": be.toolchain, "when": chosen,
                        "message": toolchain.missing, **({"hint": toolchain.hint} if toolchain.hint else {})})
    notes = []
    for rule in recipe.of("note"):
        holds, why = _applies(rule, facts, pending, "note", rule.get("message").replace("{target}", target))
        if holds:
            notes.append(rule.get("message").replace("{target}", target))
    if be.toolchain == "vulkan" and toolchain.glslc:
        lacking = [desc for ext, desc in GLSLC_FEATURES.items() if not facts.host.glslc_extension(ext)]
        if lacking:
            notes.append(f"glslc ({toolchain.glslc}) cannot compile: {'; '.join(lacking)} — "
                         "those shaders are left out (slower on GPUs that have them); a newer "
                         "glslc/shaderc (Vulkan SDK) enables them")
    return notes


def _placeholders(recipe: recipes.Recipe, fetched: sources.Fetched, target: str, backend: str,
                  prefix: Path, toolchain: Toolchain, work: Path) -> dict:
    """The `{name}` values recipe options, env and outputs may use."""
    ctx = {"target": target, "backend": backend, "prefix": str(prefix),
           "hip_clang_dir": (str(Path(toolchain.env["HIPCXX"]).parent) if "HIPCXX" in toolchain.env
                             else "<no HIP toolchain>"),
           **toolchain.env}
    ctx.update(_source_placeholders(recipe, fetched, work))
    return ctx


def _options(recipe: recipes.Recipe, req: Request, facts: conditions.Facts, ctx: dict,
             toolchain: Toolchain, kind: str, launcher: str | None,
             hip_launcher: str | None = None, pending: list[dict] | None = None) -> list[dict]:
    """The -D options ({name, value, reason, because}): the recipe's rules (a later rule of the
    same name wins), what the toolchain implies, the compiler launcher, partial-build RPATH."""
    chosen: dict[str, dict] = {}
    pending = [] if pending is None else pending
    for rule in recipe.of("option"):
        name = rule.get("name")
        holds, why = _applies(rule, facts, pending, "option", name,
                              value=_fmt(rule.get("value"), ctx), reason=rule.get("reason"))
        if not holds:
            continue
        if rule.get("declared", True) and facts.source is None:  # checked once it is read
            pending.append({"rule": "declared", "name": name, "when": f"the source declares {name}"})
        elif rule.get("declared", True) and name not in facts.source.cmake_options:
            raise ConfigError(
                f"recipe {recipe.name}: option {name} is not declared by the source "
                f"({facts.source.tree}); CMake would ignore it silently",
                "give the option a `when` on `cmake_option` so it is passed only to trees that have it")
        chosen[name] = {"name": name, "value": _fmt(rule.get("value"), ctx),
                        "reason": rule.get("reason"), "because": why}
    for name, value in toolchain.defines.items():
        chosen.setdefault(name, {"name": name, "value": value, "reason": "found by toolchain detection",
                                 "because": kind})
    langs = ["C", "CXX"] + (["HIP"] if kind == "hip" else [])
    if launcher:
        for lang in langs:
            value = hip_launcher or launcher if lang == "HIP" else launcher
            chosen[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = {
                "name": f"CMAKE_{lang}_COMPILER_LAUNCHER", "value": value,
                "reason": "compiler cache (disable with --no-cache)" if value == launcher else
                "compiler cache, on a local-only sccache server: sccache-dist cannot compile HIP "
                "(see the plan's note)", "because": "found on PATH"}
    if req.build_targets:
        chosen["CMAKE_BUILD_WITH_INSTALL_RPATH"] = {
            "name": "CMAKE_BUILD_WITH_INSTALL_RPATH", "value": "ON", "because": "--build-target",
            "reason": "a partial build is installed by copying artifacts, so they carry the install RPATH"}
    return list(chosen.values())


def _environment(recipe: recipes.Recipe, facts: conditions.Facts, ctx: dict, toolchain: Toolchain,
                 kind: str, par: Parallel, environ: Mapping[str, str],
                 deps: list[Dependency], pending: list[dict]) -> tuple[dict, dict, dict, dict]:
    """(build env, reasons, runtime env, export env): the toolchain's variables, the compiler
    cache's and distribution's (forge/parallel.py), the recipe's `[[env]]` rules by stage,
    dependencies' prefixes in front."""
    env: dict[str, str] = dict(toolchain.env)
    env_reasons = {k: f"{kind} toolchain" for k in toolchain.env}
    env.update(par.env)
    env_reasons.update(par.reasons)
    runtime_env: dict[str, str] = {}
    export_env: dict[str, str] = {}
    for rule in recipe.of("env"):
        holds, why = _applies(rule, facts, pending, "env", rule.get("name"),
                              value=_fmt(rule.get("value"), ctx), reason=rule.get("reason"),
                              stage=rule.get("stage"))
        if not holds:
            continue
        stage = rule.get("stage", "configure")
        target_env = {"runtime": runtime_env, "export": export_env}.get(stage, env)
        target_env[rule.get("name")] = _fmt(rule.get("value"), ctx)
        env_reasons[rule.get("name")] = rule.get("reason")
        if stage == "export" and rule.when:
            env_reasons[rule.get("name")] += f" ({why})"
    for dep in deps:  # dependencies' prefixes go in front of their variables
        for var, sub in dep.prepend.items():
            entry = str(dep.prefix if sub in ("", ".") else dep.prefix / sub)
            rest = env.get(var, environ.get(var, ""))
            env[var] = entry + (os.pathsep + rest if rest else "")
            env_reasons[var] = f"dependency {dep.recipe}: {dep.reason}"
    return env, env_reasons, runtime_env, export_env


def _private_venv(recipe: recipes.Recipe, fetched: sources.Fetched, work: Path, env: dict,
                  env_reasons: dict, environ: Mapping[str, str]) -> dict | None:
    """The recipe's `[venv]` in the build dir, and the VIRTUAL_ENV/PATH it adds to `env`."""
    if recipe.venv is None:
        return None
    venv = venv_dir(work)
    py = venv / "bin" / "python"
    project = project_dir(work, fetched.spec)
    reqs = [str(project / r) for r in recipe.venv.get("requirements", [])]
    commands = [[sys.executable, "-m", "venv", str(venv)]]
    pkgs = [a for r in reqs for a in ("-r", r)] + list(recipe.venv.get("packages", []))
    if pkgs:
        commands.append([str(py), "-m", "pip", "install", "--disable-pip-version-check", *pkgs])
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", environ.get("PATH", ""))
    env_reasons["VIRTUAL_ENV"] = env_reasons["PATH"] = f"private venv: {recipe.venv['reason']}"
    return {"path": str(venv), "requirements": reqs,
            "packages": list(recipe.venv.get("packages", [])), "commands": commands,
            "reason": recipe.venv["reason"]}


def _patches(recipe: recipes.Recipe, facts: conditions.Facts, fetched: sources.Fetched,
             check: bool, pending: list[dict]) -> tuple[list[patches.PatchPlan], list[patches.PatchResult]]:
    """Every `[[patch]]` with whether it applies and why; checked against the pristine tree (an
    unread one leaves both to after the fetch)."""
    plans, open_ = [], set()
    for rule in recipe.of("patch"):
        name = rule.get("file")
        holds, why = conditions.judge(rule.when, facts)
        if holds is None:  # only the source decides: after the fetch
            pending.append({"rule": "patch", "name": name, "when": why, "reason": rule.get("reason")})
            open_.add(name)
            reason = f"{rule.get('reason')} (if {why})"
        else:
            reason = f"{rule.get('reason')} ({why})" if holds else why
        plans.append(patches.PatchPlan(name, recipe.patches_dir / name, bool(holds), reason))
    if not fetched.read:
        return plans, patches.unread(plans, open_) if check else []
    return plans, (patches.check(plans, fetched.tree) if check else [])


def _commands(recipe: recipes.Recipe, jobs: int, fetched: sources.Fetched, work: Path,
              prefix: Path, options: list[dict], build_targets: tuple[str, ...]
              ) -> tuple[list[str], list[str], list[str]]:
    """The configure, build and install command lines (install into the staging sibling)."""
    configure = ["cmake", "-S", str(project_dir(work, fetched.spec)), "-B", str(work / "build"),
                 "-G", "Ninja", f"-DCMAKE_INSTALL_PREFIX={prefix}"]
    configure += [f"-D{o['name']}={o['value']}" for o in options]
    build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), *build_targets]
    staging = str(staging_dir(prefix))
    install = ["cmake", "--install", str(work / "build"), "--prefix", staging]
    if recipe.install == "ninja":
        build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), "install"]
        install = [f"(`ninja install` with DESTDIR={destdir(prefix)}, moved to)", staging]
    elif build_targets:
        install = ["(copy artifacts of)", *build_targets, "->", staging]
    return configure, build, install


def _outputs(recipe: recipes.Recipe, facts: conditions.Facts, ctx: dict,
             pending: list[dict]) -> list[dict]:
    out = []
    for rule in recipe.of("output"):
        holds, why = _applies(rule, facts, pending, "output", _fmt(rule.get("path"), ctx),
                              reason=rule.get("reason"))
        if holds:
            out.append({"path": _fmt(rule.get("path"), ctx), "reason": rule.get("reason"),
                        "because": why})
    return out


def _inputs_stamp(recipe: recipes.Recipe, req: Request, identity: str, toolchain: Toolchain,
                  prefix: Path, backend: str, environ: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    parts = {
        "rocforge": __version__,
        "recipe": recipe.text,
        "patches": {p.name: sha256_file(p)
                    for p in sorted(recipe.patches_dir.glob("*.patch"))} if recipe.patches_dir.is_dir() else {},
        "identity": identity,
        "target": req.target,
        "backend": backend,
        "no_cache": req.no_cache,
        "build_targets": list(req.build_targets),
        "prefix": str(prefix),
        "toolchain": toolchain.to_json(),
        "host": host_identity(environ),
        "environ": {k: environ.get(k) for k in BUILD_ENV},
    }
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _with_deps(stamp: str, dep_stamps: list[str]) -> str:
    """A build's stamp covers its dependencies' stamps: a rebuilt dependency rebuilds it."""
    if not dep_stamps:
        return stamp
    return hashlib.sha256(json.dumps([stamp, dep_stamps]).encode()).hexdigest()


# -- what the steps start from: recipe, source, backend, toolchain, dependencies ------------------

def preflight(req: Request, root) -> None:
    """What `rocforge build` (and its dry run) checks before the source is downloaded or
    unpacked: a user prefix rocforge may not replace, then `check_before_fetch`.  A local tree
    is read in place: nothing to spare, no check."""
    recipe = recipes.load(req.recipe)
    tgt = target_of(recipe, req)
    spec = sources.spec_for(recipe, ref=req.ref, source=req.source)
    if spec.kind == "local":
        return
    environ = dict(os.environ if req.environ is None else req.environ)
    toolchains: dict[str, Toolchain] = {}
    if req.prefix:
        from rocforge_build import replace

        replace.check_replaceable(Path(req.prefix).expanduser().resolve(), MANIFEST, "--prefix",
                                  path_list=True)
    known = _pinned(recipe, spec)
    check_before_fetch(recipe, req, facts_maker(recipe, tgt, root, environ, req, toolchains, known),
                       toolchains)


def _prepare(req: Request, root, *, fetch: bool = True):
    """Recipe, target, fetched source, backend choice, toolchain and facts: the shared start of
    a plan and of the no-op check (the fetch is a cache hit after the first build).  Without
    `fetch` (a dry run) a remote source is read only from the cache; unread, the backend is
    chosen as far as the rules decide without it (the last item: the others it may be)."""
    recipe = recipes.load(req.recipe)
    tgt = target_of(recipe, req)
    environ = dict(os.environ if req.environ is None else req.environ)
    spec = sources.spec_for(recipe, ref=req.ref, source=req.source)
    toolchains: dict[str, Toolchain] = {}
    known = _pinned(recipe, spec)
    facts_for = facts_maker(recipe, tgt, root, environ, req, toolchains, known)
    fetched = sources.fetch(spec, sources.identify(spec)) if fetch else sources.without_download(spec)
    others: tuple[str, ...] = ()
    if fetched.read:
        version = source_version(recipe, fetched)
        _check_pinned(recipe, spec, version)
        known["source"] = conditions.SourceFacts(fetched.tree, version)
        backend, backend_reason = choose_backend(recipe, req, facts_for)
    else:
        backend, backend_reason, others = backend_without_source(recipe, req, facts_for)
    facts = facts_for(backend)
    toolchain = toolchains[recipe.backends[backend].toolchain]
    prefix = (Path(req.prefix).expanduser().resolve() if req.prefix
              else default_prefix(recipe.name, tgt.name if tgt else "", backend,
                                  recipe.backends[backend].toolchain))
    return recipe, tgt, environ, fetched, backend, backend_reason, toolchain, facts, prefix, others


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


def _pinned(recipe: recipes.Recipe, spec: sources.SourceSpec) -> dict:
    """What is known of the source before it is read: the version of the recipe's pinned tarball
    (`[source] pinned_version`; its sha256 fixes the tree), which decides `source_version`."""
    if recipe.source.pinned_version and sources.is_pinned(recipe, spec):
        return {"pinned_version": recipe.source.pinned_version}
    return {}


def _check_pinned(recipe: recipes.Recipe, spec: sources.SourceSpec, version: str | None) -> None:
    """The pinned tarball's tree must say the version the recipe declares for it: that version
    decided conditions before the download."""
    pinned = recipe.source.pinned_version
    if pinned and sources.is_pinned(recipe, spec) and version != pinned:
        raise ConfigError(
            f"recipe {recipe.name}: source.pinned_version is {pinned}, but the pinned tarball "
            f"({spec.location}) says {version or 'no version'}",
            "set pinned_version to the tarball's version (it decides `source_version` conditions "
            "before the download)")


def default_prefix(recipe: str, target: str, backend: str, toolchain: str = "hip") -> Path:
    """`<recipe>-<target>-<backend>` for a HIP build (it runs on its one GPU target);
    `<recipe>-<backend>` for a host (CPU) or Vulkan build, which runs on any GPU or none — but the
    `<recipe>-<target>-<backend>` such a build had before, where it is and the new name is not, so
    that it is rebuilt in place, never beside itself."""
    base = paths.builds_prefix()
    named = base / f"{recipe}-{target}-{backend}"
    if toolchain == "hip":
        return named
    unnamed = base / f"{recipe}-{backend}"
    if target and not unnamed.exists() and (named / MANIFEST).is_file():
        return named
    return unnamed


def _rocm_fact(facts: conditions.Facts, toolchain: Toolchain) -> None:
    """`rocm_file` conditions look in the HIP toolchain's ROCm tree."""
    if facts.host is not None and toolchain.env.get("ROCM_PATH"):
        facts.host.rocm_root = Path(toolchain.env["ROCM_PATH"])


def source_version(recipe: recipes.Recipe, fetched: sources.Fetched) -> str | None:
    for probe in recipe.source.version:
        if probe.get("git") == "describe":
            if (fetched.root / ".git").exists():
                res = run(["git", "-C", fetched.root, "describe", "--tags"], check=False)
                if res.returncode == 0:
                    return res.stdout.strip()
            ref = fetched.spec.ref
            if fetched.spec.kind == "git" and ref and not re.fullmatch(r"[0-9a-f]{7,40}", ref):
                return ref  # a tag or branch name fetched from git (exported without .git)
        if "file" in probe:
            f = fetched.root / probe["file"]
            if f.is_file():
                m = re.search(probe.get("regex", r"(.+)"), f.read_text(errors="replace"), re.M)
                if m:  # several groups (major, minor, patch on separate lines) join with dots
                    return ".".join(g.strip() for g in m.groups() if g) if m.re.groups > 1 \
                        else m.group(1).strip()
    return None


def _source_placeholders(recipe: recipes.Recipe, fetched: sources.Fetched, work: Path) -> dict:
    """`{source_commit}`, `{source_tree}` (git tree sha: projects that name their build by it
    but get no .git in the work copy), `{source_root}` (the work copy's top: a monorepo's root)
    and `{venv}` for recipe values."""
    out = {"source_commit": fetched.commit or "", "source_tree": "", "source_root": str(work / "src"),
           "venv": str(venv_dir(work))}
    if "{source_tree}" in recipe.text and fetched.commit:
        where = fetched.root if (fetched.root / ".git").exists() else sources._mirror(fetched.spec.location)
        res = run(["git", "-C", where, "rev-parse", f"{fetched.commit}^{{tree}}"], check=False)
        out["source_tree"] = res.stdout.strip() if res.returncode == 0 else ""
    return out


def _fmt(value, ctx: dict) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return ";".join(sorted(_fmt(v, ctx) for v in value))
    return recipes.fill(str(value), ctx)


# -- is a build needed: the stamp without planning ------------------------------------------------

def quick_stamp(req: Request, root) -> tuple[str, Path]:
    """The stamp over every input, computed without planning, patching or running CMake."""
    recipe, _, environ, fetched, backend, _, toolchain, _, prefix, _ = _prepare(req, root)
    return _inputs_stamp(recipe, req, fetched.identity, toolchain, prefix, backend, environ), prefix


def quick_check(req: Request, root, stack: tuple[str, ...] = ()) -> tuple[str, Path, bool]:
    """(stamp, prefix, current): the quick stamp with the dependencies' folded in; current when
    the prefix's manifest has it and every dependency is current too."""
    stamp, prefix = quick_stamp(req, root)
    dep_stamps, current = [], True
    if recipes.load(req.recipe).of("depends"):  # which apply depends on the request's facts
        recipe, _, _, _, _, _, toolchain, facts, _, _ = _prepare(req, root)
        _rocm_fact(facts, toolchain)
        for rule, dep_req, _ in dependency_requests(recipe, req, facts, stack):
            built = (existing_build(recipes.load(dep_req.recipe).name, dep_req.target)
                     if rule.get("use_existing") else None)
            if built is not None:  # used as it is: its stamp is the manifest's
                dep_stamps.append(built.stamp)
                continue
            dep_stamp, _, dep_current = quick_check(dep_req, root, (*stack, recipe.name))
            dep_stamps.append(dep_stamp)
            current = current and dep_current
    stamp = _with_deps(stamp, dep_stamps)
    old = read_manifest(prefix)
    return stamp, prefix, current and bool(old) and old.get("stamp") == stamp
