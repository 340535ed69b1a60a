"""The build pipeline: plan -> fetch -> patch -> configure -> build -> install -> smoke -> manifest.

`make_plan()` computes everything once into a `Plan` (what `--dry-run --json` prints); `execute()`
runs the steps.  A stamp over every input (recipe text, patch files, source identity, request,
toolchain) is stored in the prefix's `rocforge-manifest.toml`; an identical second build compares
stamps and returns before planning.  Installs go to a temporary sibling of the prefix and are
swapped in only after the smoke test passes, so a failed build leaves the previous install intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import __version__, conditions, patches, paths, recipes, sources, targets
from rocforge_build.download import sha256_file
from rocforge_build.errors import BuildError, ConfigError, ToolchainError, UsageError
from rocforge_build.proc import merged_env, quote, run, which
from rocforge_build.toolchains import GLSLC_FEATURES, Toolchain, detect, host_identity, host_info

MANIFEST = "rocforge-manifest.toml"
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
# the user's environment that changes what CMake builds (part of the stamp)
_BUILD_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "HIPFLAGS", "HIPCXX",
              "VULKAN_SDK", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH")
_UNUSED_RE = re.compile(r"Manually-specified variables were not used by the project:\s*\n((?:\s+\S+\n?)+)")


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
    build_targets: tuple[str, ...] = ()
    environ: Mapping[str, str] | None = None


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

    @property
    def src_dir(self) -> Path:
        """The CMake project in the work copy; a sparse monorepo checkout is copied whole (its
        projects reach into ../../shared/...) and the project is its subdirectory."""
        spec = self.source.spec
        if spec.sparse and spec.subdir:
            return self.work / "src" / spec.subdir
        return self.work / "src"

    @property
    def build_dir(self) -> Path:
        return self.work / "build"

    @property
    def log(self) -> Path:
        return self.work / "rocforge-build.log"

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.name,
            "recipe_file": str(self.recipe.path),
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
        }


@dataclass
class Dependency:
    """A recipe built first, for the same target, whose prefix this build uses."""

    request: Request
    reason: str
    because: str
    prepend: dict[str, str]  # variable -> directory of the dependency's prefix
    plan: Plan

    def to_json(self) -> dict:
        return {"recipe": self.plan.recipe.name, "target": self.plan.target,
                "backend": self.plan.backend, "prefix": str(self.plan.prefix),
                "reason": self.reason, "because": self.because, "prepend": self.prepend,
                "stamp": self.plan.stamp, "plan": self.plan.to_json()}


# -- planning -------------------------------------------------------------------------------------

def _fmt(value, ctx: dict) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return ";".join(sorted(_fmt(v, ctx) for v in value))
    try:
        return str(value).format(**ctx)
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"value {value!r}: unknown placeholder {exc}") from exc


def _source_version(recipe: recipes.Recipe, fetched: sources.Fetched) -> str | None:
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


def _launcher(no_cache: bool, path: str | None) -> str | None:
    if no_cache:
        return None
    for tool in ("ccache", "sccache"):
        exe = which(tool, path)
        if exe:
            return exe
    return None


def default_prefix(recipe: str, target: str, backend: str) -> Path:
    return paths.builds_prefix() / f"{recipe}-{target}-{backend}"


def _choose_backend(recipe: recipes.Recipe, req: Request,
                    facts_for: Callable[[str], conditions.Facts]) -> tuple[str, str]:
    """--backend, else the first `[[default]]` whose `when` holds — evaluated with the facts
    (toolchain headers included) of the backend it proposes."""
    if req.backend:
        if req.backend not in recipe.backends:
            import difflib

            close = difflib.get_close_matches(req.backend, recipe.backends, n=1)
            hint = f"did you mean {close[0]}?" if close else "backends: " + ", ".join(recipe.backends)
            raise UsageError(f"recipe {recipe.name} has no backend {req.backend!r}", hint)
        return req.backend, "asked for with --backend"
    for rule in recipe.of("default"):
        if conditions.evaluate(rule.when, facts_for(rule.get("backend"))):
            return rule.get("backend"), rule.get("reason")
    first = next(iter(recipe.backends))
    return first, "the recipe's first backend"


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
        "environ": {k: environ.get(k) for k in _BUILD_ENV},
    }
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _prepare(req: Request, root):
    """Recipe, target, fetched source, backend choice, toolchain and facts: the shared start of
    a plan and of the no-op check (the fetch is a cache hit after the first build)."""
    recipe = recipes.load(req.recipe)
    tgt = targets.get_target(req.target)
    environ = dict(os.environ if req.environ is None else req.environ)
    spec = sources.spec_for(recipe, ref=req.ref, source=req.source)
    identity = sources.identify(spec)
    fetched = sources.fetch(spec, identity)
    source_facts = conditions.SourceFacts(fetched.tree, _source_version(recipe, fetched))
    toolchains: dict[str, Toolchain] = {}

    def facts_for(backend: str) -> conditions.Facts:
        kind = recipe.backends[backend].toolchain
        if kind not in toolchains:
            toolchains[kind] = detect(kind, root, tgt.name, environ)
        tc = toolchains[kind]
        return conditions.Facts(
            target=tgt.name, families=tgt.therock_groups, backend=backend,
            rocm_version=tc.rocm_version, source=source_facts,
            host=conditions.HostFacts(include_dirs=tc.include_dirs, path=tc.path,
                                      probe_glslc=tc.probe_glslc),
            toolchain_found=tc.missing is None,
        )

    backend, backend_reason = _choose_backend(recipe, req, facts_for)
    facts = facts_for(backend)
    toolchain = toolchains[recipe.backends[backend].toolchain]
    prefix = (Path(req.prefix).expanduser().resolve() if req.prefix
              else default_prefix(recipe.name, tgt.name, backend))
    return recipe, tgt, environ, fetched, backend, backend_reason, toolchain, facts, prefix


def _rocm_fact(facts: conditions.Facts, toolchain: Toolchain) -> None:
    """`rocm_file` conditions look in the HIP toolchain's ROCm tree."""
    if facts.host is not None and toolchain.env.get("ROCM_PATH"):
        facts.host.rocm_root = Path(toolchain.env["ROCM_PATH"])


def _dependency_requests(recipe: recipes.Recipe, req: Request, facts: conditions.Facts,
                         stack: tuple[str, ...]) -> list[tuple[recipes.Rule, Request, str]]:
    """The `[[depends]]` rules whose `when` holds, as requests for the same target."""
    out = []
    for rule in recipe.of("depends"):
        holds, why = conditions.explain(rule.when, facts)
        if not holds:
            continue
        name = rule.get("recipe")
        beside = recipe.path.parent / (name if name.endswith(".toml") else f"{name}.toml")
        ref = str(beside) if beside.is_file() else name
        if name in stack or recipes.load(ref).name in stack:
            raise ConfigError(f"recipe {recipe.name}: dependency cycle "
                              f"{' -> '.join((*stack, recipe.name, name))}")
        dep = Request(recipe=ref, target=req.target, backend=rule.get("backend"), jobs=req.jobs,
                      no_cache=req.no_cache, environ=req.environ)
        out.append((rule, dep, why))
    return out


def _plan_dependencies(recipe, req, facts, root, check_patches, stack) -> list[Dependency]:
    """Plan each dependency (recursively), then let this build's header checks see the headers
    it will use: the installed ones when the dependency's prefix exists, else those in its
    source (`source_include`) — what the build will install."""
    deps, extra = [], []
    for rule, dep_req, why in _dependency_requests(recipe, req, facts, stack):
        dep_plan = make_plan(dep_req, root, check_patches=check_patches,
                             _stack=(*stack, recipe.name))
        deps.append(Dependency(dep_req, rule.get("reason"), why, dict(rule.get("prepend", {})),
                               dep_plan))
        if (dep_plan.prefix / "include").is_dir():
            extra.append(dep_plan.prefix / "include")
        elif rule.get("source_include"):
            extra.append(dep_plan.source.tree / rule.get("source_include"))
    if extra and facts.host is not None:
        facts.host = conditions.HostFacts(include_dirs=(*extra, *facts.host.include_dirs),
                                          path=facts.host.path, probe_glslc=facts.host.probe_glslc,
                                          rocm_root=facts.host.rocm_root)
    return deps


def make_plan(req: Request, root, *, check_patches: bool = True, _stack: tuple[str, ...] = ()) -> Plan:
    recipe, tgt, environ, fetched, backend, backend_reason, toolchain, facts, prefix = _prepare(req, root)
    _rocm_fact(facts, toolchain)
    deps = _plan_dependencies(recipe, req, facts, root, check_patches, _stack)
    be = recipe.backends[backend]
    ok, why = conditions.explain(be.when, facts)
    if not ok:
        raise UsageError(
            f"backend {backend} is not available for this source: {why}"
            + (f". {be.unavailable}" if be.unavailable else ""), be.hint)
    for rule in recipe.of("stop"):
        holds, why = conditions.explain(rule.when, facts)
        if holds:
            hint = rule.get("hint")
            raise ToolchainError(f"{rule.get('message')} ({why})",
                                 hint.replace("{target}", tgt.name) if hint else None)
    notes = []
    for rule in recipe.of("note"):
        holds, why = conditions.explain(rule.when, facts)
        if holds:
            notes.append(rule.get("message"))
    if be.toolchain == "vulkan" and toolchain.glslc:
        lacking = [desc for ext, desc in GLSLC_FEATURES.items() if not facts.host.glslc_extension(ext)]
        if lacking:
            notes.append(f"glslc ({toolchain.glslc}) cannot compile: {'; '.join(lacking)} — "
                         "those shaders are left out (slower on GPUs that have them); a newer "
                         "glslc/shaderc (Vulkan SDK) enables them")
    work = paths.cache_dir() / "work" / hashlib.sha256(str(prefix).encode()).hexdigest()[:12]
    ctx = {"target": tgt.name, "backend": backend, "prefix": str(prefix),
           "hip_clang_dir": (str(Path(toolchain.env["HIPCXX"]).parent) if "HIPCXX" in toolchain.env
                             else "<no HIP toolchain>"),
           **{k: v for k, v in toolchain.env.items()}}
    ctx.update(_source_placeholders(recipe, fetched, work))
    # options: later rules override earlier ones of the same name
    chosen: dict[str, dict] = {}
    declared = facts.source.cmake_options
    for rule in recipe.of("option"):
        holds, why = conditions.explain(rule.when, facts)
        if not holds:
            continue
        name = rule.get("name")
        if rule.get("declared", True) and name not in declared:
            raise ConfigError(
                f"recipe {recipe.name}: option {name} is not declared by the source "
                f"({fetched.tree}); CMake would ignore it silently",
                "give the option a `when` on `cmake_option` so it is passed only to trees that have it")
        chosen[name] = {"name": name, "value": _fmt(rule.get("value"), ctx),
                        "reason": rule.get("reason"), "because": why}
    for name, value in toolchain.defines.items():
        chosen.setdefault(name, {"name": name, "value": value, "reason": "found by toolchain detection",
                                 "because": be.toolchain})
    launcher = _launcher(req.no_cache, environ.get("PATH"))
    langs = ["C", "CXX"] + (["HIP"] if be.toolchain == "hip" else [])
    if launcher:
        for lang in langs:
            chosen[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = {
                "name": f"CMAKE_{lang}_COMPILER_LAUNCHER", "value": launcher,
                "reason": "compiler cache (disable with --no-cache)", "because": "found on PATH"}
    build_targets = tuple(req.build_targets) or recipe.build_targets
    if req.build_targets:
        chosen["CMAKE_BUILD_WITH_INSTALL_RPATH"] = {
            "name": "CMAKE_BUILD_WITH_INSTALL_RPATH", "value": "ON", "because": "--build-target",
            "reason": "a partial build is installed by copying artifacts, so they carry the install RPATH"}
    env: dict[str, str] = dict(toolchain.env)
    env_reasons = {k: f"{be.toolchain} toolchain" for k in toolchain.env}
    if launcher and Path(launcher).name == "ccache" and "CCACHE_BASEDIR" not in environ:
        env["CCACHE_BASEDIR"] = str(work.parent)
        env_reasons["CCACHE_BASEDIR"] = ("paths below the work area hash alike, so builds of one "
                                         "source for other prefixes/backends share cache hits")
    runtime_env: dict[str, str] = {}
    export_env: dict[str, str] = {}
    for rule in recipe.of("env"):
        holds, why = conditions.explain(rule.when, facts)
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
            entry = str(dep.plan.prefix if sub in ("", ".") else dep.plan.prefix / sub)
            rest = env.get(var, environ.get(var, ""))
            env[var] = entry + (os.pathsep + rest if rest else "")
            env_reasons[var] = f"dependency {dep.plan.recipe.name}: {dep.reason}"
    venv = None
    if recipe.venv is not None:
        venv_dir = work / "build" / "venv"
        py = venv_dir / "bin" / "python"
        reqs = [str(work / "src" / r) if not (fetched.spec.sparse and fetched.spec.subdir)
                else str(work / "src" / fetched.spec.subdir / r) for r in recipe.venv.get("requirements", [])]
        commands = [[sys.executable, "-m", "venv", str(venv_dir)]]
        pkgs = [a for r in reqs for a in ("-r", r)] + list(recipe.venv.get("packages", []))
        if pkgs:
            commands.append([str(py), "-m", "pip", "install", "--disable-pip-version-check", *pkgs])
        venv = {"path": str(venv_dir), "requirements": reqs,
                "packages": list(recipe.venv.get("packages", [])), "commands": commands,
                "reason": recipe.venv["reason"]}
        env["VIRTUAL_ENV"] = str(venv_dir)
        env["PATH"] = str(venv_dir / "bin") + os.pathsep + env.get("PATH", environ.get("PATH", ""))
        env_reasons["VIRTUAL_ENV"] = env_reasons["PATH"] = f"private venv: {recipe.venv['reason']}"
    patch_plans = []
    for rule in recipe.of("patch"):
        holds, why = conditions.explain(rule.when, facts)
        patch_plans.append(patches.PatchPlan(rule.get("file"), recipe.patches_dir / rule.get("file"),
                                             holds, f"{rule.get('reason')} ({why})" if holds else why))
    patch_status = patches.check(patch_plans, fetched.tree) if check_patches else []
    options = list(chosen.values())
    src = (work / "src" / fetched.spec.subdir if fetched.spec.sparse and fetched.spec.subdir
           else work / "src")
    configure = ["cmake", "-S", str(src), "-B", str(work / "build"), "-G", "Ninja",
                 f"-DCMAKE_INSTALL_PREFIX={prefix}"]
    configure += [f"-D{o['name']}={o['value']}" for o in options]
    jobs = req.jobs or os.cpu_count() or 1
    build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), *build_targets]
    install = ["cmake", "--install", str(work / "build"), "--prefix", f"{prefix}.rocforge-new"]
    if recipe.install == "ninja":
        build = ["ninja", "-C", str(work / "build"), "-j", str(jobs), "install"]
        install = [f"(`ninja install` with DESTDIR={prefix}.rocforge-destdir, moved to)",
                   f"{prefix}.rocforge-new"]
    elif build_targets:
        install = ["(copy artifacts of)", *build_targets, "->", f"{prefix}.rocforge-new"]
    smoke = [list(r.get("run")) for r in recipe.of("smoke") if conditions.evaluate(r.when, facts)]
    stamp = _inputs_stamp(recipe, req, fetched.identity, toolchain, prefix, backend, environ)
    return Plan(recipe, tgt.name, backend, backend_reason, fetched, toolchain, options, env,
                runtime_env, env_reasons, patch_plans, patch_status, notes, configure, build,
                install, smoke, prefix, work, _with_deps(stamp, [d.plan.stamp for d in deps]),
                launcher, build_targets, dependencies=deps, outputs=_outputs(recipe, facts, ctx),
                export_env=export_env, venv=venv)


def _with_deps(stamp: str, dep_stamps: list[str]) -> str:
    """A build's stamp covers its dependencies' stamps: a rebuilt dependency rebuilds it."""
    if not dep_stamps:
        return stamp
    return hashlib.sha256(json.dumps([stamp, dep_stamps]).encode()).hexdigest()


def _outputs(recipe: recipes.Recipe, facts: conditions.Facts, ctx: dict) -> list[dict]:
    out = []
    for rule in recipe.of("output"):
        holds, why = conditions.explain(rule.when, facts)
        if holds:
            out.append({"path": _fmt(rule.get("path"), ctx), "reason": rule.get("reason"),
                        "because": why})
    return out


def _source_placeholders(recipe: recipes.Recipe, fetched: sources.Fetched, work: Path) -> dict:
    """`{source_commit}`, `{source_tree}` (git tree sha: projects that name their build by it
    but get no .git in the work copy), `{source_root}` (the work copy's top: a monorepo's root)
    and `{venv}` for recipe values."""
    out = {"source_commit": fetched.commit or "", "source_tree": "", "source_root": str(work / "src"),
           "venv": str(work / "build" / "venv")}
    if "{source_tree}" in recipe.text and fetched.commit:
        where = fetched.root if (fetched.root / ".git").exists() else sources._mirror(fetched.spec.location)
        res = run(["git", "-C", where, "rev-parse", f"{fetched.commit}^{{tree}}"], check=False)
        out["source_tree"] = res.stdout.strip() if res.returncode == 0 else ""
    return out


# -- no-op check ----------------------------------------------------------------------------------

def read_manifest(prefix: Path) -> dict | None:
    import tomllib

    try:
        return tomllib.loads((prefix / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def quick_stamp(req: Request, root) -> tuple[str, Path]:
    """The stamp over every input, computed without planning, patching or running CMake."""
    recipe, _, environ, fetched, backend, _, toolchain, _, prefix = _prepare(req, root)
    return _inputs_stamp(recipe, req, fetched.identity, toolchain, prefix, backend, environ), prefix


def _quick(req: Request, root, stack: tuple[str, ...]) -> tuple[str, Path, bool]:
    """(stamp, prefix, current): the quick stamp with the dependencies' folded in; current when
    the prefix's manifest has it and every dependency is current too."""
    stamp, prefix = quick_stamp(req, root)
    dep_stamps, current = [], True
    if recipes.load(req.recipe).of("depends"):  # which apply depends on the request's facts
        recipe, _, _, _, _, _, toolchain, facts, _ = _prepare(req, root)
        _rocm_fact(facts, toolchain)
        for _, dep_req, _ in _dependency_requests(recipe, req, facts, stack):
            dep_stamp, _, dep_current = _quick(dep_req, root, (*stack, recipe.name))
            dep_stamps.append(dep_stamp)
            current = current and dep_current
    stamp = _with_deps(stamp, dep_stamps)
    old = read_manifest(prefix)
    return stamp, prefix, current and bool(old) and old.get("stamp") == stamp


def _require(plan: Plan) -> None:
    """Everything a build and its dependencies need, checked before any of them starts."""
    for dep in plan.dependencies:
        _require(dep.plan)
    plan.toolchain.require()


# -- execution ------------------------------------------------------------------------------------

class _Log:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh = path.open("a", encoding="utf-8")

    def write(self, text: str) -> None:
        self.fh.write(text)
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _stream(argv: list[str], env: Mapping[str, str | None], log: _Log, step: str,
            on_line: Callable[[str], None] | None = None, cwd: Path | None = None) -> str:
    """Run a step, every line into the log; builds on proc (same env merge, quoting, lookup)."""
    full_env = merged_env(env)
    if which(argv[0], full_env.get("PATH")) is None:
        raise ToolchainError(f"required program {argv[0]!r} was not found on PATH",
                             "Debian: apt-get install cmake ninja-build")
    log.write(f"\n==> {step}: {quote(argv)}\n")
    tail: list[str] = []
    proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    out: list[str] = []
    for line in proc.stdout:
        log.write(line)
        out.append(line)
        tail.append(line.rstrip("\n"))
        del tail[:-25]
        if on_line:
            on_line(line.rstrip("\n"))
    rc = proc.wait()
    if rc != 0:
        raise BuildError(
            f"{step} failed (exit code {rc}); full log: {log.path}\n" + "\n".join(tail[-15:]),
            f"read the log: less {log.path}")
    return "".join(out)


@dataclass
class Outcome:
    status: str  # "built" | "up to date"
    prefix: Path
    manifest: Path
    seconds: float
    plan: Plan | None = None


def _console():
    from rich.console import Console

    return Console(stderr=True)


def execute(req: Request, root, *, quiet: bool = False) -> Outcome:
    t0 = time.monotonic()
    if not req.force:
        stamp, prefix, current = _quick(req, root, ())
        if current:
            return Outcome("up to date", prefix, prefix / MANIFEST, time.monotonic() - t0)
    console = _console()
    say = (lambda *a, **k: None) if quiet else console.print
    timings: dict[str, float] = {}

    t = time.monotonic()
    plan = make_plan(req, root, check_patches=False)
    _require(plan)
    timings["plan+fetch"] = time.monotonic() - t
    for dep in plan.dependencies:  # in order, each up to date or built (and checked) first
        say(f"[bold]dependency[/] {dep.plan.recipe.name}: {dep.reason}")
        out = execute(dep.request, root, quiet=quiet)
        if out.status == "up to date":
            say(f"  {out.prefix} is up to date")
    say(f"[bold]rocforge build[/] {plan.recipe.name} for {plan.target} ({plan.backend}: {plan.backend_reason})")
    for note in plan.notes:
        say(f"[yellow]note:[/] {note}")
    plan.work.mkdir(parents=True, exist_ok=True)
    if plan.log.exists():
        plan.log.unlink()
    log = _Log(plan.log)
    try:
        log.write(json.dumps(plan.to_json(), indent=2, default=str) + "\n")
        t = time.monotonic()
        if plan.source.spec.sparse:  # the whole sparse checkout: projects use ../../shared/...
            sources.sync_tree(plan.source.root, plan.work / "src")
        else:
            sources.sync_tree(plan.source.tree, plan.src_dir)
        plan.patch_status = patches.apply(plan.patches, plan.src_dir)
        timings["patch"] = time.monotonic() - t
        for r in plan.patch_status:
            say(f"  patch {r.name}: {r.status} — {r.reason}")

        env = plan.env
        if plan.venv is not None:
            t = time.monotonic()
            _make_venv(plan, log, say)
            timings["venv"] = time.monotonic() - t
        t = time.monotonic()
        marker = plan.build_dir / ".rocforge-configure"
        user_env = {k: os.environ.get(k) for k in _BUILD_ENV}  # CMake reads CC/CFLAGS... once
        configure_key = hashlib.sha256(json.dumps([plan.configure, env, user_env]).encode()).hexdigest()
        if not (marker.is_file() and marker.read_text() == configure_key
                and (plan.build_dir / "build.ninja").is_file()):
            if marker.exists():
                marker.unlink()
            cache = plan.build_dir / "CMakeCache.txt"
            if cache.exists():
                cache.unlink()  # a changed option set starts from a fresh cache
            query = plan.build_dir / ".cmake" / "api" / "v1" / "query" / "codemodel-v2"
            query.parent.mkdir(parents=True, exist_ok=True)
            query.touch()
            say("  configure ...")
            out = _stream(plan.configure, env, log, "configure")
            _check_unused(out, plan, log)
            marker.write_text(configure_key)
        timings["configure"] = time.monotonic() - t

        t = time.monotonic()
        staging = Path(f"{plan.prefix}.rocforge-new")
        if staging.exists():
            shutil.rmtree(staging)
        if plan.recipe.install == "ninja":  # `ninja install` builds and installs, into DESTDIR
            destdir = Path(f"{plan.prefix}.rocforge-destdir")
            shutil.rmtree(destdir, ignore_errors=True)
            _build(plan, {**env, "DESTDIR": str(destdir)}, log, console, quiet)
            installed = destdir / str(plan.prefix).lstrip("/")
            if not installed.is_dir():
                raise BuildError(f"`ninja install` installed nothing under {installed}; full log: {plan.log}")
            staging.parent.mkdir(parents=True, exist_ok=True)
            os.replace(installed, staging)
            shutil.rmtree(destdir, ignore_errors=True)
        else:
            _build(plan, env, log, console, quiet)
        timings["build"] = time.monotonic() - t

        t = time.monotonic()
        staging.parent.mkdir(parents=True, exist_ok=True)
        if plan.recipe.install == "ninja":
            pass  # installed by the build step
        elif plan.build_targets:
            _install_artifacts(plan, staging, log)
        else:
            _stream(["cmake", "--install", str(plan.build_dir), "--prefix", str(staging)], env, log, "install")
        check_outputs(plan, staging, log)
        timings["install"] = time.monotonic() - t

        t = time.monotonic()
        for argv in plan.smoke:
            exe = staging / argv[0]
            if not exe.exists() and plan.build_targets:
                plan.notes.append(f"smoke test {argv[0]} skipped: not among --build-target")
                continue
            if not exe.exists():
                raise BuildError(f"smoke test: {argv[0]} was not installed; full log: {plan.log}")
            _stream([str(exe), *argv[1:]], {**plan.runtime_env}, log, "smoke test")
        timings["smoke"] = time.monotonic() - t
        timings["total"] = time.monotonic() - t0
        plan.timings = {k: round(v, 3) for k, v in timings.items()}
        write_manifest(plan, staging)
        _swap(staging, plan.prefix)
    except BaseException:
        shutil.rmtree(Path(f"{plan.prefix}.rocforge-new"), ignore_errors=True)
        raise
    finally:
        log.close()
    say(f"[green]installed[/] {plan.prefix} in {timings['total']:.1f}s (manifest {plan.prefix / MANIFEST})")
    return Outcome("built", plan.prefix, plan.prefix / MANIFEST, time.monotonic() - t0, plan)


def _make_venv(plan: Plan, log: _Log, say) -> None:
    """The recipe's private virtual environment (build dir), requirements installed once per
    requirements content."""
    venv = plan.venv
    key = hashlib.sha256(json.dumps(
        [venv["commands"]] + [Path(r).read_text(errors="replace") if Path(r).is_file() else None
                              for r in venv["requirements"]]).encode()).hexdigest()
    marker = Path(venv["path"]) / ".rocforge-venv"
    if marker.is_file() and marker.read_text() == key:
        return
    missing = [r for r in venv["requirements"] if not Path(r).is_file()]
    if missing:
        raise BuildError(f"{plan.recipe.name}: requirements file(s) {', '.join(missing)} are not "
                         "in the source", "fix the recipe's [venv] requirements for this source")
    say(f"  venv {venv['path']} ...")
    for argv in venv["commands"]:
        _stream(argv, {"VIRTUAL_ENV": None, "PYTHONHOME": None}, log, "venv")
    marker.write_text(key)


def check_outputs(plan: Plan, staging: Path, log: _Log | None = None) -> list[str]:
    """Every `[[output]]` the recipe expects must be in the install (globs allowed); a missing
    one fails the build before the install replaces the previous one."""
    found, missing = [], []
    for out in plan.outputs:
        hits = sorted(staging.glob(out["path"]))
        if hits:
            found += [h.relative_to(staging).as_posix() for h in hits]
        else:
            missing.append(out)
    if missing:
        lines = []
        for out in missing:
            parent = (staging / out["path"]).parent
            have = sorted(p.name for p in parent.iterdir())[:8] if parent.is_dir() else []
            lines.append(f"  {out['path']} — {out['reason']}"
                         + (f" (the directory has: {', '.join(have)})" if have
                            else f" ({parent.relative_to(staging).as_posix()}/ is missing or empty)"))
        where = f"; full log: {log.path}" if log else ""
        raise BuildError(
            f"{plan.recipe.name} for {plan.target}: the install lacks expected output(s):\n"
            + "\n".join(lines) + where,
            "the build did not produce kernels for this target: check that the toolchain and the "
            "source support it (the previous install, if any, was kept)")
    return found


def _check_unused(output: str, plan: Plan, log: _Log) -> None:
    """CMake lists variables it ignored; an ignored recipe option means a silently wrong build."""
    m = _UNUSED_RE.search(output)
    if not m:
        return
    ignored = {v.strip() for v in m.group(1).split()}
    ours = {o["name"] for o in plan.options if not o["name"].endswith("_COMPILER_LAUNCHER")}
    bad = sorted(ignored & ours)
    if bad:
        raise BuildError(
            f"CMake ignored option(s) {', '.join(bad)} for this source; the build would not be what "
            f"the recipe says; full log: {log.path}",
            "fix the option's `when` in the recipe so it is passed only where the source uses it")


def _build(plan: Plan, env: dict, log: _Log, console, quiet: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    disable = quiet or not console.is_terminal
    with Progress(TextColumn("  build"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, disable=disable,
                  transient=True) as progress:
        task = progress.add_task("", total=None)

        def on_line(line: str) -> None:
            m = _NINJA_RE.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)),
                                description=m.group(3)[-60:])

        _stream(plan.build, env, log, "build", on_line)


def _install_artifacts(plan: Plan, staging: Path, log: _Log) -> None:
    """Install only the chosen targets (and the shared libraries they link) by copying their
    artifacts to their install destinations, read from CMake's file API."""
    reply = plan.build_dir / ".cmake" / "api" / "v1" / "reply"
    index = sorted(reply.glob("index-*.json"))
    if not index:
        raise BuildError(f"CMake file API reply missing in {reply}; full log: {log.path}")
    idx = json.loads(index[-1].read_text())
    cm_file = idx["reply"]["codemodel-v2"]["jsonFile"]
    cm = json.loads((reply / cm_file).read_text())
    config = cm["configurations"][0]
    by_id = {}
    for t in config["targets"]:
        by_id[t["id"]] = json.loads((reply / t["jsonFile"]).read_text())
    by_name = {t["name"]: t for t in by_id.values()}
    todo = []
    for name in plan.build_targets:
        if name not in by_name:
            raise BuildError(f"--build-target {name}: no such CMake target; full log: {log.path}")
        todo.append(by_name[name])
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t["id"] in seen:
            continue
        seen.add(t["id"])
        todo += [by_id[d["id"]] for d in t.get("dependencies", []) if d["id"] in by_id]
        if t["type"] not in ("EXECUTABLE", "SHARED_LIBRARY", "MODULE_LIBRARY"):
            continue
        dests = [d["path"] for d in t.get("install", {}).get("destinations", [])]
        dest = dests[0] if dests else ("bin" if t["type"] == "EXECUTABLE" else "lib")
        for art in t.get("artifacts", []):
            src = plan.build_dir / art["path"]
            real = src.resolve()  # the artifact may be the namelink of a versioned library
            out = staging / dest
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, out / real.name)
            log.write(f"install {real} -> {out / real.name}\n")
            for sib in src.parent.iterdir():  # namelink and SONAME links to it
                if sib.is_symlink() and sib.resolve() == real:
                    link = out / sib.name
                    if link.exists() or link.is_symlink():
                        link.unlink()
                    os.symlink(os.readlink(sib), link)


def _swap(staging: Path, prefix: Path) -> None:
    old = Path(f"{prefix}.rocforge-old")
    if old.exists():
        shutil.rmtree(old)
    if prefix.exists():
        os.replace(prefix, old)
    os.replace(staging, prefix)
    shutil.rmtree(old, ignore_errors=True)


def write_manifest(plan: Plan, where: Path) -> Path:
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by rocforge: exactly what was built. Do not edit."))
    doc["rocforge"] = __version__
    doc["stamp"] = plan.stamp
    doc["recipe"] = {"name": plan.recipe.name, "file": str(plan.recipe.path),
                     "sha256": hashlib.sha256(plan.recipe.text.encode()).hexdigest()}
    src = {k: v for k, v in plan.source.to_json().items() if v is not None}
    src["version"] = _source_version(plan.recipe, plan.source) or ""
    doc["source"] = src
    doc["target"] = plan.target
    doc["backend"] = plan.backend
    doc["backend_reason"] = plan.backend_reason
    doc["flags"] = {"configure": plan.configure, "build": plan.build,
                    "options": [{k: v for k, v in o.items() if v is not None} for o in plan.options]}
    doc["env"] = plan.env
    doc["runtime_env"] = plan.runtime_env
    doc["patches"] = [p.to_json() for p in plan.patch_status]
    doc["toolchain"] = {**{k: v for k, v in plan.toolchain.to_json().items() if v},
                        **host_info(merged_env(plan.env)),
                        "compiler_launcher": plan.launcher or "none"}
    doc["notes"] = plan.notes
    doc["prefix"] = str(plan.prefix)
    doc["outputs"] = [o["path"] for o in plan.outputs]
    doc["export_env"] = plan.export_env
    doc["export_env_reasons"] = {k: plan.env_reasons.get(k, "") for k in plan.export_env}
    doc["dependencies"] = [{"recipe": d.plan.recipe.name, "prefix": str(d.plan.prefix),
                            "stamp": d.plan.stamp, "reason": d.reason} for d in plan.dependencies]
    doc["timings"] = plan.timings
    doc["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = where / MANIFEST
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")
    return path


def print_plan(plan: Plan, out=sys.stdout) -> None:
    """Human-readable plan: every decision with its reason."""
    w = out.write
    w(f"recipe   {plan.recipe.name} ({plan.recipe.path})\n")
    w(f"target   {plan.target}\nbackend  {plan.backend} — {plan.backend_reason}\n")
    w(f"source   {plan.source.spec.kind} {plan.source.spec.location} @ {plan.source.identity}\n")
    w(f"prefix   {plan.prefix}\n")
    if plan.toolchain.missing:
        w(f"toolchain MISSING: {plan.toolchain.missing}\n  hint: {plan.toolchain.hint}\n")
    w("options\n")
    for o in plan.options:
        w(f"  -D{o['name']}={o['value']}\n      {o['reason']} [{o['because']}]\n")
    if plan.env:
        w("env\n")
        for k, v in plan.env.items():
            w(f"  {k}={v}  ({plan.env_reasons.get(k, '')})\n")
    if plan.runtime_env:
        w("runtime env (recorded in the manifest)\n")
        for k, v in plan.runtime_env.items():
            w(f"  {k}={v}  ({plan.env_reasons.get(k, '')})\n")
    w("patches\n")
    for p in plan.patch_status:
        w(f"  {p.name}: {p.status} — {p.reason}\n")
        if p.detail:
            w("    " + p.detail.replace("\n", "\n    ") + "\n")
    for n in plan.notes:
        w(f"note: {n}\n")
    for d in plan.dependencies:
        w(f"depends  {d.plan.recipe.name} ({d.plan.backend}) -> {d.plan.prefix}\n"
          f"      {d.reason} [{d.because}]\n")
        for var, sub in d.prepend.items():
            w(f"      {var} += {d.plan.prefix if sub in ('', '.') else d.plan.prefix / sub}\n")
    if plan.venv:
        w(f"venv     {plan.venv['path']} — {plan.venv['reason']}\n")
        for argv in plan.venv["commands"]:
            w(f"  {quote(argv)}\n")
    w(f"configure  {quote(plan.configure)}\nbuild      {quote(plan.build)}\n")
    w(f"install    {' '.join(plan.install)}\n")
    for s in plan.smoke:
        w(f"smoke      {quote(s)}\n")
    for o in plan.outputs:
        w(f"expects    {o['path']} — {o['reason']}\n")
    if plan.export_env:
        w("exported by `rocforge env` (recorded in the manifest)\n")
        for k, v in plan.export_env.items():
            w(f"  {k}={v}  ({plan.env_reasons.get(k, '')})\n")
