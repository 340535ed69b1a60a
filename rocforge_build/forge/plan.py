"""The build plan: everything a build will do, decided from one `BuildContext` before anything
runs, and frozen.

`make_plan()` is a short sequence of named steps over the context's facts (stops and notes,
placeholders, options, environment, private venv, patches, commands, outputs); each returns what
it decided and what only the unread source decides (`after_fetch`).  Its `Plan` is what
`rocforge build --dry-run --json` prints and exactly what `pipeline.execute()` runs: the
configure, build and install commands here are the ones the build runs and its manifest records.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build.errors import ConfigError, ToolchainError, UsageError
from rocforge_build.forge import conditions, patches, recipes, sources
from rocforge_build.forge.context import BuildContext, preflight, source_version
from rocforge_build.forge.locations import (
    MANIFEST,
    default_prefix,
    destdir,
    project_dir,
    staging_dir,
    venv_dir,
    work_dir,
)
from rocforge_build.forge.parallel import Parallel, for_plan
from rocforge_build.forge.plan_deps import Built
from rocforge_build.forge.plan_values import CMakeOption, Output, Venv
from rocforge_build.forge.request import Request
from rocforge_build.forge.substitute_key import SubstituteKey, SubstitutePolicy
from rocforge_build.forge.toolchains import GLSLC_FEATURES, Toolchain
from rocforge_build.proc import run

__all__ = ["MANIFEST", "BuildContext", "Dependency", "InstallStep", "Plan", "Request",
           "default_prefix", "make_plan", "plan_for", "preflight", "source_version", "work_dir"]


@dataclass(frozen=True)
class Dependency:
    """A recipe built first, for the same target, whose prefix this build uses: planned (`plan`),
    or an existing rocforge build of it used as it is (`built`: its prefix and manifest)."""

    request: Request
    reason: str
    because: str
    prepend: dict[str, str]  # variable -> directory of the dependency's prefix
    plan: Plan | None
    built: Built | None = None
    evidence: tuple[str, ...] = ()  # the `[[depends]]` rule's, beside its reason

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
               "plan": self.plan.to_json() if self.plan else None,
               **({"evidence": list(self.evidence)} if self.evidence else {})}
        if self.built:  # an existing build used as it is: no plan, where it came from instead
            out["built"] = self.built.to_json()
        return out


@dataclass(frozen=True)
class InstallStep:
    """How the install reaches the staging sibling of the prefix: `cmake --install` (`argv`
    runs), `ninja install` into DESTDIR by the build step, then moved ("ninja"), or the chosen
    CMake targets' artifacts copied ("artifacts")."""

    how: str  # "cmake" | "ninja" | "artifacts"
    staging: Path
    argv: tuple[str, ...] = ()
    destdir: Path | None = None
    cmake_targets: tuple[str, ...] = ()

    def words(self) -> list[str]:
        """The step as the plan shows it (and the manifest records it)."""
        if self.how == "ninja":
            return [f"(`ninja install` with DESTDIR={self.destdir}, moved to)", str(self.staging)]
        if self.how == "artifacts":
            return ["(copy artifacts of)", *self.cmake_targets, "->", str(self.staging)]
        return list(self.argv)


@dataclass(frozen=True)
class Environment:
    """The variables a plan sets, by stage, with one reason per variable."""

    build: dict[str, str]  # configure + build
    reasons: dict[str, str]
    evidence: dict[str, list[str]]  # beside a reason whose rule has any
    runtime: dict[str, str]  # smoke tests and the manifest's runtime env
    export: dict[str, str]  # what `rocforge env` exports


@dataclass(frozen=True, kw_only=True)
class Plan:
    recipe: recipes.Recipe
    target: str
    backend: str
    backend_reason: str
    source: sources.Fetched
    source_version: str | None
    toolchain: Toolchain
    options: tuple[CMakeOption, ...]
    env: dict[str, str]  # configure + build environment additions
    runtime_env: dict[str, str]
    env_reasons: dict[str, str]
    patches: list[patches.PatchPlan]
    patch_status: list[patches.PatchResult]  # checked against the pristine tree (a dry run)
    notes: tuple[str, ...]  # what the build says before it starts (the recipe's notes that hold, the cache's)
    configure: list[str]
    build: list[str]
    install_step: InstallStep
    smoke: list[list[str]]
    prefix: Path
    work: Path
    stamp: str
    launcher: str | None
    environ: Mapping[str, str]  # the request's environment: what every process starts from
    force: bool = False
    build_targets: tuple[str, ...] = ()
    dependencies: list[Dependency] = field(default_factory=list)
    outputs: tuple[Output, ...] = ()
    export_env: dict[str, str] = field(default_factory=dict)  # what `rocforge env` exports
    venv: Venv | None = None
    parallel: Parallel | None = None  # compiler cache, distribution, -j (forge/parallel.py)
    # a dry run of a source it did not download: every rule only the source decides, with the
    # condition ({rule, name, when, ...}), and the other backends the source may choose
    after_fetch: tuple[conditions.AfterFetch, ...] = ()
    backend_alternatives: tuple[str, ...] = ()
    # beside backend_reason and env_reasons: the evidence (sources, figures) of the rules they give
    backend_evidence: tuple[str, ...] = ()
    env_evidence: dict[str, list[str]] = field(default_factory=dict)
    # what a substitute store names this build by (forge/substitute_key.py), or why it has none
    substitute_key: SubstituteKey | None = None
    no_substitute_key: str = ""
    substitutes: SubstitutePolicy | None = None
    # the request's --cmake-target list as asked (() when the recipe's own choice was used), and
    # whose prefix this is (Request.made_for): both recorded in the manifest, so a later upgrade
    # asks for the same programs and a later build knows whose build it would replace
    asked_targets: tuple[str, ...] = ()
    made_for: str | None = None

    @property
    def install(self) -> list[str]:
        return self.install_step.words()

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
            "backend_evidence": list(self.backend_evidence),
            "source": self.source.to_json(),
            "patches": [p.to_json() for p in self.patch_status],
            "options": [o.to_json() for o in self.options],
            "configure": self.configure,
            "build": self.build,
            "install": self.install,
            "smoke": self.smoke,
            "env": self.env,
            "env_reasons": self.env_reasons,
            "env_evidence": self.env_evidence,
            "runtime_env": self.runtime_env,
            "toolchain": self.toolchain.to_json(),
            "compiler_launcher": self.launcher,
            "notes": list(self.notes),
            "prefix": str(self.prefix),
            "work_dir": str(self.work),
            "log": str(self.log),
            "stamp": self.stamp,
            "dependencies": [d.to_json() for d in self.dependencies],
            "outputs": [o.to_json() for o in self.outputs],
            "export_env": self.export_env,
            "venv": self.venv.to_json() if self.venv else None,
            **(self.parallel.to_json() if self.parallel else {}),
            **({"after_fetch": [a.to_json() for a in self.after_fetch]} if not self.source.read else {}),
            **({"backend_alternatives": list(self.backend_alternatives)}
               if self.backend_alternatives else {}),
            "substitute_key": (self.substitute_key.to_json() if self.substitute_key
                               else {"none": self.no_substitute_key}),
            "substitutes": self.substitutes.to_json() if self.substitutes else None,
        }


def plan_for(req: Request, root, *, fetch: bool = True, check_patches: bool = True) -> Plan:
    """The plan of a request: its context, read (`fetch=False`, a dry run: from the cache only,
    never a download), then planned."""
    context = BuildContext.of(req, root)
    return make_plan(context.read() if fetch else context.read_cached(), check_patches=check_patches)


# -- the plan: named steps, one concern each ------------------------------------------------------

def make_plan(context: BuildContext, *, check_patches: bool = True) -> Plan:
    """Plan the build of a read context (`read()` or `read_cached()`): each step below has one
    concern and reads the context's facts; the dependencies are planned from their own contexts."""
    recipe, req, fetched = context.recipe, context.request, context.fetched
    choice, needed = context.backend, context.dependencies
    facts = context.facts(choice.name, needed.include_dirs)
    toolchain = context.toolchain
    kind = recipe.backends[choice.name].toolchain
    target, prefix = context.target_name, context.prefix
    deps = [Dependency(n.request, n.rule.get("reason"), n.because, dict(n.rule.get("prepend", {})),
                       make_plan(n.context, check_patches=check_patches) if n.context else None,
                       n.built, tuple(n.rule.get("evidence", ()))) for n in needed.needed]
    notes, after_stops = _backend_and_stops(recipe, choice.name, facts, target, toolchain,
                                            choice.alternatives)
    work = work_dir(prefix)
    values = _placeholders(recipe, fetched, target, choice.name, prefix, toolchain, work)
    par = for_plan(recipe.of("jobs"), facts, root=context.root, requested_jobs=req.jobs,
                   no_cache=req.no_cache, distribute=req.distribute, kind=kind, work=work,
                   environ=req.environ, cfg=req.settings)
    values.update(jobs=str(par.jobs.jobs), tensile_cpu_threads=str(par.jobs.tensile_threads))
    build_targets = tuple(req.build_targets) or recipe.build_targets
    options, after_options = _options(recipe, facts, values, toolchain, kind, par, req.build_targets)
    env, after_env = _environment(recipe, facts, values, toolchain, kind, par, req.environ, deps)
    venv, venv_env = _private_venv(recipe, fetched, work, env, req.environ)
    patch_plans, after_patches = _patches(recipe, facts)
    patch_status = _patch_check(patch_plans, after_patches, fetched) if check_patches else []
    configure, build, install = _commands(recipe, par.build_jobs, fetched, work, prefix,
                                          options + par.options, build_targets)
    smoke, after_smoke = _smoke(recipe, facts)
    outputs, after_outputs = _outputs(recipe, facts, values)
    venv_evidence = list(venv.evidence) if venv else []  # beside the venv's reason on its variables
    env_evidence = {**{k: v for k, v in env.evidence.items() if k not in venv_env},
                    **({k: venv_evidence for k in venv_env} if venv_evidence else {})}
    after_fetch = (*needed.after_fetch, *after_stops, *after_options, *after_env, *after_patches,
                   *after_smoke, *after_outputs)
    return Plan(recipe=recipe, target=target, backend=choice.name, backend_reason=choice.reason,
                source=fetched, source_version=context.source_version, toolchain=toolchain,
                options=(*options, *par.options), env={**env.build, **venv_env}, runtime_env=env.runtime,
                env_reasons={**env.reasons, **dict.fromkeys(venv_env, f"private venv: {venv.reason}"
                                                            if venv else "")},
                patches=patch_plans, patch_status=patch_status, notes=(*notes, *par.notes),
                configure=configure, build=build, install_step=install, smoke=smoke, prefix=prefix,
                work=work, stamp=context.stamp, launcher=par.launcher, environ=req.environ,
                force=req.force, build_targets=build_targets, dependencies=deps, outputs=tuple(outputs),
                export_env=env.export, venv=venv, parallel=par, after_fetch=after_fetch,
                backend_alternatives=choice.alternatives, backend_evidence=choice.evidence,
                env_evidence=env_evidence, substitute_key=context.substitute_key[0],
                no_substitute_key=context.substitute_key[1], substitutes=context.substitute_policy,
                asked_targets=tuple(req.build_targets), made_for=req.made_for)


def _backend_and_stops(recipe: recipes.Recipe, backend: str, facts: conditions.Facts,
                       target: str, toolchain: Toolchain, others: tuple[str, ...] = ()
                       ) -> tuple[list[str], list[conditions.AfterFetch]]:
    """Refuse a backend the source lacks and every `[[stop]]` that holds; (notes, after fetch).
    With `others` (the source may still choose another backend) a stop of this one is not the
    build's: it is listed for after the fetch, as a missing toolchain of this backend is."""
    be = recipe.backends[backend]
    after: list[conditions.AfterFetch] = []
    ok, why = conditions.judge(be.when, facts)
    if ok is None:  # the source decides whether it has the backend
        after.append(conditions.AfterFetch(rule="backend", name=backend, when=why, message=be.unavailable))
    elif not ok and others:  # the source may choose another backend: not the build's error yet
        after.append(conditions.AfterFetch(rule="refused", name=backend, message=be.unavailable,
                                           when=f"the source makes the backend {backend} ({why})"))
    elif not ok:
        raise UsageError(
            f"backend {backend} is not available for this source: {why}"
            + (f". {be.unavailable}" if be.unavailable else ""), be.hint)
    chosen = f"the source makes the backend {backend}"
    for rule in recipe.of("stop"):
        hint = rule.get("hint")
        hint = hint.replace("{target}", target) if hint else None
        verdict = conditions.judge_rule(rule, facts, "stop", rule.get("message"), hint=hint)
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if verdict.holds and others:
            after.append(conditions.AfterFetch(rule="stop", name=rule.get("message"),
                                               when=f"{chosen} ({verdict.why})", hint=hint))
        elif verdict.holds:
            raise ToolchainError(f"{rule.get('message')} ({verdict.why})", hint)
    if others and toolchain.missing:
        after.append(conditions.AfterFetch(rule="toolchain", name=be.toolchain, when=chosen,
                                           message=toolchain.missing, hint=toolchain.hint))
    notes = []
    for rule in recipe.of("note"):
        message = rule.get("message").replace("{target}", target)
        verdict = conditions.judge_rule(rule, facts, "note", message)
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if verdict.holds:
            notes.append(message)
    if be.toolchain == "vulkan" and toolchain.glslc:
        lacking = [desc for ext, desc in GLSLC_FEATURES.items() if not facts.host.glslc_extension(ext)]
        if lacking:
            notes.append(f"glslc ({toolchain.glslc}) cannot compile: {'; '.join(lacking)} — "
                         "those shaders are left out (slower on GPUs that have them); a newer "
                         "glslc/shaderc (Vulkan SDK) enables them")
    return notes, after


def _placeholders(recipe: recipes.Recipe, fetched: sources.Fetched, target: str, backend: str,
                  prefix: Path, toolchain: Toolchain, work: Path) -> dict:
    """The `{name}` values recipe options, env and outputs may use."""
    values = {"target": target, "backend": backend, "prefix": str(prefix),
              "hip_clang_dir": (str(Path(toolchain.env["HIPCXX"]).parent) if "HIPCXX" in toolchain.env
                                else "<no HIP toolchain>"),
              **toolchain.env}
    values.update(_source_placeholders(recipe, fetched, work))
    return values


def _options(recipe: recipes.Recipe, facts: conditions.Facts, values: dict, toolchain: Toolchain,
             kind: str, par: Parallel, cmake_targets: tuple[str, ...]
             ) -> tuple[list[CMakeOption], list[conditions.AfterFetch]]:
    """The -D options: the recipe's rules (a later rule of the same name wins), what the toolchain
    implies, the compiler launcher, partial-build RPATH."""
    chosen: dict[str, CMakeOption] = {}
    after: list[conditions.AfterFetch] = []
    for rule in recipe.of("option"):
        name = rule.get("name")
        verdict = conditions.judge_rule(rule, facts, "option", name,
                                        value=_fmt(rule.get("value"), values),
                                        reason=rule.get("reason"), evidence=rule.get("evidence"))
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if not verdict.holds:
            continue
        if rule.get("declared", True) and facts.source is None:  # checked once it is read
            after.append(conditions.AfterFetch(rule="declared", name=name, when=f"the source declares {name}"))
        elif rule.get("declared", True) and name not in facts.source.cmake_options:
            raise ConfigError(
                f"recipe {recipe.name}: option {name} is not declared by the source "
                f"({facts.source.tree}); CMake would ignore it silently",
                "give the option a `when` on `cmake_option` so it is passed only to trees that have it")
        chosen[name] = CMakeOption(name=name, value=_fmt(rule.get("value"), values), reason=rule.get("reason"),
                                   because=verdict.why, evidence=_evidence_of(rule))
    after += _verify_options(recipe, facts, cmake_targets, chosen)
    for name, value in toolchain.defines.items():
        chosen.setdefault(name, CMakeOption(name=name, value=value, reason="found by toolchain detection",
                                            because=kind))
    launcher = par.launcher
    if launcher:
        for lang in ["C", "CXX"] + (["HIP"] if kind == "hip" else []):
            value = par.hip_launcher or launcher if lang == "HIP" else launcher
            chosen[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = CMakeOption(
                name=f"CMAKE_{lang}_COMPILER_LAUNCHER", value=value,
                reason="compiler cache (disable with --no-cache)" if value == launcher else
                "compiler cache, on a local-only sccache server: sccache-dist cannot compile HIP "
                "(see the plan's note)", because="found on PATH")
    if cmake_targets:
        chosen["CMAKE_BUILD_WITH_INSTALL_RPATH"] = CMakeOption(
            name="CMAKE_BUILD_WITH_INSTALL_RPATH", value="ON", because="--build-target",
            reason="a partial build is installed by copying artifacts, so they carry the install RPATH")
    return list(chosen.values()), after


def _verify_options(recipe: recipes.Recipe, facts: conditions.Facts, cmake_targets: tuple[str, ...],
                    chosen: dict[str, CMakeOption]) -> list[conditions.AfterFetch]:
    """The recipe's `[verify]` options, over the `[[option]]` rules, only when a build names one
    of its targets (--cmake-target): a build that does not ask for a verify tool is configured
    and built as before.  Each must be declared by the source, as a recipe option is."""
    asked = [t for t in cmake_targets if t in recipe.verify_targets]
    if not asked:
        return []
    after: list[conditions.AfterFetch] = []
    because = f"--cmake-target {', '.join(asked)} (a verify tool)"
    for name, value in recipe.verify["options"].items():
        if facts.source is None:
            after.append(conditions.AfterFetch(rule="declared", name=name, when=f"the source declares {name}"))
        elif name not in facts.source.cmake_options:
            raise UsageError(f"--cmake-target {', '.join(asked)}: this source does not declare {name}, "
                             "which builds it, so it has no such verify tool")
        chosen[name] = CMakeOption(name=name, value=_fmt(value, {}), reason=recipe.verify["reason"],
                                   because=because, evidence=tuple(recipe.verify.get("evidence") or ()))
    return after


def _environment(recipe: recipes.Recipe, facts: conditions.Facts, values: dict,
                 toolchain: Toolchain, kind: str, par: Parallel, environ: Mapping[str, str],
                 deps: list[Dependency]) -> tuple[Environment, list[conditions.AfterFetch]]:
    """The toolchain's variables, the compiler cache's and distribution's (forge/parallel.py),
    the recipe's `[[env]]` rules by stage, dependencies' prefixes in front."""
    env: dict[str, str] = {**toolchain.env, **par.env}
    reasons = {**{k: f"{kind} toolchain" for k in toolchain.env}, **par.reasons}
    evidence: dict[str, list[str]] = {}
    runtime_env: dict[str, str] = {}
    export_env: dict[str, str] = {}
    after: list[conditions.AfterFetch] = []
    for rule in recipe.of("env"):
        verdict = conditions.judge_rule(rule, facts, "env", rule.get("name"),
                                        value=_fmt(rule.get("value"), values),
                                        reason=rule.get("reason"), stage=rule.get("stage"),
                                        evidence=rule.get("evidence"))
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if not verdict.holds:
            continue
        stage = rule.get("stage", "configure")
        {"runtime": runtime_env, "export": export_env}.get(stage, env)[rule.get("name")] = \
            _fmt(rule.get("value"), values)
        reasons[rule.get("name")] = rule.get("reason") + (
            f" ({verdict.why})" if stage == "export" and rule.when else "")
        _set_evidence(evidence, rule.get("name"), rule.get("evidence"))
    for dep in deps:  # dependencies' prefixes go in front of their variables
        for var, sub in dep.prepend.items():
            entry = str(dep.prefix if sub in ("", ".") else dep.prefix / sub)
            rest = env.get(var, environ.get(var, ""))
            env[var] = entry + (os.pathsep + rest if rest else "")
            reasons[var] = f"dependency {dep.recipe}: {dep.reason}"
            _set_evidence(evidence, var, dep.evidence)
    return Environment(env, reasons, evidence, runtime_env, export_env), after


def _evidence_of(rule: recipes.Rule) -> tuple[str, ...]:
    """The evidence beside a rule's reason (the sources and figures it cites), () if none."""
    return tuple(rule.get("evidence") or ())


def _set_evidence(evidence: dict[str, list[str]], name: str, given) -> None:
    """The evidence of the reason a variable has now (a later rule's replaces an earlier one's)."""
    if given:
        evidence[name] = list(given)
    else:
        evidence.pop(name, None)


def _private_venv(recipe: recipes.Recipe, fetched: sources.Fetched, work: Path, env: Environment,
                  environ: Mapping[str, str]) -> tuple[Venv | None, dict[str, str]]:
    """The recipe's `[venv]` in the build dir, and the VIRTUAL_ENV/PATH it adds to the build."""
    if recipe.venv is None:
        return None, {}
    venv = venv_dir(work)
    py = venv / "bin" / "python"
    project = project_dir(work, fetched.spec)
    reqs = [str(project / r) for r in recipe.venv.get("requirements", [])]
    commands = [[sys.executable, "-m", "venv", str(venv)]]
    pkgs = [a for r in reqs for a in ("-r", r)] + list(recipe.venv.get("packages", []))
    if pkgs:
        commands.append([str(py), "-m", "pip", "install", "--disable-pip-version-check", *pkgs])
    added = {"VIRTUAL_ENV": str(venv),
             "PATH": str(venv / "bin") + os.pathsep + env.build.get("PATH", environ.get("PATH", ""))}
    return Venv(path=str(venv), requirements=tuple(reqs), packages=tuple(recipe.venv.get("packages", [])),
                commands=tuple(tuple(c) for c in commands), reason=recipe.venv["reason"],
                evidence=_evidence_of(recipes.Rule("venv", recipe.venv))), added


def _patches(recipe: recipes.Recipe, facts: conditions.Facts
             ) -> tuple[list[patches.PatchPlan], list[conditions.AfterFetch]]:
    """Every `[[patch]]` with whether it applies and why; one only the source decides is left to
    after the fetch."""
    plans, after = [], []
    for rule in recipe.of("patch"):
        name = rule.get("file")
        holds, why = conditions.judge(rule.when, facts)
        if holds is None:  # only the source decides: after the fetch
            after.append(conditions.AfterFetch(rule="patch", name=name, when=why, reason=rule.get("reason"),
                                               evidence=_evidence_of(rule)))
            reason = f"{rule.get('reason')} (if {why})"
        else:
            reason = f"{rule.get('reason')} ({why})" if holds else why
        evidence = tuple(rule.get("evidence", ())) if holds is not False else ()
        plans.append(patches.PatchPlan(name, recipe.patches_dir / name, bool(holds), reason,
                                       evidence))
    return plans, after


def _patch_check(plans: list[patches.PatchPlan], after: list[conditions.AfterFetch],
                 fetched: sources.Fetched) -> list[patches.PatchResult]:
    """Each patch checked against the pristine tree (an unread one: what the fetch decides)."""
    if not fetched.read:
        return patches.unread(plans, {a.name for a in after})
    return patches.check(plans, fetched.tree)


def _commands(recipe: recipes.Recipe, jobs: int, fetched: sources.Fetched, work: Path,
              prefix: Path, options: list[CMakeOption], cmake_targets: tuple[str, ...]
              ) -> tuple[list[str], list[str], InstallStep]:
    """The configure and build command lines and the install step (into the staging sibling)."""
    configure = ["cmake", "-S", str(project_dir(work, fetched.spec)), "-B", str(work / "build"),
                 "-G", "Ninja", f"-DCMAKE_INSTALL_PREFIX={prefix}"]
    configure += [o.define for o in options]
    build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), *cmake_targets]
    staging = staging_dir(prefix)
    if recipe.install == "ninja":
        build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), "install"]
        return configure, build, InstallStep("ninja", staging, destdir=destdir(prefix))
    if cmake_targets:
        return configure, build, InstallStep("artifacts", staging, cmake_targets=cmake_targets)
    argv = ("cmake", "--install", str(work / "build"), "--prefix", str(staging))
    return configure, build, InstallStep("cmake", staging, argv)


def _smoke(recipe: recipes.Recipe, facts: conditions.Facts) -> tuple[list[list[str]], list[conditions.AfterFetch]]:
    smoke, after = [], []
    for rule in recipe.of("smoke"):
        verdict = conditions.judge_rule(rule, facts, "smoke", " ".join(rule.get("run")))
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if verdict.holds:
            smoke.append(list(rule.get("run")))
    return smoke, after


def _outputs(recipe: recipes.Recipe, facts: conditions.Facts, values: dict
             ) -> tuple[list[Output], list[conditions.AfterFetch]]:
    out: list[Output] = []
    after: list[conditions.AfterFetch] = []
    for rule in recipe.of("output"):
        path = _fmt(rule.get("path"), values)
        verdict = conditions.judge_rule(rule, facts, "output", path, reason=rule.get("reason"),
                                        evidence=rule.get("evidence"))
        after += [verdict.after_fetch] if verdict.after_fetch else []
        if verdict.holds:
            out.append(Output(path=path, reason=rule.get("reason"), because=verdict.why,
                              evidence=_evidence_of(rule)))
    return out, after


def _source_placeholders(recipe: recipes.Recipe, fetched: sources.Fetched, work: Path) -> dict:
    """`{source_commit}`, `{source_tree}` (git tree sha: projects that name their build by it
    but get no .git in the work copy), `{source_root}` (the work copy's top: a monorepo's root)
    and `{venv}` for recipe values."""
    out = {"source_commit": fetched.commit or "", "source_tree": "", "source_root": str(work / "src"),
           "venv": str(venv_dir(work))}
    if "{source_tree}" in recipe.text and fetched.commit:
        where = fetched.root if (fetched.root / ".git").exists() else fetched.spec.mirror
        res = run(["git", "-C", where, "rev-parse", f"{fetched.commit}^{{tree}}"], check=False)
        out["source_tree"] = res.stdout.strip() if res.returncode == 0 else ""
    return out


def _fmt(value, values: dict) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return ";".join(sorted(_fmt(v, values) for v in value))
    return recipes.fill(str(value), values)
