"""Hostile and broken inputs to the measuring commands (verify, bench, tune, results, preset),
each performed for real: a SQLite database of someone else's at the store path, rows edited to
invalid JSON, run numbers past SQLite's integers, numeric flags out of range, a FIFO or a
directory as the model, crafted GGUF headers, llama-bench printing null fields, and plot outputs
that are someone else's file or a link.  Each asserts one error line, the documented exit code
and that nothing was run, written or lost."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import struct
import threading
from pathlib import Path

import pytest
from tiny_gguf import ARRAY, FLOAT32, INT32, STRING, UINT32, gguf_string, raw
from tiny_gguf import write as write_gguf
from trust_helpers import never_run_prefix, run

from rocforge_build.measure.store import APPLICATION_ID, SCHEMA_VERSION, Store


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", byte_tokens=True)


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "results.sqlite3"
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(path))
    return path


def one_error(err: str) -> str:
    """The single error line (`rocforge: error:` or, for a flag, `rocforge CMD: error:`)."""
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 5. the results store ---------------------------------------------------------------------------
def foreign_database(path: Path) -> None:
    """Someone else's SQLite file (say an address book) in the default rollback journal mode."""
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE contacts (name TEXT, phone TEXT);"
                      "INSERT INTO contacts VALUES ('Ada', '555-0100');")
    con.commit()
    con.close()


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path, db, model, capsys):
    foreign_database(db)
    before = digest(db)
    prefix, marker = never_run_prefix(tmp_path)
    for argv in (("results", "list"), ("results", "show"), ("preset", "list"),
                 ("bench", prefix, "--model", model, "--no-gate")):
        code, _, err = run(capsys, *argv)
        assert code == 11, (argv, err)
        line = one_error(err)
        assert "rocforge did not make" in line and "contacts" in line
    assert not marker.exists()
    assert digest(db) == before  # byte for byte
    assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    assert [n for (n,) in con.execute("SELECT name FROM sqlite_master")] == ["contacts"]
    assert con.execute("SELECT * FROM contacts").fetchall() == [("Ada", "555-0100")]


def test_foreign_database_with_rocforges_table_names_and_another_id_is_refused(db, capsys):
    # same table names, but another program stamped it with its own application id
    con = sqlite3.connect(db)
    con.executescript("PRAGMA application_id = 1234; CREATE TABLE runs (x); CREATE TABLE rows (y);")
    con.close()
    before = digest(db)
    code, _, err = run(capsys, "results", "list")
    assert code == 11 and "application id is 0x4d2" in one_error(err)
    assert digest(db) == before


@pytest.mark.parametrize("content", [b"hello", b"SQLite format 3\0" + b"\xff" * 200,
                                     b"not sqlite at all" * 300])
def test_non_sqlite_file_at_the_store_path_is_refused_and_untouched(db, capsys, content):
    db.write_bytes(content)
    code, _, err = run(capsys, "results", "list")
    assert code == 11 and "not a SQLite file" in one_error(err)
    assert db.read_bytes() == content


def test_rocforges_own_database_is_used_again(db, capsys):
    with Store() as s:
        s.add_row(s.start_run("bench", ["bench"]), "bench", {"prefix": "/p", "t_s": 1.0, "status": "ok"})
    assert sqlite3.connect(db).execute("PRAGMA application_id").fetchone()[0] != 0  # stamped
    code, out, _ = run(capsys, "results", "list")
    assert code == 0 and "1 rows" in out


# the tables an earlier rocforge made (before PRAGMA application_id and per-model preset versions)
OLD_TABLES = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL, argv TEXT, info TEXT);
CREATE TABLE rows (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    kind TEXT NOT NULL, prefix TEXT, stamp TEXT, model_sha256 TEXT, status TEXT NOT NULL,
    created TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX rows_prefix ON rows(prefix, kind);
CREATE TABLE presets (id INTEGER PRIMARY KEY, model TEXT NOT NULL, model_sha256 TEXT,
    run_id INTEGER, created TEXT NOT NULL, data TEXT NOT NULL);
"""


def test_database_made_before_the_stamp_is_still_rocforges(db, capsys):
    # the tables an earlier rocforge made, without PRAGMA application_id: still readable
    con = sqlite3.connect(db, isolation_level=None)
    con.executescript(OLD_TABLES + """
INSERT INTO runs VALUES (1, 'bench', '2025-01-01T00:00:00Z', NULL, 'done', '["bench"]', '{}');
""")
    con.close()
    for _ in range(2):  # and again, once this rocforge has added its tables (preset_choice)
        code, out, err = run(capsys, "results", "list")
        assert code == 0, err
        assert "bench" in out and "done" in out
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID  # claimed: stamped
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def stored_preset(n: int) -> str:
    """A preset row's data as tune writes it (the store's schema holds every row it reads back),
    marked with `n` to tell the versions apart."""
    import json

    r = {"prefix": "/p", "backend": "cpu", "depth": 0, "ctx": 4096, "variant_label": "v",
         "score": 1.0, "figures": [], "env": {}, "argv": ["/p/bin/llama-server"], "notes": []}
    return json.dumps({"model": {"name": "m", "sha256": "a" * 64, "path": "/m.gguf"},
                       "created": "t", "ranges": {"short": r}, "n": n})


OLD_PRESETS = f"""
PRAGMA application_id = {APPLICATION_ID};
{OLD_TABLES}CREATE TABLE preset_choice (model_sha256 TEXT PRIMARY KEY, preset_id INTEGER NOT NULL
    REFERENCES presets(id), chosen TEXT NOT NULL);
INSERT INTO presets VALUES (1, 'm', '{"a" * 64}', 1, 't1', '{stored_preset(1)}');
INSERT INTO presets VALUES (2, 'm', '{"b" * 64}', 2, 't2', '{stored_preset(2)}');
INSERT INTO presets VALUES (3, 'm', '{"a" * 64}', 3, 't3', '{stored_preset(3)}');
INSERT INTO presets VALUES (4, 'm', '{"a" * 64}', 4, 't4', '{stored_preset(4)}');
INSERT INTO preset_choice VALUES ('{"a" * 64}', 3, 't5');
"""


def test_presets_of_the_shared_numbering_are_numbered_per_model_once(db):
    # schema 0 (user_version 0): versions were the table's row ids, shared by every model, and
    # `preset use` recorded the row id; two quantizations shared the name 'm'
    con = sqlite3.connect(db, isolation_level=None)
    con.executescript(OLD_PRESETS)
    con.close()
    for _ in range(2):  # the second open finds schema 1 and changes nothing
        with Store() as s:
            a = s.preset_history("a" * 64)
            assert [(h.version, h.to_json()["data"]["n"]) for h in a] == [(1, 1), (2, 3), (3, 4)]
            assert [(h.version, h.to_json()["data"]["n"]) for h in s.preset_history("b" * 12)] == [(1, 2)]
            # the choice of row 3 is still that row: a's version 2 now
            assert {k: s.preset("a" * 64).to_json()[k] for k in ("n", "version", "in_use")} == {
                "n": 3, "version": 2, "in_use": "chosen"}
    with Store() as s:
        assert s.add_preset("m", "a" * 64, 5, {"n": 5}) == 4 and s.add_preset("m", "c" * 64, 6, {}) == 1
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1


def test_a_store_of_a_newer_schema_is_refused_and_untouched(db, capsys):
    con = sqlite3.connect(db, isolation_level=None)
    con.executescript(OLD_PRESETS + f"PRAGMA user_version = {SCHEMA_VERSION + 1};")
    con.close()
    before = digest(db)
    code, _, err = run(capsys, "preset", "show", "m")
    line = one_error(err)
    assert code == 11 and f"written by a newer rocforge (schema version {SCHEMA_VERSION + 1}" in line
    assert digest(db) == before


@pytest.mark.parametrize("column,value,argv,named", [
    ("rows.data", "{not json", ("results", "show", "1"), "row 2 of run 1"),
    ("rows.data", "[1, 2]", ("results", "export", "--json"), "row 2 of run 1"),
    ("rows.data", "\"text\"", ("results", "compare", "1", "1"), "row 2 of run 1"),
    ("runs.argv", "{broken", ("results", "list"), "run 1's argv"),
    ("runs.info", "nul\0l", ("results", "show", "1"), "run 1's info"),
    ("presets.data", "{{", ("preset", "show", "m"), "preset 1"),
])
def test_row_with_invalid_json_is_named_in_one_line(db, capsys, column, value, argv, named):
    with Store() as s:
        rid = s.start_run("bench", ["bench"])
        for t_s in (1.0, 2.0):
            s.add_row(rid, "bench", {"prefix": "/p", "test": "pp", "n_prompt": 512, "depth": 0,
                                     "t_s": t_s, "status": "ok"})
        s.add_preset("m", "ab" * 32, rid, {"ranges": {}})
    table, col = column.split(".")
    con = sqlite3.connect(db, isolation_level=None)
    con.execute(f"UPDATE {table} SET {col} = ? WHERE id = ?", (value, 2 if table == "rows" else 1))
    con.close()
    before = digest(db)
    code, _, err = run(capsys, *argv)
    line = one_error(err)
    assert code == 11 and named in line and "rocforge leaves it untouched" in line
    assert digest(db) == before


@pytest.mark.parametrize("argv", [("results", "show", "99999999999999999999999"),
                                  ("results", "show", str(2 ** 63)),
                                  ("results", "export", "--json", "--run", str(2 ** 63)),
                                  ("results", "plot", "--run", "1" + "0" * 30, "-o", "p.html"),
                                  ("results", "show", "0")])
def test_run_number_past_sqlite_integers_is_a_usage_line(db, capsys, argv):
    code, _, err = run(capsys, *argv)
    line = one_error(err)
    assert code == 2 and ("argument RUN" in line or "argument --run" in line), line
    assert not db.exists()  # refused while parsing: the store was not even opened


def test_compare_with_a_huge_run_number_says_there_is_no_such_run(db, capsys):
    with Store() as s:
        s.start_run("bench")
    code, _, err = run(capsys, "results", "compare", "99999999999999999999999", "1")
    assert code == 2 and "run 99999999999999999999999 has no bench results" in one_error(err)
    code, _, err = run(capsys, "results", "compare", "/p@99999999999999999999999", "1")
    assert code == 2 and "no bench results" in one_error(err)


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e999"])
def test_results_timeout_variable_out_of_range_is_one_line(db, capsys, monkeypatch, value):
    monkeypatch.setenv("ROCFORGE_RESULTS_TIMEOUT", value)
    code, _, err = run(capsys, "results", "list")
    assert code == 2 and "ROCFORGE_RESULTS_TIMEOUT" in one_error(err)
    assert not db.exists()


# -- 6. numeric flags ---------------------------------------------------------------------------------
BAD_FLAGS = [
    ("bench", "--timeout", "inf"), ("bench", "--timeout", "-5"), ("bench", "--timeout", "nan"),
    ("bench", "--timeout", "0"), ("bench", "--reps", "0"), ("bench", "--reps", "x"),
    ("bench", "--ubatch", "0"), ("bench", "--ubatch", "512,-1"), ("bench", "--threads", "0"),
    ("bench", "--n-prompt", "-1"), ("bench", "--depth", "-4"), ("bench", "--ctx", "0"),
    ("tune", "--timeout", "inf"), ("tune", "--reps", "0"), ("tune", "--ubatch", "0"),
    ("tune", "--threads", "-2"), ("tune", "--jobs", "0"), ("tune", "--n-gen", "-1"),
    ("verify", "--ctx", "512,0"),
    ("compare", "--threshold", "-1"), ("compare", "--threshold", "nan"),
    ("compare", "--threshold", "inf"),
    # the docs promise a port 1-65535; versions and limits are counts; jobs and iterations bounded
    ("export", "--port", "-5"), ("export", "--port", "0"), ("export", "--port", "65536"),
    ("export", "--port", str(10 ** 24)), ("show", "--version", str(10 ** 23)),
    ("show", "--version", "0"), ("nightly", "--limit", "-1"), ("build", "--jobs", "0"),
    ("build", "--jobs", "4097"), ("build", "--jobs", str(10 ** 24)), ("tune", "--jobs", "4097"),
    ("kernels", "--iters", "0"), ("kernels", "--iters", "100001"),
    ("kernels", "--iters", str(2 ** 31)),
]


def _argv_for(command: str, prefix: Path, model: Path) -> list:
    return {"bench": ["bench", prefix, "--model", model, "--no-gate"],
            "tune": ["tune", "llama-cpp", "--target", "gfx1100", "--model", model],
            "verify": ["verify", prefix, "--model", model, "--reference", prefix],
            "compare": ["results", "compare", "1", "2"],
            "export": ["preset", "export", "m", "--format", "systemd"],
            "show": ["preset", "show", "m"], "nightly": ["nightly", "list", "--target", "gfx1100"],
            "build": ["build", "llama-cpp", "--target", "gfx1100", "--dry-run"],
            "kernels": ["kernels", "bench", "--target", "gfx1100"]}[command]


@pytest.mark.parametrize("command,flag,value", BAD_FLAGS)
def test_numeric_flag_out_of_range_is_refused_while_parsing(tmp_path, db, model, capsys, command,
                                                             flag, value):
    prefix, marker = never_run_prefix(tmp_path)
    code, _, err = run(capsys, *_argv_for(command, prefix, model), f"{flag}={value}")
    assert code == 2
    line = one_error(err)
    assert line.startswith("rocforge: error: ") and flag in line.split("argument ")[1].split(": ")[0], line
    assert not marker.exists() and not db.exists()  # nothing ran, no store was opened


def test_bench_with_nothing_to_measure_is_one_line(tmp_path, db, model, capsys):
    prefix, marker = never_run_prefix(tmp_path)
    code, _, err = run(capsys, "bench", prefix, "--model", model, "--no-gate", "-p", "0", "-n", "0")
    assert code == 2 and "both 0" in one_error(err)
    assert not marker.exists()


# -- 6. the model file ------------------------------------------------------------------------------
def test_model_that_is_a_fifo_is_refused_without_waiting(tmp_path, db, capsys):
    prefix, marker = never_run_prefix(tmp_path)
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = {}

    def attempt():
        result["run"] = run(capsys, "bench", prefix, "--model", fifo, "--no-gate")

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # it hangs in open(): release it by opening the write end, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("rocforge waited on a FIFO given as --model")
    code, _, err = result["run"]
    assert code == 2 and "is a FIFO (named pipe), not a regular file" in one_error(err)
    assert not marker.exists()


@pytest.mark.parametrize("what", ["directory", "missing", "link-to-fifo"])
def test_model_that_is_not_a_regular_file_is_one_line(tmp_path, db, capsys, what):
    prefix, marker = never_run_prefix(tmp_path)
    target = tmp_path / "m.gguf"
    if what == "directory":
        target.mkdir()
    elif what == "link-to-fifo":
        os.mkfifo(tmp_path / "pipe")
        target.symlink_to(tmp_path / "pipe")
    code, _, err = run(capsys, "bench", prefix, "--model", target, "--no-gate")
    expected = {"directory": "is a directory", "missing": "does not exist",
                "link-to-fifo": "is a FIFO"}[what]
    assert code == 2 and expected in one_error(err)
    assert not marker.exists()


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _nested_arrays(depth: int) -> bytes:
    """An array of arrays of arrays ... `depth` deep, one item each, ending in an empty u8 array."""
    value = _u32(0) + _u64(0)
    for _ in range(depth):
        value = _u32(ARRAY) + _u64(1) + value
    return value


CRAFTED = {
    # 100,000 levels: a recursive reader overflows its stack (RecursionError, a traceback)
    "nested-arrays": (raw([("evil", ARRAY, _nested_arrays(100_000))]), "array of arrays"),
    "nested-once": (raw([("evil", ARRAY, _nested_arrays(1))]), "array of arrays"),
    "alignment-string": (raw([("general.alignment", STRING, gguf_string("32"))]),
                         "general.alignment is of GGUF type 8, not uint32"),
    "alignment-float": (raw([("general.alignment", FLOAT32, struct.pack("<f", 32.0))]),
                        "not uint32"),
    "alignment-negative": (raw([("general.alignment", INT32, struct.pack("<i", -32))]),
                           "general.alignment is of GGUF type 5, not uint32"),
    "alignment-zero": (raw([("general.alignment", UINT32, _u32(0))]), "0 is not a power of 2"),
    "alignment-odd": (raw([("general.alignment", UINT32, _u32(48))]), "48 is not a power of 2"),
    # 2**60 key/value pairs, 2**63 array items or tensors in a file of a few dozen bytes
    "absurd-kv-count": (raw([], n_kv=2 ** 60), "counts 1152921504606846976 key/value pairs"),
    "absurd-array-count": (raw([("a", ARRAY, _u32(8) + _u64(2 ** 63))]), "array items"),
    "absurd-tensor-count": (raw([], n_tensors=2 ** 63 - 1), "tensors"),
    "absurd-string": (raw([("a", STRING, _u64(2 ** 62))]), "a string of"),
    "tensor-dims": (raw([], n_tensors=1, tail=gguf_string("t") + _u32(1_000_000) + b"\0" * 64),
                    "a tensor of 1000000 dimensions"),
    "truncated-kv": (raw([("general.name", STRING, gguf_string("x" * 100))])[:-50], "truncated"),
    "unknown-type": (raw([("a", 77, b"\0" * 16)]), "unknown value type 77"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_gguf_header_is_one_line(tmp_path, db, capsys, name):
    data, expected = CRAFTED[name]
    prefix, marker = never_run_prefix(tmp_path)
    model = tmp_path / f"{name}.gguf"
    model.write_bytes(data + b"\0" * max(0, 24 - len(data)))
    import time

    t0 = time.monotonic()
    code, _, err = run(capsys, "bench", prefix, "--model", model, "--no-gate")
    assert time.monotonic() - t0 < 2  # read in bounded time
    line = one_error(err)
    assert code == 2 and expected in line, line
    assert not marker.exists()


def test_valid_power_of_two_alignment_is_accepted(tmp_path):
    from rocforge_build.measure import gguf

    path = tmp_path / "aligned.gguf"
    path.write_bytes(raw([("general.alignment", UINT32, _u32(64)),
                          ("general.architecture", STRING, gguf_string("llama"))],
                         tail=b"\0" * 64))  # the data section starts at the next multiple of 64
    m = gguf.check(path)
    assert m.metadata["general.alignment"] == 64 and m.arch == "llama"


# -- 6. llama-bench's JSON ---------------------------------------------------------------------------
def bench_prefix(tmp_path: Path, lines: list[str]) -> Path:
    """A build whose llama-bench prints `lines` (as `-o jsonl` would) and exits 0."""
    prefix = tmp_path / "build"
    (prefix / "bin").mkdir(parents=True)
    out = tmp_path / "bench-output.jsonl"
    out.write_text("".join(line + "\n" for line in lines))
    exe = prefix / "bin" / "llama-bench"
    exe.write_text(f"#!/bin/sh\ncat {out}\n")
    exe.chmod(0o755)
    return prefix


GOOD_PP = '{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 1234.5, "stddev_ts": 3.0}'


@pytest.mark.parametrize("tg_line,named", [
    ('{"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": null, "stddev_ts": null}',
     "avg_ts is null"),
    ('{"n_prompt": 0, "n_gen": 128, "n_depth": 0}', "without avg_ts"),
    ('{"n_prompt": 0, "n_gen": null, "avg_ts": 50.0}', "n_gen is null"),
    ('{"n_prompt": 0, "n_gen": "128", "avg_ts": 50.0}', 'n_gen is "128"'),
    ('{"n_prompt": 0, "n_gen": 128, "avg_ts": "fast"}', 'avg_ts is "fast"'),
    ('{"n_prompt": 0, "n_gen": 128, "avg_ts": NaN}', "avg_ts is NaN"),
    ('{"n_prompt": 0, "n_gen": 128, "n_depth": -1, "avg_ts": 5}', "n_depth is -1"),
])
def test_llama_bench_result_with_null_or_missing_fields_is_a_failed_row(tmp_path, db, model, capsys,
                                                                        tg_line, named):
    prefix = bench_prefix(tmp_path, [GOOD_PP, tg_line])
    code, out, err = run(capsys, "bench", prefix, "--model", model, "--no-gate", "--json")
    assert code == 1, err  # a failed row, not an internal error
    assert "Traceback" not in err
    import json

    rows = json.loads(out)
    by_test = {r["test"]: r for r in rows}
    assert by_test["pp"]["status"] == "ok" and by_test["pp"]["t_s"] == 1234.5
    assert by_test["tg"]["status"] == "failed" and by_test["tg"]["t_s"] is None
    assert named in by_test["tg"]["error"]
    # the stored rows read back and print as text, too
    code, out, err = run(capsys, "results", "show")
    assert code == 0 and named in out and "Traceback" not in err


# -- 9. output paths ----------------------------------------------------------------------------------
def _store_with_bench_rows() -> None:
    with Store() as s:
        rid = s.start_run("bench", ["bench"])
        for test, n in (("pp", 512), ("tg", 128)):
            s.add_row(rid, "bench", {"prefix": "/b/llama-hip", "backend": "hip", "test": test,
                                     "n_prompt": n if test == "pp" else 0,
                                     "n_gen": n if test == "tg" else 0, "depth": 0, "ubatch": 512,
                                     "fa": True, "env": {}, "t_s": 100.0, "status": "ok"})


def test_plot_never_overwrites_a_file_rocforge_did_not_make(tmp_path, db, capsys):
    _store_with_bench_rows()
    victim = tmp_path / "report.html"
    victim.write_text("<html>my own report, written by hand</html>\n")
    before = digest(victim)
    code, _, err = run(capsys, "results", "plot", "-o", victim)
    assert code == 2 and "rocforge did not make it" in one_error(err)
    assert digest(victim) == before
    assert [p.name for p in tmp_path.iterdir() if "rocforge-tmp" in p.name] == []


@pytest.mark.parametrize("link", ["to-victim", "dangling", "to-own-plot"])
def test_plot_never_writes_through_a_link(tmp_path, db, capsys, link):
    _store_with_bench_rows()
    victim = tmp_path / "victim.html"
    if link == "to-victim":
        victim.write_text("precious\n")
    elif link == "to-own-plot":  # even a page rocforge made is not reached through a link
        assert run(capsys, "results", "plot", "-o", victim)[0] == 0
    before = victim.read_bytes() if victim.exists() else None
    out = tmp_path / "plot.html"
    out.symlink_to(victim)
    code, _, err = run(capsys, "results", "plot", "-o", out)
    assert code == 2 and "is a symbolic link" in one_error(err)
    assert out.is_symlink() and os.readlink(out) == str(victim)
    if before is None:
        assert not victim.exists()  # the dangling link was not followed to create its target
    else:
        assert victim.read_bytes() == before


def test_plot_output_that_is_a_fifo_or_directory_is_refused(tmp_path, db, capsys):
    _store_with_bench_rows()
    fifo = tmp_path / "plot.html"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "results", "plot", "-o", fifo)  # would hang if opened
    assert code == 2 and "not a regular file" in one_error(err)
    code, _, err = run(capsys, "results", "plot", "-o", tmp_path)
    assert code == 2 and "is a directory" in one_error(err)


def test_plot_rewrites_its_own_page(tmp_path, db, capsys):
    _store_with_bench_rows()
    out = tmp_path / "plot.html"
    assert run(capsys, "results", "plot", "-o", out)[0] == 0
    first = out.read_text()
    assert "pp512 t/s vs depth" in first and "<svg" in first
    with Store() as s:  # a second run: the page changes and is written over the first
        rid = s.start_run("bench", ["bench"])
        s.add_row(rid, "bench", {"prefix": "/b/llama-vulkan", "backend": "vulkan", "test": "pp",
                                 "n_prompt": 512, "n_gen": 0, "depth": 0, "ubatch": 512,
                                 "fa": True, "env": {}, "t_s": 200.0, "status": "ok"})
    code, _, err = run(capsys, "results", "plot", "--run", "1", "--run", "2", "-o", out)
    assert code == 0, err
    again = out.read_text()
    assert again != first and "llama-vulkan" in again
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain write makes it, not 0600
