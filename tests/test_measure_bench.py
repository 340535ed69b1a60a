"""measure/bench.py: builds compared side by side are measured variant by variant, back to back,
so a load that starts part-way through a run reaches both sides (all of one build and then all of
the other put it on one side only: an upgrade's bench gate measured the same code 84 % slower,
tests/journeys/test_upgrade_journey.py, 2026-11-29).  Fake llama-bench programs that log each call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_gguf import write as write_gguf

from rocforge_build import cli

LINES = ('{"n_prompt": 32, "n_gen": 0, "n_depth": 0, "avg_ts": 100.0, "stddev_ts": 1.0}\n'
         '{"n_prompt": 0, "n_gen": 8, "n_depth": 0, "avg_ts": 10.0, "stddev_ts": 0.1}\n')


@pytest.fixture
def db(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "data"))


def logging_build(where: Path, name: str, log: Path) -> Path:
    """A prefix whose llama-bench appends `NAME -ub N` to `log` and prints two results."""
    prefix = where / name
    (prefix / "bin").mkdir(parents=True)
    out = where / f"{name}.jsonl"
    out.write_text(LINES)
    exe = prefix / "bin" / "llama-bench"
    exe.write_text("#!/bin/sh\nub=none\nwhile [ $# -gt 0 ]; do [ \"$1\" = -ub ] && ub=$2; shift; done\n"
                   f"echo \"{name} $ub\" >> {log}\ncat {out}\n")
    exe.chmod(0o755)
    return prefix


def test_two_builds_are_measured_variant_by_variant(tmp_path, db, capsys):
    log = tmp_path / "calls.log"
    a, b = logging_build(tmp_path, "current", log), logging_build(tmp_path, "candidate", log)
    model = write_gguf(tmp_path / "m.gguf")
    code = cli.main(["bench", str(a), str(b), "--model", str(model), "--no-gate", "--no-warmup", "--ubatch",
                     "256,512", "--reps", "1", "-p", "32", "-n", "8", "--json"])
    assert code == 0, capsys.readouterr().err
    assert log.read_text().splitlines() == ["current 256", "candidate 256", "current 512", "candidate 512"]
    rows = json.loads(capsys.readouterr().out)
    assert [(Path(r["prefix"]).name, r["test"]) for r in rows] == [  # stored as they ran
        ("current", "pp"), ("current", "tg"), ("candidate", "pp"), ("candidate", "tg")] * 2

