"""The backend-ops stage against hostile input: `--ops` values that are not op names (one line,
exit 2, nothing run), and a FAKE test-backend-ops (tests/data/backend_ops/fake-test-backend-ops,
a Python script) whose output is hostile: an 8 MiB line with no end, terminal control sequences,
garbage with no summary, more output than the stage reads.  Each ends in a failed stage in
bounded time and memory, never a traceback."""

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
