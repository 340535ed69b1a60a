"""measure/store.py, the results store: its failure modes done for real (a database locked by
another writer, a corrupt file, a directory in its place, a full disk in a child under
RLIMIT_FSIZE), each one error line with nothing lost; and presets kept as a history per model
(numbered per model, picked by a version, a name two models share refused until one is named)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_measure_proof import preset
from tiny_gguf import write as write_gguf
from trust_helpers import one_error_line

from rocforge_build import cli
from rocforge_build.measure import gguf
from rocforge_build.measure.store import Store

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", byte_tokens=True)


def test_locked_database_is_one_line_and_keeps_rows(tmp_path, model, monkeypatch, capsys):
    # another process writing (WAL lets readers through; a second writer waits, then gives up)
    db = tmp_path / "r.sqlite3"
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(db))
    with Store() as s:
        rid = s.start_run("bench")
        s.add_row(rid, "bench", {"prefix": "/p", "t_s": 1.0, "status": "ok"})
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setenv("ROCFORGE_RESULTS_TIMEOUT", "0.2")
    prefix = tmp_path / "build"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "llama-bench").write_text("#!/bin/sh\nexit 99\n")  # must never run
    assert cli.main(["bench", str(prefix), "--model", str(model), "--no-gate"]) == 11
    assert "is locked by another process" in one_error_line(capsys)
    assert cli.main(["results", "list"]) == 0  # readers still read
    holder.execute("ROLLBACK")
    holder.close()
    assert cli.main(["results", "export", "--json"]) == 0
    assert '"t_s": 1.0' in capsys.readouterr().out


def test_corrupt_database_is_one_line_and_untouched(tmp_path, monkeypatch, capsys):
    db = tmp_path / "r.sqlite3"
    db.write_bytes(b"this is not sqlite" * 100)
    before = db.read_bytes()
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(db))
    assert cli.main(["results", "list"]) == 11
    line = one_error_line(capsys)
    assert "corrupt or not a SQLite file" in line and "leaves it untouched" in line
    assert db.read_bytes() == before


def test_unopenable_database_is_not_called_corrupt(tmp_path, monkeypatch, capsys):
    # a directory where the database should be: SQLite cannot open it, but nothing is corrupt
    db = tmp_path / "r.sqlite3"
    db.mkdir()
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(db))
    assert cli.main(["results", "list"]) == 11
    line = one_error_line(capsys)
    assert f"{db} is a directory, not a regular file" in line and "corrupt" not in line


def test_full_disk_is_one_line_and_keeps_rows(tmp_path):
    # a real write limit (RLIMIT_FSIZE) in a child: SQLite's write fails part way through a run
    db = tmp_path / "r.sqlite3"
    code = f"""
import resource, signal, sys
sys.path.insert(0, {str(REPO)!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from rocforge_build import cli
from rocforge_build.measure.store import Store
s = Store({str(db)!r})
rid = s.start_run("bench")
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    for i in range(100_000):
        s.add_row(rid, "bench", {{"prefix": "/p", "i": i, "pad": "x" * 2000}})
except Exception as exc:
    sys.exit(cli._fail(exc.message, exc.hint, exc.exit_code))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 10, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("rocforge: error: cannot write the results database") and len(lines) == 2
    kept = sqlite3.connect(db).execute("SELECT COUNT(*) FROM rows").fetchone()[0]
    assert kept > 0  # every row committed before the failure is still there


def test_presets_are_a_history_per_model_and_use_picks_a_version(capsys):
    with Store() as s:
        v1 = s.add_preset("m", "ab" * 32, 1, preset(score=1.0))
        assert s.add_preset("other", "cd" * 32, 2, preset(model="other")) == 1  # the other model's own 1
        v2 = s.add_preset("m", "ab" * 32, 3, preset(score=2.0))
    assert (v1, v2) == (1, 2)  # m's own numbers, whatever was stored between them
    assert cli.main(["preset", "history", "m", "--json"]) == 0
    hist = json.loads(capsys.readouterr().out)
    assert [(h["version"], h["run_id"], h["in_use"]) for h in hist] == [(1, 1, False), (2, 3, True)]
    assert cli.main(["preset", "use", "m", "1"]) == 0
    assert "m (sha256 abababababab): preset version 1" in capsys.readouterr().out
    assert cli.main(["preset", "show", "m", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["version"], shown["in_use"], shown["ranges"]["short"]["score"]) == (1, "chosen", 1.0)
    assert cli.main(["preset", "show", "other", "--json"]) == 0  # m's choice is m's alone
    assert json.loads(capsys.readouterr().out)["in_use"] == "newest"
    assert cli.main(["preset", "use", "m", "3"]) == 2  # 3 is a row of the table, not a version of m
    assert "m has no preset version 3" in capsys.readouterr().err


def test_two_models_sharing_a_name_have_their_own_histories(tmp_path, capsys):
    from rocforge_build.measure import provenance

    paths = []
    for quant, seed in (("q4", 0), ("q8", 1)):
        (tmp_path / quant).mkdir()
        paths.append(write_gguf(tmp_path / quant / "model.gguf", seed=seed))
    # one name (as two quantizations of one model share general.name), two files
    assert gguf.check(paths[0]).name == gguf.check(paths[1]).name == "model"
    q4, q8 = (provenance.model_sha256(p) for p in paths)
    with Store() as s:
        for sha, path, score, version in ((q4, paths[0], 4.0, 1), (q8, paths[1], 8.0, 1), (q8, paths[1], 8.5, 2)):
            p = preset("model", score=score)
            p["model"].update(sha256=sha, path=str(path))
            assert s.add_preset("model", sha, None, p) == version
    for argv in (["preset", "show", "model"], ["preset", "history", "model"], ["preset", "use", "model", "1"],
                 ["preset", "export", "model", "--format", "shell"], ["serve", "model", "--dry-run"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert err == [f"rocforge: error: 'model' names 2 models with presets: {q4[:12]} ({paths[0]}), "
                       f"{q8[:12]} ({paths[1]})",
                       "rocforge: hint: pick one: pass its GGUF path or its sha256 (the first 12 hex digits "
                       "are enough)"], argv
    # the path, the sha256 or its first 12 hex digits pick one history
    assert cli.main(["preset", "show", str(paths[0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranges"]["short"]["score"] == 4.0
    assert cli.main(["preset", "history", q8[:12], "--json"]) == 0
    assert [(h["version"], h["data"]["ranges"]["short"]["score"]) for h in json.loads(capsys.readouterr().out)] == [
        (1, 8.0), (2, 8.5)]
    assert cli.main(["preset", "use", q8, "1"]) == 0
    capsys.readouterr()
    for path, score in ((paths[1], 8.0), (paths[0], 4.0)):  # q8's choice leaves q4's newest in use
        assert cli.main(["preset", "show", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["ranges"]["short"]["score"] == score
    assert cli.main(["preset", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"model  sha256 {q4[:12]}  1 version(s)  {paths[0]}",
                                                    f"model  sha256 {q8[:12]}  2 version(s)  {paths[1]}"]
