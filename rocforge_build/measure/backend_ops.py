"""verify's backend-ops stage: llama.cpp's own test-backend-ops, which runs every ggml op of a
build's backend and compares it with the CPU backend, read into one result.

The program is the tree's own correctness suite (tests/test-backend-ops.cpp), built only on request
as a verify tool and installed under PREFIX/libexec/ (never on a user's PATH).  Its
console output is the same in every era read (llama-cpp-python 0.3.9 and 0.3.36 sdists): a case
line `OP(params): ... OK|FAIL|not supported`, per backend `N/M tests passed`, and at the end
`N/M backends passed`.  A crash of the program (a signal, an abort, a nonzero exit without that
summary) is a failed op named from its output: trees that print the case before running it
(0.3.9) leave its line unfinished; newer ones print a case after it ran, so the op is the one
after the last finished case (llama.cpp #24521: FLASH_ATTN_EXT on gfx1100).  A run is bounded by
a timeout; a hang is stopped and reported as such.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build.errors import UsageError
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.shellsafe import one_line

PROGRAM = "test-backend-ops"
# where a build keeps its verify tools (forge/pipeline.py VERIFY_TOOLS_DIR): not bin/, so that
# neither PATH nor a bundle's launcher offers them as programs to run; beside bin/, so the
# recipe's RPATH ($ORIGIN/../lib) finds the build's libraries from there too
TOOLS_DIR = Path("libexec")
DEFAULT_TIMEOUT = 1800  # seconds: a full run on a GPU takes minutes; a hang is stopped at this
MAX_OUTPUT = 64 << 20  # bytes of the program's output read; the rest is drained unread
MAX_LINE = 2000  # characters kept of one line (a case line is a few hundred)
MAX_CASES_LISTED = 20  # failing cases listed per op (the count says how many failed)
TAIL_LINES = 8  # last lines of the output kept in the result
POLL_S = 0.1  # seconds the reader waits for output before it looks at its deadline again
_OP_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
# Every pattern here is linear in the line: one quantifier each, possessive (`*+`) where a failed
# match could otherwise give back what it took, so no output (a 2000-character line of ` A( A(`)
# costs more than reading it; a case line is split with str.rfind, not a pattern (`_case`).
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-9;]*+[A-Za-z]")  # a colour: CSI as ESC [ or its C1 byte
_OP_AT = re.compile(r"(?<!\S)[A-Z][A-Z0-9_]*+\(")  # `OP(` at a line's start or after a space
_FA_VEC_FAIL = re.compile(r"^\s*FAIL fa_vec slice: ")
_BACKEND = re.compile(r"^Backend (\d+)/(\d+): (\S+)")
_TESTS_PASSED = re.compile(r"^\s*(\d+)/(\d+) tests passed")
_BACKENDS_PASSED = re.compile(r"^(\d+)/(\d+) backends passed")


class BackendOpsError(UsageError):
    """A bad --ops value, or a build without test-backend-ops when the stage was asked for."""


def parse_ops(text: str) -> tuple[str, ...]:
    """`MUL_MAT,FLASH_ATTN_EXT` as op names (letters, digits, underscore: what ggml_op_desc gives;
    anything else would reach the program's regex filter)."""
    names = [part.strip() for part in text.split(",")]
    bad = next((n for n in names if not _OP_NAME.fullmatch(n)), None)
    if bad is not None or not names:
        shown = repr(bad if bad is not None else text)[:80]  # repr: controls shown escaped
        raise BackendOpsError(f"--ops: {shown} is not an op name (letters, digits and '_', "
                              "comma-separated, e.g. MUL_MAT,FLASH_ATTN_EXT)")
    return tuple(dict.fromkeys(names))


def ops_argument(text: str) -> tuple[str, ...]:
    """`--ops` as argparse's `type`: a bad value is refused before anything runs, in one line."""
    from argparse import ArgumentTypeError

    try:
        return parse_ops(text)
    except BackendOpsError as exc:
        raise ArgumentTypeError(exc.message.removeprefix("--ops: ")) from None


def find_program(prefix: Path) -> Path | None:
    """The build's test-backend-ops: its verify tools directory (or bin/ for a build made by hand)."""
    for where in (prefix / TOOLS_DIR / PROGRAM, prefix / "bin" / PROGRAM):
        if where.is_file():
            return where
    return None


def cpu_has_reference(program: Path, prefix: Path) -> bool:
    """Whether this tree's test-backend-ops compares the CPU backend with the CPU backend's own
    reference kernels (newer trees ask for `ggml_backend_cpu_set_use_ref` by name, and the CPU
    backend library answers to it); older trees compare the CPU backend with itself."""
    needle = b"ggml_backend_cpu_set_use_ref"
    if needle not in _read_bytes(program):
        return False
    libs = sorted((prefix / "lib").glob("libggml-cpu*.so*")) + sorted((prefix / "lib").glob("libggml.so*"))
    return any(needle in _read_bytes(lib) for lib in libs if lib.is_file() and not lib.is_symlink()) \
        or _read_bytes(program).count(needle) > 1


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@dataclass
class FailedOp:
    """One op with failing cases; `crashed`: the program died (or hung) while running it."""

    op: str
    cases: list[str] = field(default_factory=list)
    failed_cases: int = 0
    crashed: str = ""  # "" or what the program did: "hung", "died (signal 6 (SIGABRT))"

    def to_json(self) -> dict:
        return {"op": self.op, "failed_cases": self.failed_cases, "cases": self.cases,
                **({"crashed": self.crashed} if self.crashed else {})}


@dataclass
class Parsed:
    """What one run's console output says."""

    backends: list[str] = field(default_factory=list)
    ok: int = 0
    not_supported: int = 0
    failed: dict[str, FailedOp] = field(default_factory=dict)
    ops: set[str] = field(default_factory=set)  # ops with at least one case compared
    summary: str = ""  # the last `N/M backends passed`
    backends_passed: tuple[int, int] | None = None
    tests_passed: list[str] = field(default_factory=list)
    running: tuple[str, str] | None = None  # a case line with no status yet: (op, line)
    last_done: tuple[str, str] | None = None  # the last case with a status: (op, line)
    lines: int = 0
    in_failing_list: bool = False  # inside newer trees' repeat of the failed cases

    def fail(self, op: str, line: str, crashed: str = "") -> None:
        entry = self.failed.setdefault(op, FailedOp(op))
        entry.failed_cases += 1
        if len(entry.cases) < MAX_CASES_LISTED:
            entry.cases.append(line)
        if crashed:
            entry.crashed = crashed

    def feed(self, line: str) -> None:
        """Read one line of the console output (already cleaned)."""
        self.lines += 1
        if line.startswith("Failing tests:"):  # newer trees repeat the failed cases: counted already
            self.in_failing_list = True
            return
        m = _BACKEND.match(line)
        if m:
            self.in_failing_list = False
            self.backends.append(m.group(3))
            return
        m = _TESTS_PASSED.match(line)
        if m:
            self.in_failing_list = False
            self.tests_passed.append(f"{m.group(1)}/{m.group(2)}")
            return
        m = _BACKENDS_PASSED.match(line)
        if m:
            self.backends_passed = (int(m.group(1)), int(m.group(2)))
            self.summary = line
            return
        if _FA_VEC_FAIL.match(line):  # newer trees' flash-attention vec slice, after the cases
            self.fail("FLASH_ATTN_EXT", line)
            return
        case = None if self.in_failing_list else _case(line)
        if case is None:
            return
        op, status = case
        if "not supported" in status or "skipping" in status:
            self.not_supported += 1
            self.running = None
        elif status.endswith("FAIL"):
            self.fail(op, line)
            self.ops.add(op)
            self.running, self.last_done = None, (op, line)
        elif status.endswith("OK"):
            self.ok += 1
            self.ops.add(op)
            self.running, self.last_done = None, (op, line)
        else:  # printed before it runs (older trees); its status has not come (yet)
            self.running = (op, line)


def _clean(line: str) -> str:
    """One line as it can be shown and stored: colours out, then the project's one sanitizer
    (`shellsafe.one_line`: C0 and C1 controls, bidi controls and line breaks each a space), and
    the length capped before the work, so a line costs at most MAX_LINE's worth whatever its size."""
    kept = line[:2 * MAX_LINE]
    shown = one_line(_ANSI.sub("", kept))
    if len(kept) == len(line) and len(shown) <= MAX_LINE:
        return shown
    return shown[:MAX_LINE] + f"... ({len(line)} characters)"


def _case(line: str) -> tuple[str, str] | None:
    """(op, status) of a case line `OP(params): STATUS`, the case at the line's start or after the
    error text newer trees print before it; None for any other line.  The params end at the last
    `):` followed by a space or the line's end, the op is the first `OP(` before it: linear, each
    character looked at a bounded number of times (str.rfind from the right, one pattern search)."""
    end = len(line)
    while True:
        close = line.rfind("):", 0, end)
        if close < 0:
            return None
        after = close + 2
        if after == len(line) or line[after].isspace():
            break
        end = close + 1  # a `):` inside the params: look further left
    op = _OP_AT.search(line, 0, close + 1)
    if op is None:
        return None
    return op.group()[:-1], line[after:].rstrip()


def parse(lines) -> Parsed:
    """Read the console output, line by line (each already cleaned)."""
    out = Parsed()
    for line in lines:
        out.feed(line)
    return out


@dataclass
class BackendOpsResult:
    """The stage's result; `passed` None: not run (`why_not_run` says why)."""

    ran: bool
    passed: bool | None
    commands: list[list[str]] = field(default_factory=list)  # one run, or one per op (older trees)
    seconds: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT
    why_not_run: str = ""
    compares: str = ""  # what against what
    backends: list[str] = field(default_factory=list)
    ops_tested: list[str] = field(default_factory=list)
    ops_asked: list[str] = field(default_factory=list)
    cases_passed: int = 0
    cases_failed: int = 0
    cases_not_supported: int = 0
    failed_ops: list[FailedOp] = field(default_factory=list)
    exit_code: int | None = None
    problem: str = ""  # a crash, a hang, a missing summary, nothing compared
    summary: str = ""
    output_tail: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        from rocforge_build.proc import quote

        return {"ran": self.ran, "passed": self.passed, "why_not_run": self.why_not_run,
                "command": "; ".join(quote(c) for c in self.commands), "seconds": round(self.seconds, 2),
                "timeout_s": self.timeout_s, "compares": self.compares, "backends": self.backends,
                "ops_asked": self.ops_asked, "ops_tested": self.ops_tested,
                "cases_passed": self.cases_passed, "cases_failed": self.cases_failed,
                "cases_not_supported": self.cases_not_supported,
                "failed_ops": [f.to_json() for f in self.failed_ops], "exit_code": self.exit_code,
                "problem": self.problem, "summary": self.summary, "output_tail": self.output_tail}

    def lines(self) -> list[str]:
        return lines_of(self.to_json())


def lines_of(stage: dict) -> list[str]:
    """The stage as verify's text output says it, from its JSON (what verify's result holds)."""
    if not stage["ran"]:
        return [one_line(f"backend ops: not run: {stage['why_not_run']}")]
    out = [f"backend ops ({PROGRAM}, {stage['compares']}): {'PASSED' if stage['passed'] else 'FAILED'} "
           f"in {stage['seconds']:.1f}s (timeout {stage['timeout_s']:g}s): {stage['cases_passed']} "
           f"cases passed, {stage['cases_failed']} failed, {stage['cases_not_supported']} not "
           f"supported, {len(stage['ops_tested'])} ops"]
    if stage["problem"]:
        out.append(f"  {stage['problem']}")
    for f in stage["failed_ops"]:
        out.append(f"  {f['op']}: {f['failed_cases']} failing case(s)"
                   + (f" (the program {f['crashed']})" if f.get("crashed") else ""))
        out += [f"    {c}" for c in f["cases"][:5]]
        if f["failed_cases"] > 5:
            out.append(f"    ... and {f['failed_cases'] - 5} more (--json lists {len(f['cases'])})")
    out.append(f"  command: {stage['command']}")
    # the JSON may be a stored result a user was handed: every line through the one sanitizer
    return [" " * (len(line) - len(line.lstrip(" "))) + one_line(line) for line in out]


def not_run(why: str, timeout: float = DEFAULT_TIMEOUT) -> BackendOpsResult:
    return BackendOpsResult(ran=False, passed=None, why_not_run=why, timeout_s=timeout)


@dataclass(frozen=True)
class StageAsked:
    """The stage as asked: `--backend-ops` (True), `--no-backend-ops` (False) or neither (None),
    `--ops` (the stage on these ops only) and `--backend-ops-timeout` (None: DEFAULT_TIMEOUT)."""
    on: bool | None = None
    ops: tuple[str, ...] = ()
    timeout: float | None = None


def stage_for(build: LlamaBuild, asked: StageAsked, *, quick: bool, env: dict,
              progress=None) -> BackendOpsResult | None:
    """The stage's result on `build`, or None when it is not run: turned off, `--quick`, or the
    build lacks the program and the stage was not asked for."""
    if asked.on is False and asked.ops:
        raise BackendOpsError("--ops needs the backend-ops stage, which --no-backend-ops turns off")
    have = find_program(build.prefix) is not None
    if not (asked.on or asked.ops) and (asked.on is False or quick or not have):
        return None
    return run(build.prefix, gpu=build.gpu, backend=build.backend, ops=asked.ops,
               timeout=asked.timeout or DEFAULT_TIMEOUT, env={**build.runtime_env, **env},
               progress=progress)


def with_stage(build: LlamaBuild, result: dict, stage: BackendOpsResult | None, model: str,
               reference: str) -> dict:
    """verify's result with the stage's: a failing stage fails verify (and its recorded verdict)."""
    if stage is None:
        return result
    result = {**result, "backend_ops": stage.to_json()}
    if stage.passed is False and result["passed"]:
        from rocforge_build.discover import choices

        result["passed"] = False
        choices.record_verify(build.prefix, build.stamp, False, model=model, reference=reference)
    return result


def _signal_name(code: int) -> str:
    import signal

    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


class _Reader(threading.Thread):
    """Reads the program's output in blocks (never a whole line unbounded) and parses it as it
    comes, so the parse's time is spent inside the stage's deadline, not after it: keeps the
    parse and the last lines, at most MAX_OUTPUT bytes read into them, the rest drained unread so
    the program never blocks.  Stops at EOF, at `stop_by`, or once `ending` is set and the pipe
    has nothing more; it alone closes the pipe, and after `close()` it changes nothing."""

    def __init__(self, stream, stop_by: float):
        super().__init__(daemon=True)
        self.stream = stream
        self.stop_by = stop_by  # time.monotonic() past which output is no longer read
        self.parsed = Parsed()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.partial = b""
        self.taken = 0
        self.dropped = 0
        self.cut_short = False  # stopped at stop_by with output still coming
        self.ending = threading.Event()  # the program and its group are gone: read what is left
        self._lock = threading.Lock()
        self._closed = False

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.stream.fileno(), select.POLLIN)
        try:
            while True:
                if time.monotonic() >= self.stop_by:  # cut short if output is still waiting
                    self.cut_short = bool(poller.poll(0))
                    break
                if not poller.poll(POLL_S * 1000):
                    if self.ending.is_set():  # nothing left in the pipe, and no writer of ours
                        break
                    continue
                try:
                    block = os.read(self.stream.fileno(), 1 << 16)
                except OSError:
                    break
                if not block or not self._take(block):
                    break
            self._take(b"", last=True)
        finally:
            self.stream.close()

    def _take(self, block: bytes, last: bool = False) -> bool:
        """Parse a block (or, `last`, the unfinished line); False once closed or past stop_by."""
        with self._lock:
            if self._closed:
                return False
            if self.taken >= MAX_OUTPUT and not last:
                self.dropped += len(block)
                return True
            self.taken += len(block)
            *whole, self.partial = (self.partial + block).split(b"\n")
            if last or len(self.partial) > 4 * MAX_LINE:  # a line without end: keep its start only
                whole.append(self.partial)
                self.partial = b""
            for raw in whole:
                if not last and time.monotonic() >= self.stop_by:  # the parse ends there too
                    self.cut_short = True
                    return False
                if raw or not last:
                    line = _clean(raw.decode("utf-8", "replace"))
                    self.parsed.feed(line)
                    self.tail.append(line)
            return True

    def close(self) -> tuple[Parsed, list[str], bool]:
        """(parse, last lines, cut short): what was read, never touched by this thread again."""
        with self._lock:
            self._closed = True
            return self.parsed, list(self.tail), self.cut_short or self.is_alive()


def run(prefix: Path, *, gpu: bool, backend: str, ops: tuple[str, ...] = (),
        timeout: float = DEFAULT_TIMEOUT, env: dict | None = None, progress=None) -> BackendOpsResult:
    """The stage on one build: test-backend-ops in test mode over the build's backend (every
    non-CPU device it finds), narrowed to `ops`; a CPU build only where the tree compares the CPU
    backend with its reference kernels."""
    from rocforge_build import proc

    program = find_program(prefix)
    if program is None:
        raise BackendOpsError(
            f"{prefix} has no {PROGRAM} (a verify tool built only on request)",
            f"rebuild with it: rocforge build llama-cpp ... --cmake-target {PROGRAM} beside the "
            "programs you use; or drop --backend-ops/--ops")
    argv = [str(program), "test"]
    if gpu:
        compares = f"{backend} against the CPU backend"
    elif cpu_has_reference(program, prefix):
        argv += ["-b", "CPU"]
        compares = "the CPU backend against its reference kernels"
    else:
        return not_run("the CPU backend is the reference: this tree's test-backend-ops compares "
                       "the CPU backend only with itself", timeout)
    if not ops:
        runs = [argv]
    elif len(ops) == 1 or _takes_op_list(program):
        runs = [[*argv, "-o", ",".join(ops)]]
    else:  # older trees take one exact op name per run
        runs = [[*argv, "-o", op] for op in ops]
    if progress:
        progress(f"{PROGRAM}: {compares}" + (f", ops {', '.join(ops)}" if ops else "")
                 + f" (at most {timeout:g}s)")
    started = time.monotonic()
    deadline = started + timeout
    parsed, problems, code, tail = Parsed(), [], None, []
    for one in runs:
        done = _run_bounded(one, max(time.monotonic() + 1.0, deadline), {**proc.merged_env(env or {})})
        got, code, how = done.parsed, done.exit_code, done.how
        _merge(parsed, got)
        tail = done.tail
        problem, crash = _judge(got, code, how, timeout)
        if done.cut_short:
            problem = "; ".join(filter(None, [problem, (
                f"{PROGRAM}'s output was still being read at the {timeout:g}s limit "
                f"({done.bytes_read} bytes read): the rest was not judged")]))
        problems += [problem] if problem else []
        if crash:
            _blame(parsed, got, crash)
        if how == "hung" or done.cut_short:
            break
    seconds = time.monotonic() - started
    problem = "; ".join(problems)
    if not problem and not parsed.ok and not parsed.failed:
        problem = _nothing_compared(parsed, gpu, ops)
    passed = not problem and not parsed.failed
    return BackendOpsResult(
        ran=True, passed=passed, commands=runs,
        seconds=seconds, timeout_s=timeout, compares=compares, backends=parsed.backends,
        ops_tested=sorted(parsed.ops), ops_asked=list(ops), cases_passed=parsed.ok,
        cases_failed=sum(f.failed_cases for f in parsed.failed.values()),
        cases_not_supported=parsed.not_supported, failed_ops=list(parsed.failed.values()),
        exit_code=code, problem=problem, summary=parsed.summary, output_tail=tail)


def _nothing_compared(parsed: Parsed, gpu: bool, ops: tuple[str, ...]) -> str:
    """Why a run that ended well compared nothing: never a pass."""
    if gpu and all(b.startswith("CPU") for b in parsed.backends):
        return (f"nothing was compared: {PROGRAM} found no device but the CPU "
                f"({', '.join(parsed.backends) or 'none listed'}); the GPU's driver is not visible here")
    if ops:
        return (f"nothing was compared: no case of {', '.join(ops)} ran on "
                f"{', '.join(parsed.backends) or 'any device'} (no such op in this tree, or none supported)")
    return f"nothing was compared: no case ran on {', '.join(parsed.backends) or 'any device'}"


def _takes_op_list(program: Path) -> bool:
    """Newer trees take `-o A,B` (their usage says "comma separated"); older ones one op per run."""
    return b"comma separated list of exact op names" in _read_bytes(program)


@dataclass
class _Run:
    """One run of the program: its parsed output, last lines, exit code and how it ended."""

    parsed: Parsed
    tail: list[str]
    exit_code: int | None
    how: str  # "" or "hung"
    cut_short: bool  # its output was still being read at the deadline
    bytes_read: int


def _run_bounded(argv: list[str], deadline: float, env: dict) -> _Run:
    """One run, stdout and stderr together as they interleave, parsed as it runs; the program is
    stopped at `deadline` (time.monotonic()), and so is the reading of its output.  Whenever it
    ends, its whole process group and every process still holding its output pipe end with it,
    and the stage reads no further, so nothing it started outlives the stage or holds it up."""
    from rocforge_build import proc

    try:
        child = proc.spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:  # not executable, not a program for this machine
        raise BackendOpsError(f"{argv[0]} does not start: {exc.strerror or exc}",
                              f"rebuild it: rocforge build llama-cpp ... --cmake-target {PROGRAM}") from None
    stream, child.stdout = child.stdout, None  # the reader's alone: stop_group closes child.stdout
    pipe = _pipe_name(stream)
    reader = _Reader(stream, deadline)
    reader.start()
    how = ""
    try:
        with proc.reaped(child):
            if not _ended_by(child, deadline):
                how = "hung"
            # ended or hung, its group goes: a child it left (`cmd &`) would hold the pipe open and
            # run on; SIGTERM, then SIGKILL at once where it did not hang (nothing to finish)
            proc.stop_group(child, grace=2.0 if how else 0.0)
    finally:
        # whoever still holds the pipe's write end was started by the program and left its group
        # (`setsid cmd &`): it is stopped too.  One that let go of the pipe as well (a daemon) is
        # out of reach without a cgroup; the reader stops anyway once the pipe is empty (`ending`)
        if pipe:
            proc._kill_holders(pipe)
        reader.ending.set()
        reader.join(max(0.0, deadline - time.monotonic()) + 2 * POLL_S)
        parsed, tail, cut_short = reader.close()
    return _Run(parsed, tail, None if how else child.returncode, how, cut_short, reader.taken)


def _pipe_name(stream) -> str | None:
    """The output pipe as /proc shows it (`pipe:[INODE]`), to find who else holds it."""
    try:
        return os.readlink(f"/proc/self/fd/{stream.fileno()}")
    except (OSError, ValueError):
        return None


def _ended_by(child, deadline: float) -> bool:
    """Whether the program ended by `deadline`; it is left unreaped (a zombie), so its pid, which
    is its group's id, cannot name another process's group when stop_group signals it."""
    while True:
        try:
            if os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.02, left))


def _judge(got: Parsed, code: int | None, how: str, timeout: float) -> tuple[str, str]:
    """(problem, crash) of one run: crash is "" or what happened ("hung", "died (SIGABRT)")."""
    if how == "hung":
        return (f"{PROGRAM} ran over its {timeout:g}s and was stopped (a hang; "
                "--backend-ops-timeout raises the limit)", "hung")
    if code is not None and code < 0:
        return f"{PROGRAM} died: {_signal_name(code)}", f"died ({_signal_name(code)})"
    if got.backends_passed is None:
        if code:
            return (f"{PROGRAM} ended with exit code {code} without its summary (a crash)",
                    f"died (exit code {code}, no summary)")
        return f"{PROGRAM} printed no summary (`N/M backends passed`): not the output it prints", ""
    if code and not got.failed:
        return f"{PROGRAM} exited with code {code} but listed no failing case", ""
    return "", ""


def _blame(total: Parsed, got: Parsed, crash: str) -> None:
    """The op the program was running when it died or hung: its unfinished case line where the
    tree prints one before running it, else the case after the last one it finished."""
    if got.running:
        op, line = got.running
        total.fail(op, f"{line}  <- running when the program {crash}", crash)
    elif got.last_done:
        op, line = got.last_done
        total.fail(op, f"(the case after) {line}  <- the last case finished before the program {crash}",
                   crash)
    else:
        op = "(before any case)"
        total.fail(op, f"the program {crash} before it finished a case", crash)
    total.ops.add(op)


def _merge(total: Parsed, got: Parsed) -> None:
    total.backends += [b for b in got.backends if b not in total.backends]
    total.ok += got.ok
    total.not_supported += got.not_supported
    total.ops |= got.ops
    for op, f in got.failed.items():
        mine = total.failed.setdefault(op, FailedOp(op))
        mine.failed_cases += f.failed_cases
        mine.cases += f.cases[:MAX_CASES_LISTED - len(mine.cases)]
    total.summary = got.summary or total.summary
