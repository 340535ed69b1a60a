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
