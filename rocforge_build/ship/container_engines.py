"""Container engines (podman, buildah, docker: `containers/engines.toml`): which one, whether it
can run rocforge's Containerfiles here, the commands of a build, and `rocforge container run`
with the GPU's devices and groups.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import proc
from rocforge_build.discover.resolver import Decision
from rocforge_build.errors import BuildError, ToolchainError, UsageError
from rocforge_build.ship.containers import engines_data, stage_tag, suggest


@dataclass(frozen=True)
class Engine:
    name: str
    build: tuple[str, ...]
    run_style: str
    run: tuple[str, ...]
    rmi: tuple[str, ...] = ()
    from_: tuple[str, ...] = ()
    rm: tuple[str, ...] = ()
    groups: str = "numeric"
    rootless_groups: str = "numeric"


@dataclass(frozen=True)
class RunPlan:
    engine: str
    commands: tuple[tuple[str, ...], ...]  # for "from" engines: from, run (CTR placeholder), rm
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "commands": [list(c) for c in self.commands],
            "decisions": [d.to_json() for d in self.decisions],
            "warnings": list(self.warnings),
        }


# -- engines ----------------------------------------------------------------------------------------
def get_engine(name: str) -> Engine:
    table = engines_data().get("engine", {})
    if name not in table:
        raise UsageError(f"unknown container engine {name!r}", f"{suggest(name, table)}use one of: {', '.join(table)}")
    raw = table[name]
    return Engine(
        name=name, build=tuple(raw["build"]), run_style=raw["run_style"], run=tuple(raw["run"]),
        rmi=tuple(raw["rmi"]), from_=tuple(raw.get("from", ())), rm=tuple(raw.get("rm", ())),
        groups=raw.get("groups", "numeric"), rootless_groups=raw.get("rootless_groups", "numeric"),
    )


def detect_engine(name: str | None = None) -> tuple[Engine, Decision]:
    if name:
        return get_engine(name), Decision("engine", name, "given with --engine")
    order = engines_data().get("order", [])
    for candidate in order:
        if proc.which(candidate):
            return get_engine(candidate), Decision("engine", candidate, f"first of {', '.join(order)} found on PATH")
    raise ToolchainError(
        f"no container engine found (looked for {', '.join(order)} on PATH)",
        "install podman (apt-get install podman) or buildah, or pass --engine",
    )


def engine_problems(engine: Engine, *, building: bool) -> list[str]:
    """What keeps `engine` from running rocforge's Containerfiles here, one line each (empty: none).

    Docker builds them only with BuildKit (the buildx plugin): the legacy builder knows neither
    `RUN --mount=type=cache` nor `--output type=local` (docs.docker.com, "BuildKit"; Docker 23+
    `docker build` is buildx).  A docker client also needs a reachable daemon."""
    if engine.name != "docker":
        return []
    import subprocess

    def ask(argv: list[str]):
        try:
            return proc.run(argv, check=False, timeout=30)
        except proc.ToolTimedOut:
            return subprocess.CompletedProcess(argv, 124, "no answer in 30 s")

    problems = []
    if building and ask(["docker", "buildx", "version"]).returncode != 0:
        problems.append("docker has no buildx (BuildKit), which the Containerfile needs for "
                        "`RUN --mount=type=cache` and `--output type=local`")
    res = ask(["docker", "version", "--format", "{{.Server.Version}}"])
    if res.returncode != 0:
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        first = next((ln.strip() for ln in (res.stdout or "").splitlines() if ln.strip()), "")
        problems.append(f"docker cannot reach its daemon at {host}" + (f" ({first[:160]})" if first else ""))
    return problems


def engine_error(engine: Engine, *, building: bool) -> ToolchainError | None:
    """What `check_engine` raises, as a value (its `problems`: one line each), or None when the
    engine can run here.  A dry run makes the same check at the same point and raises it after
    printing its plan."""
    try:
        problems = engine_problems(engine, building=building)
    except ToolchainError as exc:  # the engine's own client is not on PATH (--engine docker)
        exc.problems = [exc.message]
        return exc
    if not problems:
        return None
    others = [n for n in engines_data().get("order", []) if n != engine.name and proc.which(n)]
    use = (f"or use {' or '.join(others)} (found here: --engine {others[0]})" if others
           else "or install podman or buildah (apt-get install podman buildah), which need no daemon")
    fixes = []
    if any("buildx" in p for p in problems):
        fixes.append("install the buildx plugin (Debian 13+: docker-buildx; Docker's apt repository: "
                     "docker-buildx-plugin)")
    if any("daemon" in p for p in problems):
        fixes.append("start the daemon (systemctl start docker) or point DOCKER_HOST at a running one")
    error = ToolchainError("; ".join(problems), f"{'; '.join(fixes)}; {use}")
    error.problems = problems  # one line each, for a dry run's plan
    return error


def check_engine(engine: Engine, *, building: bool) -> None:
    """One clear line before anything is built, naming the fix."""
    error = engine_error(engine, building=building)
    if error is not None:
        raise error


@dataclass(frozen=True)
class BuildSteps:
    """The engine commands of `rocforge container build`, in order."""

    stage: list[str]  # the multi-stage build, tagged as the stage image
    facts: list[str]  # export /opt/rocforge/facts of the stage image to ctx/facts
    final: list[str]  # the stage image + ENV + LABEL, tagged as the image
    cleanup: list[str]  # untag the stage image (its layers stay shared with the image)

    def all(self) -> list[list[str]]:
        return [self.stage, self.facts, self.final, self.cleanup]


def build_commands(engine: Engine, ctx: Path, tag: str) -> BuildSteps:
    small = str(ctx / "empty")  # the context of the two small builds: they copy nothing from it
    return BuildSteps(
        stage=[*engine.build, "-f", str(ctx / "Containerfile"), "--target", "runtime",
               "-t", stage_tag(tag), str(ctx)],
        facts=[*engine.build, "-f", str(ctx / "Containerfile.facts"),
               "--output", f"type=local,dest={ctx / 'facts'}", small],
        final=[*engine.build, "-f", str(ctx / "Containerfile.final"), "-t", tag, small],
        cleanup=[*engine.rmi, stage_tag(tag)],
    )


def group_ids(rootfs, names) -> dict[str, int | None]:
    """Numeric GIDs of groups from the root's /etc/group (None when the group is not there)."""
    found: dict[str, int | None] = dict.fromkeys(names)
    try:
        text = rootfs.read_text("/etc/group")
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] in found and parts[2].isascii() and parts[2].isdigit():
            found[parts[0]] = int(parts[2])
    return found


def run_plan(
    engine: Engine, image: str, command: list[str], *, rootfs, rootless: bool | None = None,
    interactive: bool = False,
) -> RunPlan:
    gpu = engines_data().get("gpu", {})
    decisions: list[Decision] = []
    warnings: list[str] = []
    if rootless is None:
        rootless = os.geteuid() != 0
    style = engine.rootless_groups if rootless else engine.groups
    flags: list[str] = []
    missing = []
    for dev in gpu.get("devices", []):
        if rootfs.exists(dev):
            flags += ["--device", dev]
        else:
            missing.append(dev)
    if missing:
        warnings.append(f"{', '.join(missing)} not found here: left out, the container will not see a GPU")
        decisions.append(Decision("devices", "without " + ", ".join(missing),
                                  "an engine refuses a --device that does not exist; CPU work still runs"))
    mode = "rootless" if rootless else "rootful"
    if style == "keep-groups":
        flags += ["--group-add", "keep-groups"]
        decisions.append(Decision(
            "groups", "keep-groups",
            f"{engine.name} is {mode}: host GIDs cannot be mapped into its user namespace, so the "
            "caller's own supplementary groups (video, render) are kept",
        ))
    elif style == "numeric":
        gids = group_ids(rootfs, gpu.get("groups", []))
        for name, gid in gids.items():
            if gid is None:
                flags += ["--group-add", name]
                warnings.append(f"group {name} is not in /etc/group: passing the name, which the image must know")
            else:
                flags += ["--group-add", str(gid)]
        decisions.append(Decision(
            "groups", ",".join(n if g is None else f"{n}={g}" for n, g in gids.items()),
            f"numeric GIDs from /etc/group ({mode} {engine.name}): the device nodes belong to the host's "
            "groups, and a slim image has no /etc/group to resolve names",
        ))
    else:
        decisions.append(Decision("groups", "none", f"{engine.name} runs the command as root in the container"))
    for opt in gpu.get("security_opt", []):
        flags += ["--security-opt", opt]
    if engine.run_style == "from":
        cmds = (
            (*engine.from_, *flags, image),
            (*engine.run, "$CTR", "--", *command),
            (*engine.rm, "$CTR"),
        )
    else:
        tty = ["-it"] if interactive else []
        cmds = ((*engine.run, *tty, *flags, image, *command),)
    return RunPlan(engine=engine.name, commands=cmds, decisions=tuple(decisions), warnings=tuple(warnings))


def execute_run(run: RunPlan) -> int:
    """Run the planned command, streaming its output; returns its exit code."""
    if len(run.commands) == 1:
        return proc.run(list(run.commands[0]), capture=False, check=False, timeout=None).returncode  # the user's container
    created = proc.run(list(run.commands[0]), timeout=None).stdout.strip().splitlines()  # may pull an image
    ctr = created[-1].strip() if created else ""
    try:
        argv = [ctr if a == "$CTR" else a for a in run.commands[1]]
        return proc.run(argv, capture=False, check=False, timeout=None).returncode  # the user's container
    finally:
        proc.run([ctr if a == "$CTR" else a for a in run.commands[2]], check=False, timeout=120)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """Send a child's stdout to our stderr (with --json, stdout carries only the JSON)."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def run_step(argv: list[str], what: str, containerfile: Path | None, *, quiet_stdout: bool = False) -> None:
    """One engine command of an image build, said on stderr first; its failure is one BuildError
    naming the step and the Containerfile (the engine's own output above it names the line)."""
    sys.stderr.write(f"rocforge: {what}: {shlex.join(argv)}\n")
    sys.stderr.flush()
    try:
        with _stdout_to_stderr(quiet_stdout):
            proc.run(argv, capture=False, timeout=None)  # an image build: its length is the work
    except proc.CommandFailed as exc:
        where = f"; the Containerfile is {containerfile}" if containerfile else ""
        raise BuildError(
            f"container build failed in the {what} (exit code {exc.returncode})",
            f"the engine's output above names the failing step{where}",
        ) from exc
