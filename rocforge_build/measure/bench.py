"""`rocforge bench`: one llama-bench run per build x runtime variant (ubatch, flash attention,
environment), its results streamed (`-o jsonl`) into the results store row by row as they appear.
A run that crashes or runs out of memory is recorded as failed for what it did not finish and the
matrix goes on; Ctrl-C stops with every finished row kept."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rocforge_build.errors import RocforgeError
from rocforge_build.measure import roofline
from rocforge_build.measure.gguf import Model
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.proc import ToolTimedOut, merged_env, quote, spawn
from rocforge_build.proc import run as run_tool

DEPTH_NOTE = ("this llama-bench has no -d/--n-depth (added to llama.cpp in April 2025), so only "
              "depth 0 is measured")


class Interrupted(RocforgeError):
    exit_code = 130


@dataclass(frozen=True)
class Variant:
    ubatch: int | None = None  # None: the tree's default
    fa: bool | None = None  # None: the tree's default
    env: tuple[tuple[str, str], ...] = ()
    kv: str | None = None  # the KV cache type of K and V (-ctk/-ctv); None: the tree's default, f16

    def label(self) -> str:
        parts = [f"ub={self.ubatch or 'default'}", f"fa={'default' if self.fa is None else int(self.fa)}"]
        parts += [f"kv={self.kv}"] if self.kv else []
        parts += [f"{k}={v}" for k, v in self.env]
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"ubatch": self.ubatch, "fa": self.fa, "env": dict(self.env), **({"kv": self.kv} if self.kv else {})}

    @classmethod
    def of_row(cls, row: dict) -> Variant:
        """The variant a stored row was measured with (its label for people)."""
        env = row.get("env") if isinstance(row.get("env"), dict) else {}
        return cls(row.get("ubatch"), row.get("fa"), tuple((str(k), str(v)) for k, v in env.items()),
                   row.get("kv") if isinstance(row.get("kv"), str) else None)


@dataclass
class Spec:
    model: Model
    depths: tuple[int, ...] = (0,)
    n_prompt: int = 512
    n_gen: int = 128
    reps: int = 3
    threads: int | None = None
    extra: tuple[str, ...] = ()
    timeout: float | None = None  # seconds per llama-bench run; over it the run is killed and recorded
    stop_reason: str | None = None  # why `timeout` is what it is, where tune's race set it (the failed rows say)
    # one discarded llama-bench run per build before its matrix (None: GPU builds only): the first
    # runs of a fresh GPU build measure the driver's pipeline compiles and clocks, not the variant
    # (docs/measurements/measuring.md).
    warmup: bool | None = None


@dataclass
class Outcome:
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    child_s: float = 0.0  # wall time inside llama-bench processes (the harness's cost is the rest)
    warmup_s: dict = field(default_factory=dict)  # prefix -> seconds of its discarded warm-up run

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r["status"] != "ok")


def variants(ubatches: list[int | None], fas: list[bool | None], envs: dict[str, list[str]]) -> list[Variant]:
    """The full cross product of the requested values."""
    env_sets = [tuple(zip(envs, values, strict=False)) for values in itertools.product(*envs.values())] if envs else [()]
    return [Variant(u, f, e) for u, f, e in itertools.product(ubatches or [None], fas or [None], env_sets)]


def argv_for(build: LlamaBuild, spec: Spec, v: Variant, depths: tuple[int, ...]) -> list[str]:
    argv = [str(build.program("llama-bench")), "-m", str(spec.model.path), "-p", str(spec.n_prompt),
            "-n", str(spec.n_gen), "-r", str(spec.reps), "-o", "jsonl"]
    if depths != (0,):
        argv += ["-d", ",".join(str(d) for d in depths)]
    if v.ubatch:
        argv += ["-ub", str(v.ubatch), "-b", str(max(v.ubatch, 2048))]
    if v.fa is not None:
        argv += ["-fa", "1" if v.fa else "0"]
    if v.kv:
        argv += ["-ctk", v.kv, "-ctv", v.kv]
    if build.gpu:
        argv += ["-ngl", "99"]
    if spec.threads:
        argv += ["-t", str(spec.threads)]
    return argv + list(spec.extra)


def wants_warmup(spec: Spec, build: LlamaBuild) -> bool:
    return spec.warmup if spec.warmup is not None else build.gpu


def warm_up(build: LlamaBuild, spec: Spec, v: Variant) -> float:
    """One short llama-bench run whose figures are thrown away: the first processes of a new build
    pay one-off costs (the GPU driver compiling and caching its pipelines, clocks ramping up) that
    would otherwise land on whichever variant happens to run first.  Its failures are the real
    run's to report.  Returns its wall time."""
    short = Spec(spec.model, (0,), min(spec.n_prompt, 512), min(spec.n_gen, 16), 1, spec.threads, spec.extra)
    t0 = time.perf_counter()
    try:
        run_tool(argv_for(build, short, v, (0,)), capture=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**build.runtime_env, **dict(v.env)}, check=False, timeout=spec.timeout or 600)
    except ToolTimedOut:
        pass
    return time.perf_counter() - t0


def expected(spec: Spec, depths: tuple[int, ...]) -> list[tuple[str, int]]:
    tests = [t for t, n in (("pp", spec.n_prompt), ("tg", spec.n_gen)) if n > 0]
    return [(t, d) for d in depths for t in tests]


class BadResult(ValueError):
    """A llama-bench JSON result line without a field the row needs, or with a value of the wrong
    kind (null, a string, NaN): its message names the field."""


def _field(result: dict, name: str, *, whole: bool, default=None):
    """A number from llama-bench's result: whole and >= 0 for counts, finite and >= 0 for rates.
    `default` None: the field must be there."""
    value = result.get(name, default)
    if name not in result and default is None:
        raise BadResult(f"llama-bench printed a result without {name}")
    ok_type = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or value < 0 or (
            isinstance(value, float) and not math.isfinite(value)):
        kind = "a whole number" if whole else "a number"
        raise BadResult(f"llama-bench printed a result whose {name} is {json.dumps(value)[:40]}, "
                        f"not {kind} >= 0")
    return value


def row_from(result: dict, base: dict) -> dict:
    """A results-store row from one llama-bench JSON result and the run's provenance, with its
    `ceiling`: how close it came to the device's bandwidth (tg) or GEMM peak (pp).  BadResult when a
    field it needs is missing, null or not a number (rocforge records that instead of a made-up
    figure)."""
    row = _row_from(result, base)
    found = roofline.ceiling(row)
    return {**row, "ceiling": found} if found is not None else row


def _row_from(result: dict, base: dict) -> dict:
    n_prompt = _field(result, "n_prompt", whole=True, default=0)
    n_gen = _field(result, "n_gen", whole=True, default=0)
    depth = _field(result, "n_depth", whole=True, default=0)  # absent before llama-bench had -d
    t_s = _field(result, "avg_ts", whole=False)
    stddev = _field(result, "stddev_ts", whole=False) if result.get("stddev_ts") is not None else None
    if _repetitions(result) < 2:  # llama-bench's stdev() is 0 below two samples: not a spread
        stddev = None
    return {**base, "test": "tg" if n_gen and not n_prompt else "pp", "n_prompt": n_prompt,
            "n_gen": n_gen, "depth": depth, "ubatch": result.get("n_ubatch"),
            "fa": bool(result.get("flash_attn")), "t_s": t_s,
            "stddev": stddev, "status": "ok", "error": None,
            "llama_bench": {k: result.get(k) for k in ("build_commit", "build_number", "backends",
                                                        "gpu_info", "cpu_info", "n_batch", "n_threads",
                                                        "n_gpu_layers", "type_k", "type_v", "samples_ts")}}


def _repetitions(result: dict) -> int:
    """How many timed repetitions a llama-bench result holds (its `samples_ts`); 2 when it does
    not list them, where its stddev_ts is taken as measured."""
    samples = result.get("samples_ts")
    return len(samples) if isinstance(samples, list) else 2


def run_variant(build: LlamaBuild, spec: Spec, v: Variant, base: dict, depths: tuple[int, ...],
                on_row: Callable[[dict], None], clock: list[float] | None = None) -> list[dict]:
    """One llama-bench run; each result row goes to `on_row` the moment llama-bench prints it."""
    argv = argv_for(build, spec, v, depths)
    base = {**base, "ubatch": v.ubatch, "fa": v.fa, "env": dict(v.env), "argv": quote(argv),
            **({"kv": v.kv} if v.kv else {})}
    want = expected(spec, depths)
    got: list[dict] = []
    unreadable: list[str] = []  # why result lines could not be used (first one is reported)
    env = merged_env({**build.runtime_env, **dict(v.env)})
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = spawn(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env, errors="replace")
        timer = threading.Timer(spec.timeout, proc.kill) if spec.timeout else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    result = json.loads(line)
                    row = row_from(result, base) if isinstance(result, dict) else None
                except BadResult as exc:
                    unreadable.append(str(exc))
                    continue
                except (ValueError, RecursionError):
                    continue
                if row is None:
                    continue
                got.append(row)
                on_row(row)
            rc = proc.wait()
            if clock is not None:
                clock.append(time.perf_counter() - t0)
        except KeyboardInterrupt:
            if timer:
                timer.cancel()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        timed_out = timer is not None and not timer.is_alive() and rc != 0
        if timer:
            timer.cancel()
        err.seek(0)
        stderr = err.read()
    if rc != 0 or unreadable:
        reason = ((spec.stop_reason or f"timed out after {spec.timeout:g} s")
                  + " (llama-bench was stopped; rows it finished are kept)"
                  if timed_out else _failure(rc, stderr) if rc != 0 else unreadable[0])
        done = {(r["test"], r["depth"]) for r in got}
        for test, depth in want:
            if (test, depth) not in done:
                row = {**base, "test": test, "n_prompt": spec.n_prompt if test == "pp" else 0,
                       "n_gen": spec.n_gen if test == "tg" else 0, "depth": depth, "t_s": None,
                       "stddev": None, "status": "failed", "error": reason}
                got.append(row)
                on_row(row)
    return got


def _failure(rc: int, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    interesting = [line for line in lines if any(w in line.lower() for w in
                   ("error", "failed", "out of memory", "oom", "abort", "assert"))]
    last = (interesting or lines or ["(no output)"])[-1][:240]
    if rc < 0:
        import signal

        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        why = " (killed: out of memory?)" if -rc == 9 else ""
        return f"llama-bench died of {name}{why}: {last}"
    return f"llama-bench exited with code {rc}: {last}"


def depths_for(build: LlamaBuild, depths: tuple[int, ...]) -> tuple[tuple[int, ...], str | None]:
    """The depths this tree can measure, and a note when it cannot go deeper than 0."""
    if depths == (0,) or "-d" in build.options("llama-bench"):
        return depths, None
    return (0,), DEPTH_NOTE


def run(builds: list[LlamaBuild], spec: Spec, vs: list[Variant], *, store, run_id: int, base: dict,
        gate: Callable[[LlamaBuild, bool], tuple[str, dict | None]] | None = None,
        progress=None) -> Outcome:
    """The whole matrix, rows stored as they come: each build gated and warmed up first, then each
    variant on every build back to back, so builds compared side by side meet the same host state
    (all of one build, then all of the other, put a load that started in between on one side only:
    an upgrade's bench gate measured the same code 84 % slower that way)."""
    out = Outcome()

    def keep(row: dict) -> None:
        store.add_row(run_id, "bench", row, status=row["status"])
        out.rows.append(row)
        if progress:
            progress.advance(row)

    try:
        ready = []
        for build in builds:
            prepared = _prepare(build, spec, vs, base, gate, keep, out, progress)
            if prepared is not None:
                ready.append(prepared)
        for v in vs:
            for build, bbase, verdicts, depths in ready:
                verdict = verdicts.get(bool(v.fa), "skipped")
                if verdict == "failed":  # wrong with this flash-attention setting: recorded, not run
                    keep({**bbase, "gate": "failed", "test": "gate", "n_prompt": 0, "n_gen": 0, "depth": 0,
                          "ubatch": v.ubatch, "fa": v.fa, "env": dict(v.env), "t_s": None, "stddev": None,
                          "status": "gate-failed", "error": f"failed `rocforge verify` with flash attention "
                          f"{'on' if v.fa else 'off'}"})
                    if progress:
                        progress.skip(len(expected(spec, spec.depths)))
                    continue
                if progress:
                    progress.status(f"{build.label()} {v.label()}")
                clock: list[float] = []
                run_variant(build, spec, v, {**bbase, "gate": verdict}, depths, keep, clock)
                out.child_s += sum(clock)
                if progress and depths != spec.depths:
                    progress.skip(len(expected(spec, spec.depths)) - len(expected(spec, depths)))
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {len(out.rows)} finished rows are kept in the results "
                          f"database (run {run_id})") from None
    return out


def _prepare(build: LlamaBuild, spec: Spec, vs: list[Variant], base: dict, gate, keep, out: Outcome,
             progress) -> tuple[LlamaBuild, dict, dict, tuple[int, ...]] | None:
    """One build made ready to measure: its rows' common fields, verify's verdict per flash-attention
    setting (a build wrong with both is recorded as one gate-failed row and left out: None), the
    depths its tree can measure, and its warm-up run."""
    prov = build.provenance()
    bbase = {**base, "prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp,
             "build": prov}
    verdicts = {}
    if gate is not None:
        for fa in sorted({bool(v.fa) for v in vs}, reverse=True):
            if progress:
                progress.status(f"verifying {build.label()} (flash attention {'on' if fa else 'off'})")
            verdicts[fa] = gate(build, fa)[0]
    if verdicts and "passed" not in verdicts.values():
        keep({**bbase, "gate": "failed", "test": "gate", "n_prompt": 0, "n_gen": 0, "depth": 0,
              "ubatch": None, "fa": None, "env": {}, "t_s": None, "stddev": None, "status": "gate-failed",
              "error": "failed `rocforge verify`: its output differs from the reference"})
        if progress:
            progress.skip(len(vs) * len(expected(spec, spec.depths)))
        return None
    depths, note = depths_for(build, spec.depths)
    if note:
        out.notes.append(f"{build.label()}: {note}")
    runnable = [v for v in vs if verdicts.get(bool(v.fa), "skipped") != "failed"]
    if runnable and wants_warmup(spec, build):
        if progress:
            progress.status(f"warming up {build.label()} (one discarded run)")
        out.warmup_s[str(build.prefix)] = round(warm_up(build, spec, runnable[0]), 3)
    return build, bbase, verdicts, depths


def env_pairs(items: list[str]) -> dict[str, list[str]]:
    """`--env VAR=a,b` (repeatable) -> {VAR: [a, b]}."""
    from rocforge_build.errors import UsageError

    envs: dict[str, list[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        # an environment name as POSIX defines it (XBD 8.1), values of one line: both end up in
        # stored rows and presets, and from there in scripts and unit files
        if not sep or not name.isascii() or not (name[:1].isalpha() or name[:1] == "_") \
                or not name.replace("_", "").isalnum():
            raise UsageError(f"--env {item!r} is not VAR=a,b (VAR: letters, digits and _)",
                             "e.g. --env ROCBLAS_USE_HIPBLASLT=0,1")
        if not values.isprintable():
            raise UsageError(f"--env {name}: a value holds a line break or control character",
                             "give values of one line")
        envs[name] = values.split(",")
    return envs


def fa_list(text: str | None) -> list[bool | None]:
    from rocforge_build.errors import UsageError

    if not text:
        return [None]
    table = {"on": True, "1": True, "off": False, "0": False}
    try:
        return [table[x.strip().lower()] for x in text.split(",")]
    except KeyError:
        raise UsageError(f"--fa {text!r}: give on, off or on,off") from None


def threads_default() -> int:
    return os.cpu_count() or 1
