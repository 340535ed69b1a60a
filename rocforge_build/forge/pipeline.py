"""The build pipeline: carry out a `Plan` as named steps, each a small function below.

fetch (in planning) -> copy and patch -> private venv -> configure -> build -> install -> check
outputs -> smoke test -> manifest -> swap.  Installs go to a temporary sibling of the prefix
(`<prefix>.rocforge-new`) and replace the prefix only after the outputs are checked and the smoke
test passed, so a failed build leaves the previous install intact.  `build()` makes the request's
context once and plans it once, before the source is downloaded where its identity is known
without it; `execute()` then walks the plan's states (docstring there): an identical second build
is recognised under the prefix's lock, a store's build is taken before any download, and only a
compile reads the source.  Every process of the build starts from the request's environment.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from rocforge_build import __version__, ownership, paths, replace
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import BuildError, BuildTargetError, ToolchainError, UsageError
from rocforge_build.forge import cache, lock, parallel, patches, sources
from rocforge_build.forge.context import BUILD_ENV, BuildContext, preflight
from rocforge_build.forge.locations import (
    MANIFEST,
    STAGED,
    claim_cache_root,
    destdir,
    own_builds_dir,
    staging_dir,
)
from rocforge_build.forge.plan import Plan, make_plan
from rocforge_build.forge.request import Request
from rocforge_build.forge.substitute_key import SubstituteOutcome
from rocforge_build.forge.toolchains import host_info
from rocforge_build.proc import merged_env, quote, reaped, spawn, which
from rocforge_build.progress import Heartbeat

# where a recipe's `[verify]` targets are installed: beside bin/ (the recipe's $ORIGIN/../lib
# RPATH holds there), off PATH (measure/backend_ops.py finds them here)
VERIFY_TOOLS_DIR = "libexec"
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_UNUSED_RE = re.compile(r"Manually-specified variables were not used by the project:\s*\n((?:\s+\S+\n?)+)")


class Status(StrEnum):
    BUILT = "built"
    UP_TO_DATE = "up to date"
    SUBSTITUTED = "substituted"  # pulled from a substitute store, checked and verified here


@dataclass(frozen=True)
class BuildResult:
    """What a build did: its status and, for a build that ran, what happened on the way (the
    patches as applied, the notes it added, the step timings, the compiler cache's counts)."""

    status: Status
    prefix: Path
    manifest: Path
    seconds: float
    plan: Plan | None = None
    patch_results: tuple[patches.PatchResult, ...] = ()
    notes: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)


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


@dataclass
class _Run:
    """One build in progress: its plan, log and console, and what happens on the way (patch
    results, notes, step timings, cache counts) for its result and manifest."""

    plan: Plan
    log: _Log
    say: Callable[..., None]
    console: object
    quiet: bool
    timings: dict[str, float] = field(default_factory=dict)
    patch_results: list[patches.PatchResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cache_counts: parallel.CacheCounts = field(default_factory=parallel.CacheCounts)

    def stream(self, argv, env: Mapping[str, str | None], step: str, on_line=None) -> str:
        """A step's command with the plan's environment under `env`, into the log."""
        return _stream(argv, env, self.log, step, on_line, base=self.plan.environ, quiet=self.quiet)

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        t = time.monotonic()
        yield
        self.timings[step] = time.monotonic() - t


# what asks the substitute stores for a plan's build (substitute/pull.py `attempt`), given by the
# command: the pipeline does not import the verification a substitute needs
Substituter = Callable[[Plan, Path, Callable[[str], None]], SubstituteOutcome]


def build(req: Request, root, *, quiet: bool = False,
          gate: Callable[[Plan, Path], None] | None = None, keep: Path | None = None,
          substitute: Substituter | None = None) -> BuildResult:
    """Build the request: its context made once and checked before the source is fetched, the
    source named without a download where it can be (`BuildContext.identified`), planned once,
    and executed; the source is read only when the build is compiled here."""
    t0 = time.monotonic()
    context = BuildContext.of(req, root)
    preflight(context)  # before the source is downloaded or unpacked
    context = context.identified()
    plan = make_plan(context, check_patches=False)
    read = None if context.source_read else functools.partial(_read_plan, context)
    return execute(plan, quiet=quiet, gate=gate, keep=keep, started=t0, substitute=substitute, read=read)


def dry_run(req: Request, root) -> Plan:
    """The plan `build` would carry out, made as it makes it (the context, the preflight checks
    before any download) from the sources the cache already holds: a dry run never downloads.
    The caller shows it, then runs `check(plan)` so the dry run exits as the build would."""
    context = BuildContext.of(req, root)
    preflight(context)
    return make_plan(context.read_cached())


def _read_plan(context: BuildContext) -> Plan:
    """The plan of a context identified before its download, once its source is read."""
    return make_plan(context.read(), check_patches=False)


def execute(plan: Plan, *, quiet: bool = False, gate: Callable[[Plan, Path], None] | None = None,
            keep: Path | None = None, started: float | None = None,
            substitute: Substituter | None = None, read: Callable[[], Plan] | None = None) -> BuildResult:
    """Carry the plan through its states, in this order and no other: check -> lock -> up to
    date? -> substitute | (read -> dependencies -> compile into staging) -> gate -> swap ->
    record.  One lock is held from the up-to-date check to the record, and what reads the
    installed build (the verify a pull records) runs after the swap, so it reads the new build.

    `read()`: the plan once its source is read, for a plan made before the download (`build`): a
    store's build needs neither the source nor the toolchains, a compile needs both.
    `gate(plan, staging)` runs on the complete staged install before the swap: when it raises,
    the staged install is deleted and the prefix stays as it was (`rocforge upgrade`).  `keep`:
    the replaced install is kept there (`replace.swap`)."""
    t0 = time.monotonic() if started is None else started
    console = _console()
    say = (lambda *a, **k: None) if quiet else console.print
    check(plan, compiling=False)
    policy = plan.substitutes
    pulling = substitute is not None and policy is not None and policy.asks
    if policy is not None and policy.mode == "only" and not pulling:
        raise BuildError(f"--substitute-only: no substitute store to ask for {plan.recipe.name} "
                         "(substitute.stores is empty)", "nothing was compiled; set substitute.stores "
                         "(docs: Share verified builds) or drop --substitute-only")
    held = lock.acquire(plan.prefix, plan.work)  # released at the end (finally below)
    try:
        if _settled(plan, say):  # the one up-to-date check, under the lock
            return BuildResult(Status.UP_TO_DATE, plan.prefix, plan.prefix / MANIFEST, time.monotonic() - t0)
        asked = False
        if pulling and (plan.source.read or pullable_unread(plan)):
            asked = True
            pulled = _substitute(plan, substitute, say, gate, keep, t0)
            if pulled is not None:
                return pulled
        if not plan.source.read and read is not None:
            plan = read()  # the download: only a compile needs the source
            if pulling and not asked:
                pulled = _substitute(plan, substitute, say, gate, keep, t0)
                if pulled is not None:
                    return pulled
        _require(plan)
        _dependencies(plan, quiet, say, substitute)
        return _compile(plan, say, console, quiet, gate, keep, t0)
    finally:
        held.release()


def pullable_unread(plan: Plan) -> bool:
    """Whether a store's build can be taken for this plan before its source is read: what only
    the tree decides is then how to compile it (options, patches, stops, smoke tests), which a
    pulled build carries out already, never what the installed build runs with (its
    environment, its dependencies)."""
    return plan.substitute_key is not None and not any(
        a.rule in ("env", "depends", "headers") for a in plan.after_fetch)


def _compile(plan: Plan, say, console, quiet: bool, gate: Callable[[Plan, Path], None] | None,
             keep: Path | None, t0: float) -> BuildResult:
    """Compile into the staging sibling, gate, swap: the caller holds the prefix's lock."""
    say(f"[bold]rocforge build[/] {plan.recipe.name} for {plan.target or 'no GPU target'} ({plan.backend}: {plan.backend_reason})")
    for note in plan.notes:
        say(f"[yellow]note:[/] {note}")
    claim_cache_root()
    plan.work.mkdir(parents=True, exist_ok=True)
    ownership.write_mark(plan.work, "a build work dir")  # cache clean removes only marked dirs
    if plan.log.exists():
        plan.log.unlink()
    run = _Run(plan, _Log(plan.log), say, console, quiet, {"plan+fetch": time.monotonic() - t0})
    staging = staging_dir(plan.prefix)
    try:
        run.log.write(json.dumps(plan.to_json(), indent=2, default=str) + "\n")
        _steps(run, staging)
        run.timings["total"] = time.monotonic() - t0
        write_manifest(run, staging)
        replace.unmark_scratch(staging)  # the manifest, written last, now says it is rocforge's
        if gate is not None:
            gate(plan, staging)
        replace.swap(staging, plan.prefix, MANIFEST, keep=keep)
    except BaseException:
        if not replace.interrupted(plan.prefix):  # else its journal says whose tree is there
            with contextlib.suppress(OSError, UsageError):
                replace.discard(staging, MANIFEST, STAGED)
        raise
    finally:
        run.log.close()
    say(f"[green]installed[/] {plan.prefix} in {run.timings['total']:.1f}s (manifest {plan.prefix / MANIFEST})")
    return BuildResult(Status.BUILT, plan.prefix, plan.prefix / MANIFEST, time.monotonic() - t0,
                       plan, tuple(run.patch_results), (*plan.notes, *run.notes),
                       {k: round(v, 3) for k, v in run.timings.items()})


def _substitute(plan: Plan, substitute: Substituter, say, gate: Callable[[Plan, Path], None] | None,
                keep: Path | None, t0: float) -> BuildResult | None:
    """The plan's build from a substitute store, checked and verified here, staged, gated,
    swapped in and recorded (the caller holds the prefix's lock); None: compile it."""
    from rich.markup import escape

    def tell(text: str) -> None:
        say(f"[cyan]{escape(text)}[/]")

    plan.work.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(plan.prefix)
    try:
        outcome = substitute(plan, staging, tell)
        if outcome.advisory and not plan.force:
            raise BuildError(f"{plan.recipe.name}: {outcome.advisory}",
                             "a compile here makes the same bytes; `rocforge build --force` builds it anyway")
        if not outcome.staged:
            if plan.substitutes.mode == "only":
                raise BuildError(f"--substitute-only: no usable substitute for {plan.recipe.name} "
                                 f"(key {plan.substitute_key.short if plan.substitute_key else 'none'}): "
                                 f"{outcome.why}", "nothing was compiled; drop --substitute-only to build it")
            tell(f"substitute: none used ({outcome.why}); compiling")
            return None
        if gate is not None:
            gate(plan, staging)
        replace.swap(staging, plan.prefix, MANIFEST, keep=keep)
    except BaseException:  # nothing staged outlives a failure before the swap
        if not replace.interrupted(plan.prefix):
            with contextlib.suppress(OSError, UsageError):
                replace.discard(staging, MANIFEST, STAGED)
        raise
    if outcome.installed is not None:  # reads the prefix: the new build is in it now
        outcome.installed()
    record = outcome.record
    checked = "; ".join(str(x) for x in record.get("verify_lines") or [])[:300]
    cost = ", ".join(f"{k} {v:.1f}s" for k, v in (record.get("seconds") or {}).items()
                     if isinstance(v, int | float))
    say(f"[green]installed[/] {plan.prefix} from {escape(record['store'])} "
        f"(verified here: {escape(record['verified_here'])}{': ' + escape(checked) if checked else ''}) "
        f"in {time.monotonic() - t0:.1f}s ({cost})")
    return BuildResult(Status.SUBSTITUTED, plan.prefix, plan.prefix / MANIFEST, time.monotonic() - t0,
                       plan, notes=tuple(outcome.tried), timings=record["seconds"])


def _steps(run: _Run, staging: Path) -> None:
    """copy and patch, venv, configure, build, install, outputs, smoke test: each timed."""
    plan = run.plan
    with run.timed("patch"):
        _copy_and_patch(run)
    if plan.venv is not None:
        with run.timed("venv"):
            _make_venv(run)
    with run.timed("configure"):
        _configure(run)
        check_build_targets(plan)
    with run.timed("build"), parallel.during_build(plan.parallel, plan.work, run.say) as counts:
        _build_into(run, staging)
    run.cache_counts = counts
    with run.timed("install"):
        _install(run, staging)
        check_outputs(plan, staging, run.log)
    with run.timed("smoke"):
        _smoke(run, staging)


def up_to_date(plan: Plan) -> bool:
    """Whether the prefix already holds this plan's build (its manifest has the plan's stamp) and
    each dependency's prefix holds its own: the one up-to-date check."""
    if plan.force or not plan.stamp or not all(up_to_date(d.plan) for d in plan.dependencies if d.plan):
        return False
    old = read_manifest(plan.prefix)
    return bool(old) and old.get("stamp") == plan.stamp


# -- the steps ------------------------------------------------------------------------------------

def check(plan: Plan, *, compiling: bool = True) -> None:
    """What must hold for the plan to run here, before any step: the prefix is rocforge's to
    replace, the toolchains are there (`compiling`: a store's build needs none, so a build checks
    them once it compiles), the prefix and work areas can be written.  A dry run makes the same
    checks, so it exits as the build would."""
    replace.check_replaceable(plan.prefix, MANIFEST, "--prefix", path_list=True)
    check_owner(plan)
    for scratch in (staging_dir(plan.prefix), destdir(plan.prefix)):
        replace.check_scratch(scratch, MANIFEST, STAGED)
    if compiling:
        _require(plan)
    paths.check_writable(plan.prefix.parent, "--prefix")
    paths.check_writable(plan.work, "the work directory")


def _require(plan: Plan) -> None:
    """Everything a build and its dependencies need, checked before any of them starts.  A dry
    run's plan whose backend the unread source may still change leaves its toolchains to after
    the fetch (its `after_fetch` says so; `check_before_fetch` already stopped a build that has
    a toolchain for none of them)."""
    if plan.backend_alternatives:
        return
    for dep in plan.dependencies:
        if dep.plan is not None:
            _require(dep.plan)
    plan.toolchain.require()


def _dependencies(plan: Plan, quiet: bool, say, substitute: Substituter | None = None) -> None:
    """In order, each dependency's plan up to date or built (and checked) first."""
    for dep in plan.dependencies:
        say(f"[bold]dependency[/] {dep.recipe}: {dep.reason}")
        if dep.built is not None:
            say(f"  {dep.prefix}: the existing build, used as it is")
            continue
        out = execute(dep.plan, quiet=quiet, substitute=substitute)
        if out.status == Status.UP_TO_DATE:
            say(f"  {out.prefix} is up to date")


def _copy_and_patch(run: _Run) -> None:
    """The pristine tree into the work copy, then the patches (each with its status)."""
    plan = run.plan
    if plan.source.spec.copies_whole_tree:  # its projects reach into ../../shared/...
        sources.sync_tree(plan.source.root, plan.work / "src")
    else:
        sources.sync_tree(plan.source.tree, plan.src_dir)
    spec = plan.source.spec
    if isinstance(spec, sources.LocalSource) and plan.substitute_key is not None:
        # a tree read in place may change after its key was made: the copy is what is built
        spec.check_copy(plan.source, plan.substitute_key.fields.get("source") or {},
                        plan.work / "src" if spec.copies_whole_tree else plan.src_dir,
                        spec.copies_whole_tree)
    run.patch_results = patches.apply(plan.patches, plan.src_dir)
    for r in run.patch_results:
        run.say(f"  patch {r.name}: {r.status} — {r.reason}")


def _configure(run: _Run) -> None:
    """CMake, only when the configure line, env or the user's build env changed."""
    plan = run.plan
    env = plan.env
    marker = plan.build_dir / ".rocforge-configure"
    user_env = {k: plan.environ.get(k) for k in BUILD_ENV}  # CMake reads CC/CFLAGS... once
    configure_key = hashlib.sha256(json.dumps([plan.configure, env, user_env]).encode()).hexdigest()
    if (marker.is_file() and marker.read_text() == configure_key
            and (plan.build_dir / "build.ninja").is_file()):
        return
    if marker.exists():
        marker.unlink()
    cache = plan.build_dir / "CMakeCache.txt"
    if cache.exists():
        cache.unlink()  # a changed option set starts from a fresh cache
    query = plan.build_dir / ".cmake" / "api" / "v1" / "query" / "codemodel-v2"
    query.parent.mkdir(parents=True, exist_ok=True)
    query.touch()
    run.say("  configure ...")
    out = run.stream(plan.configure, env, "configure")
    _check_unused(out, plan, run.log)
    marker.write_text(configure_key)


def check_build_targets(plan: Plan) -> None:
    """Every --cmake-target is a target this configure made, checked before ninja runs: which
    targets exist depends on the options (llama.cpp's test-backend-ops only with
    LLAMA_BUILD_TESTS), so only CMake's file API reply (cmake-file-api(7)) can say."""
    reply = plan.build_dir / ".cmake" / "api" / "v1" / "reply"
    index = sorted(reply.glob("index-*.json"))
    if not plan.build_targets:
        return
    if not index:  # without it no name can be checked: ninja is never given one unchecked
        raise BuildError(f"--cmake-target {', '.join(plan.build_targets)}: CMake's file API "
                         f"reply is missing in {reply}, so the targets cannot be checked; "
                         "nothing was built", "rebuild with --force to configure afresh")
    idx = json.loads(index[-1].read_text())
    cm = json.loads((reply / idx["reply"]["codemodel-v2"]["jsonFile"]).read_text())
    made = {t["name"] for c in cm["configurations"] for t in c["targets"]}
    missing = [name for name in plan.build_targets if name not in made]
    if missing:
        import difflib

        close = [m for name in missing for m in difflib.get_close_matches(name, made, n=1)]
        raise BuildTargetError(
            f"--cmake-target {', '.join(missing)}: the configured {plan.recipe.name} build has no "
            f"such target (the options chosen do not make it); nothing was built",
            (f"did you mean {', '.join(close)}? " if close else "")
            + f"the targets it has are listed by `ninja -C {plan.build_dir} -t targets all`")


def _build_into(run: _Run, staging: Path) -> None:
    """ninja; a recipe that installs with `ninja install` is staged here, into DESTDIR."""
    plan = run.plan
    env = {**plan.env, **parallel.secret_env(plan.parallel)}  # credentials: never in logs/manifests
    if plan.recipe.install != "ninja":
        replace.scratch(staging, MANIFEST, STAGED)
        _build(run, env)
        return
    replace.discard(staging, MANIFEST, STAGED)
    dest = replace.scratch(plan.install_step.destdir, MANIFEST, STAGED)
    _build(run, {**env, "DESTDIR": str(dest)})
    installed = dest / str(plan.prefix).lstrip("/")
    if not installed.is_dir():
        raise BuildError(f"`ninja install` installed nothing under {installed}; full log: {plan.log}")
    replace.mark_scratch(installed)
    staging.parent.mkdir(parents=True, exist_ok=True)
    os.replace(installed, staging)
    replace.discard(dest, MANIFEST, STAGED)


def _install(run: _Run, staging: Path) -> None:
    """The plan's install step: `cmake --install` into the staging sibling, or the chosen
    targets' artifacts only (`ninja install` already ran in the build step)."""
    step = run.plan.install_step
    staging.parent.mkdir(parents=True, exist_ok=True)
    if step.how == "artifacts":
        _install_artifacts(run.plan, staging, run.log)
    elif step.how == "cmake":
        run.stream(list(step.argv), run.plan.env, "install")


def _smoke(run: _Run, staging: Path) -> None:
    """The recipe's smoke commands, run from the staged install with the runtime env."""
    plan = run.plan
    for argv in plan.smoke:
        exe = staging / argv[0]
        if not exe.exists() and plan.build_targets:
            run.notes.append(f"smoke test {argv[0]} skipped: not among --cmake-target")
            continue
        if not exe.exists():
            raise BuildError(f"smoke test: {argv[0]} was not installed; full log: {plan.log}")
        run.stream([str(exe), *argv[1:]], {**plan.runtime_env}, "smoke test")


def _make_venv(run: _Run) -> None:
    """The recipe's private virtual environment (build dir), requirements installed once per
    requirements content."""
    plan = run.plan
    venv = plan.venv
    key = hashlib.sha256(json.dumps(
        [[list(c) for c in venv.commands]] + [Path(r).read_text(errors="replace") if Path(r).is_file() else None
                                              for r in venv.requirements]).encode()).hexdigest()
    marker = Path(venv.path) / ".rocforge-venv"
    if marker.is_file() and marker.read_text() == key:
        return
    missing = [r for r in venv.requirements if not Path(r).is_file()]
    if missing:
        raise BuildError(f"{plan.recipe.name}: requirements file(s) {', '.join(missing)} are not "
                         "in the source", "fix the recipe's [venv] requirements for this source")
    run.say(f"  venv {venv.path} ...")
    for argv in venv.commands:
        run.stream(argv, {"VIRTUAL_ENV": None, "PYTHONHOME": None}, "venv")
    marker.write_text(key)


def check_outputs(plan: Plan, staging: Path, log: _Log | None = None) -> list[str]:
    """Every `[[output]]` the recipe expects must be in the install (globs allowed); a missing
    one fails the build before the install replaces the previous one."""
    found, missing = [], []
    for out in plan.outputs:
        hits = sorted(staging.glob(out.path))
        if hits:
            found += [h.relative_to(staging).as_posix() for h in hits]
        else:
            missing.append(out)
    if missing:
        lines = []
        for out in missing:
            parent = (staging / out.path).parent
            have = sorted(p.name for p in parent.iterdir())[:8] if parent.is_dir() else []
            lines.append(f"  {out.path} — {out.reason}"
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
    ours = {o.name for o in plan.options if not o.name.endswith("_COMPILER_LAUNCHER")}
    bad = sorted(ignored & ours)
    if bad:
        raise BuildError(
            f"CMake ignored option(s) {', '.join(bad)} for this source; the build would not be what "
            f"the recipe says; full log: {log.path}",
            "fix the option's `when` in the recipe so it is passed only where the source uses it")


def _build(run: _Run, env: dict) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    disable = run.quiet or not run.console.is_terminal
    with Progress(TextColumn("  build"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=run.console, disable=disable,
                  transient=True) as progress:
        task = progress.add_task("", total=None)

        def on_line(line: str, beat: Heartbeat) -> None:
            m = _NINJA_RE.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)),
                                description=m.group(3)[-60:])
                beat.update(int(m.group(1)), int(m.group(2)), m.group(3)[-120:])

        run.stream(run.plan.build, env, "build", on_line)


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
            raise BuildError(f"--cmake-target {name}: no such CMake target; full log: {log.path}")
        todo.append(by_name[name])
    seen: set[str] = set()
    kinds = {name: by_name[name]["type"] for name in plan.build_targets}
    copied = 0
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
        if t["name"] in plan.recipe.verify_targets:  # run by verify, never from a user's PATH
            dest = VERIFY_TOOLS_DIR
        for art in t.get("artifacts", []):
            src = plan.build_dir / art["path"]
            real = src.resolve()  # the artifact may be the namelink of a versioned library
            out = staging / dest
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, out / real.name)
            copied += 1
            log.write(f"install {real} -> {out / real.name}\n")
            for sib in src.parent.iterdir():  # namelink and SONAME links to it
                if sib.is_symlink() and sib.resolve() == real:
                    link = out / sib.name
                    if link.exists() or link.is_symlink():
                        link.unlink()
                    os.symlink(os.readlink(sib), link)
    if not copied:
        raise BuildError(
            "--cmake-target " + ", ".join(f"{n} ({k.lower().replace('_', ' ')})" for n, k in kinds.items())
            + ": nothing to install — only programs and shared or module libraries (and the shared "
            f"libraries they link) are installed from a partial build; full log: {log.path}",
            "name a program or shared library target, e.g. the one that uses it")


def _settled(plan: Plan, say) -> bool:
    """Under the lock: finish or undo a replacement of the prefix that was cut off, check the
    prefix again (it may have changed while this build waited) and whether it is now current."""
    done = replace.recover(plan.prefix, MANIFEST)
    if done:
        say(f"[yellow]note:[/] {done}")
    replace.check_replaceable(plan.prefix, MANIFEST, "--prefix", path_list=True)
    check_owner(plan)
    return up_to_date(plan) and not replace.interrupted(plan.prefix)


OWNERS = {"reference": "`rocforge verify`'s reference", "tune": "`rocforge tune`",
          "bisect": "`rocforge bisect`"}


def owner_problem(plan: Plan) -> str | None:
    """Why this plan may not replace the build at its prefix, or None: a build is replaced only by
    one made for the same owner (Request.made_for), or by the user's own `build`/`upgrade`, which
    may replace what rocforge made for itself; so tune, verify and bisect never rebuild a user's
    build with their plan.  A prefix that holds this plan's build already is reused, not replaced."""
    old = read_manifest(plan.prefix)
    if not old or (old.get("stamp") == plan.stamp and not plan.force):
        return None
    return replacing_problem(plan.prefix, old, plan.made_for, difference(old, plan))


def replacing_problem(prefix: Path, old: dict, made_for: str | None, what: str) -> str | None:
    """The rule of `owner_problem` for a build `old` at `prefix` that a build made for `made_for`
    would replace (`what`: how they differ), usable before a plan exists."""
    there = old.get("made_for") if isinstance(old.get("made_for"), str) else None
    if there == made_for or (made_for is None and there in OWNERS):
        return None
    if there is None and made_for is not None and _unmarked_own_build(prefix, old, made_for):
        return None  # what the command built in its own directory before builds were marked
    shown = repr(there) if there is None or len(there) <= 60 else repr(there[:57] + "...")  # an edited manifest's
    whose = "your build" if there is None else f"a build made for {OWNERS.get(there, shown)}"
    asking = OWNERS.get(made_for, repr(made_for)) if made_for else "`rocforge build`"
    return f"{prefix} holds {whose} ({what}); {asking} does not replace it with its own plan"


def _unmarked_own_build(prefix: Path, old: dict, made_for: str) -> bool:
    """Whether the build at `prefix` is one `made_for`'s command made before builds were marked: in
    that command's own directory (`locations.own_builds_dir`: never the whole cache, which may be set to hold the
    builds directory and so the user's builds), with a manifest older than the marks (no
    `asked_targets`, which every build since records, the user's included)."""
    own = own_builds_dir(made_for)
    return (own is not None and old.get("asked_targets") is None
            and Path(os.path.realpath(prefix)).is_relative_to(os.path.realpath(own)))


def check_owner(plan: Plan) -> None:
    problem = owner_problem(plan)
    if problem:
        # only `build` takes a --prefix; tune, verify's reference and bisect build where they must
        raise UsageError(problem, "give another --prefix, or move that build away yourself if it may go"
                         if plan.made_for is None else "it is left as it is: move it away yourself if it may go, "
                         "or rebuild it there with `rocforge build`")


def difference(old: dict, plan: Plan) -> str:
    """What differs between the build at a prefix and a plan for it, in words a user can check."""
    src = old.get("source") if isinstance(old.get("source"), dict) else {}
    new_src = plan.source.to_json()
    pairs = [("source", src.get("identity"), new_src.get("identity")),
             ("backend", old.get("backend"), plan.backend), ("target", old.get("target"), plan.target),
             ("programs", ", ".join(map(str, old.get("asked_targets") or ["all"])),
              ", ".join(plan.asked_targets) or "all")]
    said = [f"{name} {a or 'none'} -> {b or 'none'}" for name, a, b in pairs if a != b]
    if not said and plan.force:
        return "a forced rebuild"
    return ", ".join(said) if said else "another plan: stamp " + f"{str(old.get('stamp'))[:12]} -> {plan.stamp[:12]}"


def write_manifest(run: _Run, where: Path) -> Path:
    """What was built, exactly: the plan's decisions and commands, and what the run did."""
    import tomlkit

    plan = run.plan
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by rocforge: exactly what was built. Do not edit."))
    doc["rocforge"] = __version__
    doc["stamp"] = plan.stamp
    doc["recipe"] = {"name": plan.recipe.name, "file": str(plan.recipe.path),
                     "sha256": hashlib.sha256(plan.recipe.text.encode()).hexdigest()}
    src = {k: v for k, v in plan.source.to_json().items() if v is not None}
    src["version"] = plan.source_version or ""
    doc["source"] = src
    doc["target"] = plan.target
    doc["backend"] = plan.backend
    doc["backend_reason"] = plan.backend_reason
    doc["flags"] = {"configure": plan.configure, "build": plan.build, "install": plan.install,
                    "options": [{k: v for k, v in o.to_json().items() if v is not None} for o in plan.options]}
    doc["env"] = plan.env
    doc["runtime_env"] = plan.runtime_env
    doc["patches"] = [p.to_json() for p in run.patch_results]
    doc["toolchain"] = {**{k: v for k, v in plan.toolchain.to_json().items() if v},
                        **host_info(merged_env(plan.env, plan.environ)),
                        "compiler_launcher": plan.launcher or "none"}
    doc["notes"] = [*plan.notes, *run.notes]
    doc["prefix"] = str(plan.prefix)
    doc["outputs"] = [o.path for o in plan.outputs]
    doc["asked_targets"] = list(plan.asked_targets)  # --cmake-target as asked: what an upgrade asks again
    if plan.made_for is not None:
        doc["made_for"] = plan.made_for  # rocforge's own build (pipeline.owner_problem)
    tools = [f"{VERIFY_TOOLS_DIR}/{t}" for t in plan.build_targets if t in plan.recipe.verify_targets]
    if tools:  # verify tools built on request: rocforge verify runs them, users do not
        doc["verify_tools"] = tools
    doc["export_env"] = plan.export_env
    doc["export_env_reasons"] = {k: plan.env_reasons.get(k, "") for k in plan.export_env}
    doc["dependencies"] = [{"recipe": d.recipe, "prefix": str(d.prefix), "stamp": d.stamp,
                            "reason": d.reason, "because": d.because,
                            "used": "existing build" if d.built else "built"}
                           for d in plan.dependencies]
    if plan.parallel is not None and run.cache_counts.counts is not None:
        doc["cache"] = cache.manifest_table(plan.parallel.cache, run.cache_counts.counts)
    if plan.substitute_key is not None:  # what a substitute store names this build by
        doc["substitute_key"] = {"digest": plan.substitute_key.digest,
                                 "document": plan.substitute_key.document.decode()}
    doc["timings"] = {k: round(v, 3) for k, v in run.timings.items()}
    doc["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["installed"] = replace.installed_files(where)  # what a later swap may delete of it
    path = where / MANIFEST
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")
    return path


# -- helpers --------------------------------------------------------------------------------------

def _stream(argv: list[str], env: Mapping[str, str | None], log: _Log, step: str,
            on_line: Callable[[str, Heartbeat], None] | None = None, *,
            base: Mapping[str, str], quiet: bool = False) -> str:
    """Run a step, `env` over `base` (the request's environment), every line into the log;
    builds on proc (same env merge, quoting, lookup).  When stderr is not a terminal a plain
    progress line says the step is alive (progress.py)."""
    full_env = merged_env(env, base)
    if which(argv[0], full_env.get("PATH")) is None:
        raise ToolchainError(f"required program {argv[0]!r} was not found on PATH",
                             "Debian: apt-get install cmake ninja-build")
    log.write(f"\n==> {step}: {quote(argv)}\n")
    tail: list[str] = []
    proc = spawn(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    out: list[str] = []
    with reaped(proc), Heartbeat(step, enabled=not quiet) as beat:  # reaped: an interrupted build stops ninja
        for line in proc.stdout:
            log.write(line)
            out.append(line)
            tail.append(line.rstrip("\n"))
            del tail[:-25]
            if on_line:
                on_line(line.rstrip("\n"), beat)
        rc = proc.wait()
    if rc != 0:
        failed = BuildError(
            f"{step} failed (exit code {rc}); full log: {log.path}\n" + "\n".join(tail[-15:]),
            f"read the log: less {log.path}")
        failed.step = step  # which gate of `rocforge upgrade` failed (build, smoke test, ...)
        raise failed
    return "".join(out)


def _console():
    """stderr; soft wrap, so a line to a file or pipe (`2> build.log`) stays one line whatever
    its length (rich would hard-wrap it at 80 columns there)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)
