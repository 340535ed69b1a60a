"""The backend-ops stage against hostile input: `--ops` values that are not op names (one line,
exit 2, nothing run), and a FAKE test-backend-ops (tests/data/backend_ops/fake-test-backend-ops,
a Python script) whose output is hostile: an 8 MiB line with no end, terminal control sequences,
garbage with no summary, more output than the stage reads; and shell-script FAKEs (`_script`) for
lines a backtracking parse spends quadratic time on, C1 and bidi controls, and children the
program leaves behind holding its output.  Each ends in bounded time and memory, never a
traceback, and leaves nothing running.  Fast: seconds."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from rocforge_build import cli
from rocforge_build.measure import backend_ops

FAKE = Path(__file__).resolve().parent.parent / "data" / "backend_ops" / "fake-test-backend-ops"


@pytest.fixture
def prefix(tmp_path):
    where = tmp_path / "prefix"
    (where / "libexec").mkdir(parents=True)
    shutil.copy(FAKE, where / "libexec" / "test-backend-ops")
    return where


@pytest.mark.parametrize("value", [
    "MUL_MAT;rm -rf ~", "$(id)", ".*", "MUL_MAT,", "", "MUL MAT", "MUL_MAT\nADD", "-b", "A" * 65,
    "MUL_MAT,FLASH_ATTN_EXT,../x", "ＭUL_MAT", "MUL_MAT\x1b[2J",
])
def test_hostile_ops_value_is_one_line_and_runs_nothing(value, tmp_path, capsys):
    try:
        code = cli.main(["verify", str(tmp_path), "--model", str(tmp_path / "m.gguf"), "--ops", value])
    except SystemExit as stop:  # argparse's refusal of a bad value
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2
    first = err.strip().splitlines()[0]
    assert first.startswith("rocforge: error:") and "--ops" in first
    assert "Traceback" not in err and "\x1b" not in err


@pytest.mark.parametrize("mode, says", [
    ("garbage", "printed no summary"),
    ("huge-line", "printed no summary"),
])
def test_hostile_output_fails_the_stage_in_bounded_time(prefix, mode, says):
    t = time.monotonic()
    res = backend_ops.run(prefix, gpu=True, backend="vulkan", env={"FAKE_TBO": mode}, timeout=60)
    assert time.monotonic() - t < 30
    assert res.passed is False and says in res.problem
    assert all(len(line) <= backend_ops.MAX_LINE + 40 for line in res.output_tail)
    assert all("\x1b" not in line and "\x00" not in line for line in res.output_tail)


def test_control_sequences_in_a_case_line_do_not_reach_the_terminal(prefix):
    res = backend_ops.run(prefix, gpu=True, backend="vulkan", env={"FAKE_TBO": "controls"})
    text = "\n".join(res.lines())
    assert "GELU" in {f.op for f in res.failed_ops}
    assert "\x1b" not in text and "\x07" not in text


def test_output_past_the_cap_is_drained_not_kept(prefix, monkeypatch):
    monkeypatch.setattr(backend_ops, "MAX_OUTPUT", 1 << 16)
    res = backend_ops.run(prefix, gpu=True, backend="vulkan", env={"FAKE_TBO": "huge-line"}, timeout=60)
    assert res.passed is False  # 8 MiB written, 64 KiB kept: the program was never blocked


def test_a_program_that_is_not_test_backend_ops_is_no_pass(prefix):
    tool = prefix / "libexec" / "test-backend-ops"
    tool.write_text("#!/bin/sh\necho hello\n")
    res = backend_ops.run(prefix, gpu=True, backend="vulkan")
    assert res.passed is False and "no summary" in res.problem


@pytest.mark.parametrize("content, mode", [(b"#!/bin/sh\necho hi\n", 0o644), (b"\x7fELF garbage", 0o755)])
def test_a_program_that_does_not_start_is_one_line(prefix, content, mode):
    tool = prefix / "libexec" / "test-backend-ops"
    tool.write_bytes(content)
    tool.chmod(mode)
    with pytest.raises(backend_ops.BackendOpsError) as err:
        backend_ops.run(prefix, gpu=True, backend="vulkan")
    assert "does not start" in err.value.message and "\n" not in err.value.message


def _script(prefix: Path, body: str) -> None:
    """The prefix's test-backend-ops replaced by a shell script: a FAKE for output and process
    behaviour the real program never has (hostile lines, children left behind)."""
    tool = prefix / "libexec" / "test-backend-ops"
    tool.write_text("#!/bin/bash\n" + body + "\n")
    tool.chmod(0o755)


# Lines whose cost a backtracking case pattern makes quadratic (each ` A(` a start, each start
# scanning to the line's end): ~2000 characters each, the stage's line cap, as the red team sent.
QUADRATIC_LINES = [" A(" * 666, "A(" + "):x" * 666, " A():" * 400, "\x1b[" + "1" * 1990,
                   "B(" * 1000, " X(" + "(" * 1990 + "):"]


@pytest.mark.parametrize("line", QUADRATIC_LINES, ids=range(len(QUADRATIC_LINES)))
def test_a_hostile_line_costs_what_reading_it_costs(line):
    """3000 such lines (6 MiB) parse in well under a second where reading is linear; the old
    backtracking pattern took 101 s for the first kind (red team F6)."""
    t = time.monotonic()
    backend_ops.parse([backend_ops._clean(line)] * 3000)
    assert time.monotonic() - t < 3


def test_hostile_output_is_parsed_inside_the_deadline(prefix):
    """6 MiB of ` A( A( ...` lines and an ordinary exit: the stage ends well inside its 8 s."""
    _script(prefix, "python3 -c 'import sys; sys.stdout.write(\"Backend 1/1: ROCm0\\n\" + "
                    "(\" A(\" * 666 + \"\\n\") * 3150 + \"1/1 backends passed\\n\")'")
    t = time.monotonic()
    res = backend_ops.run(prefix, gpu=True, backend="hip", timeout=8)
    assert time.monotonic() - t < 8
    assert res.passed is False and "nothing was compared" in res.problem


def test_parsing_counts_inside_the_stage_deadline(prefix, monkeypatch):
    """A parse slower than the program (each line made to cost 10 ms): the stage still ends at
    its 1 s deadline, says its output was not all read, and does not pass."""
    import time as clock

    clean = backend_ops._clean

    def slow(line):
        clock.sleep(0.01)
        return clean(line)

    monkeypatch.setattr(backend_ops, "_clean", slow)
    _script(prefix, 'for i in $(seq 2000); do echo "  ADD(n=$i): OK"; done; echo "1/1 backends passed"')
    t = time.monotonic()
    res = backend_ops.run(prefix, gpu=True, backend="hip", timeout=1)
    assert time.monotonic() - t < 3
    assert res.passed is False and "still being read at the 1s limit" in res.problem


# What a terminal interprets in text it prints: C1 controls (U+009B is a one-byte CSI, U+009D an
# OSC, U+009C its end, U+0085 a line end) and the bidi controls that reorder a line (U+202E
# right-to-left override, U+2066 left-to-right isolate, U+2069 its end, U+200E a mark), beside
# the C0 ones (ESC, BEL, CR) and Unicode's line separator (U+2028).
TERMINAL_TRICKS = "\u009b\u009d\u009c\u0085\u202e\u2066\u2069\u200e\x1b\x07\r\u2028"


def _printable(texts) -> bool:
    return all(isinstance(t, str) and t.isprintable() for t in texts)


def test_c1_and_bidi_controls_in_the_output_reach_neither_terminal_nor_json(prefix):
    """Every such character, in a case line, a backend's name and the summary line, is gone from
    what verify prints and from the stage's JSON; the failing case is still counted and named."""
    tricks = "".join(f"\\u{ord(c):04x}" for c in TERMINAL_TRICKS)
    _script(prefix, "python3 -c '"
            'import sys; t = "' + tricks + '"; sys.stdout.write('
            '"Backend 1/1: ROCm0" + t + "\\n  MUL_MAT(type=" + t + "\\u009b2J): \\u009b31mFAIL\\n"'
            ' + "  1/1 tests passed" + t + "\\n1/1 backends passed" + t + "\\n")' + "'")
    res = backend_ops.run(prefix, gpu=True, backend="hip")
    assert [f.op for f in res.failed_ops] == ["MUL_MAT"] and res.cases_failed == 1
    stage = res.to_json()
    shown = [*res.lines(), *stage["output_tail"], *stage["backends"], stage["summary"],
             *(c for f in stage["failed_ops"] for c in f["cases"])]
    assert _printable(shown), [s for s in shown if not s.isprintable()]
    assert not set("".join(shown)) & set(TERMINAL_TRICKS)


def test_a_stored_stage_with_controls_prints_plain_lines():
    """verify prints `lines_of` a result's JSON, which may be a file a user was handed: its text
    fields are made plain there too."""
    bad = "x" + TERMINAL_TRICKS + "y"
    ran = {"ran": True, "passed": False, "why_not_run": "", "command": f"/p/{bad}/test-backend-ops test",
           "seconds": 1.0, "timeout_s": 60, "compares": bad, "backends": [bad], "ops_asked": [],
           "ops_tested": [bad], "cases_passed": 0, "cases_failed": 1, "cases_not_supported": 0,
           "failed_ops": [{"op": bad, "failed_cases": 1, "cases": [bad], "crashed": bad}],
           "exit_code": 1, "problem": bad, "summary": bad, "output_tail": [bad]}
    not_ran = {**ran, "ran": False, "why_not_run": bad}
    for stage in (ran, not_ran):
        lines = backend_ops.lines_of(stage)
        assert lines and _printable(lines), lines


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.parametrize("start", ["sleep 300 &", "(setsid sleep 300 &)"], ids=["in-its-group", "setsid"])
def test_a_child_left_behind_is_stopped_and_does_not_hold_the_stage(prefix, tmp_path, start):
    """The program starts `sleep 300` holding its output (in its own process group, or moved out
    with setsid) and exits: the stage returns at once, not at the sleep's end or a join's bound
    (the old stage waited 10 s and left it running), and the sleep is gone."""
    pids = tmp_path / "pids"
    _script(prefix, f"{start.replace('sleep 300 &', f'sleep 300 & echo $! >> {pids}')}\n"
                    'sleep 0.2; echo "Backend 1/1: ROCm0"; echo "  ADD(n=1): OK"; echo "1/1 backends passed"')
    t = time.monotonic()
    try:
        res = backend_ops.run(prefix, gpu=True, backend="hip", timeout=30)
        took = time.monotonic() - t
        left = [int(p) for p in pids.read_text().split()]
        deadline = time.monotonic() + 1.0  # SIGKILL sent: gone once the kernel has run it
        while any(_running(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert took < 2.5 and res.passed is True
        assert not [p for p in left if _running(p)]
    finally:
        import os
        import signal

        for p in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
            if _running(p):
                os.kill(p, signal.SIGKILL)
