"""`rocforge upgrade` and `rocforge rollback`: rebuild an existing build with changed inputs and
swap it in only when every gate passes; put the replaced build back on request.

The candidate is built by the ordinary pipeline into the prefix's staging sibling (so it is built
for the prefix it will live at: install paths, stamp and work dir are the prefix's own, and the
compiler cache and the incremental build make it cheap).  After the recipe's smoke test the
pipeline hands the staged install to `gates`: the user's `--run` command, then with `--model`
`rocforge verify` against the current build and a side-by-side `rocforge bench` (the default shape
and each range of the model's preset, if it has one, with the range's environment).  Verify and
bench are used through their command line only (`--json`, exit 0/1), so their internals can change.
A failed gate raises `Refused` inside the pipeline, which deletes the staged install: the prefix
is not touched.  When all pass, `replace.swap` puts the candidate in place and keeps the replaced
tree at `<prefix>.rocforge-previous` for `rollback`, which is the same swap the other way.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import proc, replace
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import BuildError, RocforgeError, UsageError
from rocforge_build.forge.plan import MANIFEST, Plan, Request, work_dir

PREVIOUS = ".rocforge-previous"  # the replaced build, kept for `rocforge rollback`
SKIP_EXIT = 125  # git bisect run: "this revision cannot be tested"


@dataclass
class Gate:
    """One gate's outcome: verdict is pass, fail or cannot test."""

    name: str
    verdict: str
    detail: str = ""
    figures: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"gate": self.name, "verdict": self.verdict, "detail": self.detail,
                "figures": self.figures}


class Refused(RocforgeError):
    """A gate did not pass: raised inside the pipeline so the staged candidate is deleted."""

    exit_code = 1


# -- inputs ---------------------------------------------------------------------------------------

def existing_build(prefix: str | os.PathLike) -> tuple[Path, dict]:
    """The build at `prefix` and its manifest; anything that is not a rocforge build is one line."""
    path = Path(prefix).expanduser()
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link; rocforge replaces a build as a whole and "
                         "would not follow it", "give the directory it points to")
    path = path.resolve()
    repair(path)
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory", "give the prefix of a rocforge build "
                         "(see `rocforge doctor`)")
    manifest = read_manifest(path)
    if not manifest:  # read_manifest checked it (discover/builds.py MANIFEST_SCHEMA)
        raise UsageError(f"{path} is not a rocforge build: it has no readable {MANIFEST}",
                         "give the prefix of a build made by `rocforge build`")
    return path, manifest


def repair(prefix: Path) -> None:
    """Finish a swap of `prefix` that a kill cut off (`replace.recover`, under the prefix's
    build lock), so the build is whole before it is read: `upgrade` and `rollback` start here."""
    from rocforge_build.forge import lock

    if not replace.interrupted(prefix):
        return
    held = lock.acquire(prefix, work_dir(prefix))
    try:
        done = replace.recover(prefix, MANIFEST)
    finally:
        held.release()
    if done:
        sys.stderr.write(f"rocforge: note: {done}\n")


def recipe_ref(manifest: dict) -> str:
    """The recipe file the build was made from when it is still there, else its name."""
    file = manifest["recipe"].get("file")
    if isinstance(file, str) and Path(file).is_file():
        return file
    return manifest["recipe"]["name"]


def request_for(prefix: Path, manifest: dict, *, ref: str | None = None,
                source: str | None = None, environ: dict | None = None,
                jobs: int | None = None) -> Request:
    """The build's request (recipe, target, backend, source and --cmake-targets from its manifest)
    with only the given inputs changed; with no new source, the exact source it was built from (the same
    commit, tarball or tree), so a toolchain change is tested alone."""
    from rocforge_build.forge import recipes

    recipe = recipes.load(recipe_ref(manifest))
    src = manifest.get("source", {})
    kind, location = src.get("kind"), src.get("location")
    if source is None and isinstance(location, str):  # the source it was built from
        default = (kind == "git" and location == recipe.source.git) or (
            kind == "tarball" and location == recipe.source.url)
        source = None if default else location
        if ref is None and kind == "git":  # pinned to the commit it was built from
            ref = src.get("commit") or src.get("identity")
    return Request(recipe=recipe_ref(manifest), target=manifest["target"],
                   backend=manifest["backend"], ref=ref, source=source, prefix=str(prefix),
                   jobs=jobs, environ=environ, build_targets=tuple(manifest.get("asked_targets") or ()))


def run_argv(text: str, option: str = "--run") -> list[str]:
    """The user's own command as an argv (shlex, no shell), checked to name a program now, before
    anything is built."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r} cannot be split into words: {exc}",
                         f"quote {option}'s command as one argument, e.g. {option} './check.sh -v'"
                         ) from None
    if not argv:
        raise UsageError(f"{option} is empty", f"give {option} a command, e.g. {option} ./check.sh")
    program = argv[0]
    found = shutil.which(program) if "/" not in program else (
        program if os.path.isfile(program) and os.access(program, os.X_OK) else None)
    if found is None:
        raise UsageError(f"{option}: {program!r} is not a program that can be run "
                         "(not found on PATH, or not an executable file)",
                         f"give {option} a command line whose first word is a program")
    return argv


def threshold(value: float | None) -> float:
    if value is None:
        return 5.0
    if not math.isfinite(value) or not 0 <= value < 100:
        raise UsageError(f"--threshold {value} is not a percentage from 0 to below 100")
    return value


# -- the gates ------------------------------------------------------------------------------------

def run_gate(argv: list[str], candidate: Path, name: str = "run", *,
             environ: Mapping[str, str] | None = None) -> Gate:
    """The user's command with ROCFORGE_PREFIX=candidate, under the environment the candidate was
    built with (a gated nightly's ROCM_PATH, not this process's); git bisect run's exit codes."""
    env = {**exactly(environ), "ROCFORGE_PREFIX": str(candidate)}
    try:
        rc = proc.run(argv, env=env, capture=False, stdout=_stderr_fd(), check=False, group=True,
                      timeout=None).returncode  # the user's own check: its length is theirs
    except OSError as exc:
        return Gate(name, "fail", f"{shlex.join(argv)} could not start: {exc.strerror}")
    verdict = "pass" if rc == 0 else "cannot test" if rc == SKIP_EXIT else "fail"
    return Gate(name, verdict, f"{shlex.join(argv)} exited {rc}", {"exit_code": rc})


def exactly(environ: Mapping[str, str] | None) -> dict[str, str | None]:
    """`proc.run`'s env for a child that sees this environment and no variable of this process's
    beyond it (it merges over os.environ; None removes a name)."""
    if environ is None:
        return dict(os.environ)
    return {**{name: None for name in os.environ if name not in environ}, **environ}


def _stderr_fd() -> int:
    """Where a child's output goes: rocforge's stderr (stdout carries --json)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file (an embedding caller)
        return 2


def rocforge_cli(args: list[str], root: str | None, *,
                 environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Another rocforge command through its command line (its internals may change), stdout
    captured, stderr passed through, under the request's environment when one is given."""
    argv = [sys.executable, "-m", "rocforge_build"] + (["--root", root] if root else []) + args
    env = None if environ is None else exactly(environ)
    done = proc.run(argv, check=False, group=True, stderr=_stderr_fd(), env=env,
                    timeout=None)  # a rocforge command: its own tools have their deadlines
    return done.returncode, done.stdout


def verify_gate(candidate: Path, model: str, reference: Path, root: str | None, *,
                environ: Mapping[str, str] | None = None) -> Gate:
    rc, out = rocforge_cli(["verify", str(candidate), "--model", model, "--reference",
                            str(reference), "--json"], root, environ=environ)
    figures = _json(out)
    if rc == 0:
        return Gate("verify", "pass", f"against {reference}", figures if isinstance(figures, dict)
                    else {})
    return Gate("verify", "fail", f"`rocforge verify` exited {rc} (against {reference})",
                figures if isinstance(figures, dict) else {})


def bench_gate(current: Path, candidate: Path, model: str, pct: float, root: str | None, *,
               environ: Mapping[str, str] | None = None) -> Gate:
    """Both builds in one `rocforge bench` run per shape (side by side: same host state): the
    default shape, then each range of the model's preset at its ubatch, flash attention, depth
    and environment (the operating points `rocforge serve` will use); a figure of the candidate more than `pct`
    percent below the current build's fails."""
    shapes, version = preset_shapes(model)
    rows: list = []
    for names, extra in [("the default shape", [])] + [(s["ranges"], shape_args(s)) for s in shapes]:
        rc, out = rocforge_cli(["bench", str(current), str(candidate), "--model", model,
                                "--no-gate", "--json", *extra], root, environ=environ)
        got = _json(out)
        if rc != 0 or not isinstance(got, list):
            where = names if names == "the default shape" else (
                f"preset version {version} range {', '.join(names)} ({' '.join(extra)})")
            return Gate("bench", "fail", f"`rocforge bench` exited {rc} at {where}")
        rows += got
    gate = compare_rows(rows, current, candidate, pct)
    if shapes:
        gate.detail += (f" (the default shape and preset version {version}'s ranges "
                        + ", ".join(n for s in shapes for n in s["ranges"]) + ")")
    return gate


def preset_shapes(model: str) -> tuple[list[dict], int | None]:
    """The shapes of the model's preset in use (`rocforge preset show`): each distinct (depth,
    ubatch, flash attention, environment) with the ranges that use it; none without a preset."""
    from rocforge_build.measure import provenance
    from rocforge_build.measure.store import Store

    with Store() as store:  # the preset comes checked (measure/preset.py PRESET): types and ranges
        preset = store.preset(provenance.model_sha256(Path(model)))
    if preset is None:
        return [], None
    shapes: dict[tuple, dict] = {}
    for name, r in sorted(preset.ranges.items()):
        depth, ubatch, fa, env = r.depth, r.variant.ubatch, r.variant.fa, dict(r.variant.env)
        if any("," in value for value in env.values()):
            continue  # a value `rocforge bench --env` cannot pass (its list separator): no shape to bench
        shapes.setdefault((depth, ubatch, fa, tuple(sorted(env.items()))), {
            "depth": depth, "ubatch": ubatch, "fa": fa, "env": env, "ranges": []}
        )["ranges"].append(name)
    return list(shapes.values()), preset.version


def shape_args(shape: dict) -> list[str]:
    """`rocforge bench` flags for one preset shape."""
    args = ["--depth", str(shape["depth"])]
    if shape["ubatch"] is not None:
        args += ["--ubatch", str(shape["ubatch"])]
    if shape["fa"] is not None:
        args += ["--fa", "on" if shape["fa"] else "off"]
    for name, value in sorted(shape.get("env", {}).items()):
        args += ["--env", f"{name}={value}"]
    return args


def compare_rows(rows: list, current: Path, candidate: Path, pct: float) -> Gate:
    """Pair the two builds' rows by shape (test, tokens, depth, ubatch, flash attention, env)."""
    by: dict[str, dict] = {str(current): {}, str(candidate): {}}
    for r in rows:
        if isinstance(r, dict) and r.get("prefix") in by and r.get("status") == "ok":
            t_s = r.get("t_s")
            if isinstance(t_s, (int, float)) and math.isfinite(t_s):
                by[r["prefix"]][shape_label(r)] = float(t_s)
    figures, worse = {}, []
    for label, before in by[str(current)].items():
        after = by[str(candidate)].get(label)
        if after is None or before <= 0:
            continue
        change = (after - before) / before * 100
        figures[label] = {"current": before, "candidate": after, "change_pct": round(change, 2)}
        if change < -pct:
            worse.append(f"{label} {before:.2f} -> {after:.2f} t/s ({change:+.1f}%)")
    if not figures:
        return Gate("bench", "fail", "no figure of both builds to compare")
    if worse:
        return Gate("bench", "fail", f"slower beyond {pct:g}%: " + "; ".join(worse), figures)
    return Gate("bench", "pass", f"{len(figures)} figures within {pct:g}%", figures)


def shape_label(row: dict) -> str:
    n = row.get("n_prompt") if row.get("test") == "pp" else row.get("n_gen")
    label = f"{row.get('test')}{n}@d{row.get('depth', 0)}"
    if row.get("ubatch") is not None:
        label += f" ub{row.get('ubatch')}"
    if row.get("fa") is not None:
        label += f" fa{int(bool(row.get('fa')))}"
    env = row.get("env")
    if isinstance(env, dict) and env:
        label += " " + " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return label


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


# -- upgrade --------------------------------------------------------------------------------------

@dataclass
class Outcome:
    prefix: Path
    status: str  # upgraded | refused | up to date
    gates: list[Gate]
    before: dict
    after: dict
    previous: Path | None = None

    @property
    def passed(self) -> bool:
        return self.status != "refused"

    def to_json(self) -> dict:
        return {"prefix": str(self.prefix), "status": self.status, "upgraded":
                self.status == "upgraded", "from": self.before, "to": self.after,
                "gates": [g.to_json() for g in self.gates],
                "previous": str(self.previous) if self.previous else None}


def summary(manifest: dict | None) -> dict:
    """What a build is, for the report: source, version, commit, ROCm, stamp."""
    m = manifest or {}
    src = m.get("source", {}) if isinstance(m.get("source"), dict) else {}
    tc = m.get("toolchain", {}) if isinstance(m.get("toolchain"), dict) else {}
    return {"recipe": (m.get("recipe") or {}).get("name"), "stamp": m.get("stamp"),
            "source": src.get("location"), "version": src.get("version") or None,
            "commit": src.get("commit"), "rocm": tc.get("rocm_path"),
            "built_at": m.get("built_at")}


def upgrade(prefix: Path, req: Request, rootfs, *, substitute=None,
            run: list[str] | None = None,
            model: str | None = None, pct: float = 5.0, root_arg: str | None = None,
            quiet: bool = False) -> Outcome:
    """Build the candidate into the staging sibling, gate it, swap it in only if all pass."""
    from rocforge_build.forge import pipeline

    before = summary(read_manifest(prefix))
    keep = replace.sibling(prefix, PREVIOUS)
    if os.path.lexists(keep) and not (keep.is_dir() and not keep.is_symlink()
                                      and read_manifest(keep)):
        raise UsageError(f"{keep} is in the way: rocforge keeps the replaced build there, and "
                         "rocforge did not make what is there", f"move {keep} elsewhere")
    gates: list[Gate] = []

    def gate(plan: Plan, staging: Path) -> None:
        gates.append(Gate("build", "pass", f"stamp {plan.stamp[:12]}"))
        gates.append(Gate("smoke", "pass", f"{len(plan.smoke)} command(s)") if plan.smoke
                     else Gate("smoke", "pass", "the recipe has no smoke test"))
        if run:
            gates.append(run_gate(run, staging, environ=req.environ))
        if model and all(g.verdict == "pass" for g in gates):
            gates.append(verify_gate(staging, model, prefix, root_arg, environ=req.environ))
            if gates[-1].verdict == "pass":
                gates.append(bench_gate(prefix, staging, model, pct, root_arg, environ=req.environ))
        if any(g.verdict != "pass" for g in gates):
            raise Refused("a gate did not pass")

    try:
        out = pipeline.build(req, rootfs, quiet=quiet, gate=gate, keep=keep, substitute=substitute)
    except Refused:
        return Outcome(prefix, "refused", gates, before, {})
    except BuildError as exc:
        step = getattr(exc, "step", "build")
        name = "smoke" if step == "smoke test" else "build"
        if name == "smoke":
            gates.append(Gate("build", "pass"))
        gates.append(Gate(name, "fail", exc.message.splitlines()[0]))
        return Outcome(prefix, "refused", gates, before, {})
    if out.status == "up to date":
        return Outcome(prefix, "up to date", [], before, before)
    return Outcome(prefix, "upgraded", gates, before, summary(read_manifest(prefix)), keep)


def recorded(prefix: Path, req: Request, rootfs, *, argv: list[str] | None, substitute=None,
             run: list[str] | None = None, model: str | None = None, pct: float = 5.0,
             root_arg: str | None = None, quiet: bool = False) -> tuple[int, Outcome]:
    """(run id, outcome) of `upgrade` recorded as one results-store run of kind "upgrade": the
    store is opened before anything is built (one that cannot be written is found first), the
    outcome and its gates are its row, and a run that raised ends "failed"."""
    from rocforge_build.measure.store import Store

    with Store() as store:
        run_id = store.start_run("upgrade", argv, {"prefix": str(prefix)})
        try:
            out = upgrade(prefix, req, rootfs, substitute=substitute, run=run, model=model, pct=pct,
                          root_arg=root_arg, quiet=quiet)
        except BaseException:
            store.finish_run(run_id, "failed")
            raise
        store.add_row(run_id, "upgrade", {"prefix": str(prefix), "stamp": out.after.get("stamp"), **out.to_json()},
                      status="ok" if out.passed else "failed")
        store.finish_run(run_id, out.status)
    return run_id, out


def rocm_environ(rocm: str | None = None, nightly: str | None = None) -> dict[str, str] | None:
    """The build's environment for `--rocm PATH` or `--nightly VERSION` (an installed TheRock
    nightly): the process's with ROCM_PATH at that ROCm's root, resolved; None for neither."""
    if nightly is not None:
        from rocforge_build import config
        from rocforge_build.nightly import install

        rocm = str(install.find(config.nightly_prefix(), nightly).path)
    if rocm is None:
        return None
    if not Path(rocm).is_dir():
        raise UsageError(f"--rocm {rocm} is not a directory", "give the root of a ROCm install")
    return {**os.environ, "ROCM_PATH": str(Path(rocm).resolve())}


def rollback(prefix: Path) -> tuple[dict, dict]:
    """Swap the kept build back in; the build it replaces is kept in turn (a second rollback
    goes forward again): one atomic exchange (`replace.swap`).  Under the prefix's build lock:
    no build runs while it happens."""
    from rocforge_build.forge import lock

    keep = replace.sibling(prefix, PREVIOUS)
    previous = read_manifest(keep) if keep.is_dir() and not keep.is_symlink() else None
    if not previous:
        raise UsageError(f"{prefix} has no earlier build to roll back to (no {keep} made by "
                         "`rocforge upgrade`)", "`rocforge upgrade` keeps the build it replaces")
    held = lock.acquire(prefix, work_dir(prefix))
    try:
        replace.recover(prefix, MANIFEST)
        current = read_manifest(prefix)
        replace.swap(keep, prefix, MANIFEST, keep=keep)  # the two builds change places
    finally:
        held.release()
    return summary(current), summary(previous)
