"""The results store: one SQLite database in the data dir that every bench, verify and tune
appends to.  Each row is committed as soon as it exists (WAL journal, so a crash or Ctrl-C keeps
every finished row).  A locked, corrupt or full database is one clear line; rocforge never
rewrites or deletes a database it cannot read."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import paths
from rocforge_build.errors import DiskFullError, RocforgeError, UsageError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL, argv TEXT, info TEXT);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), kind TEXT NOT NULL,
    prefix TEXT, stamp TEXT, model_sha256 TEXT, status TEXT NOT NULL, created TEXT NOT NULL,
    data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS rows_prefix ON rows(prefix, kind);
CREATE TABLE IF NOT EXISTS presets (
    id INTEGER PRIMARY KEY, model TEXT NOT NULL, model_sha256 TEXT, run_id INTEGER,
    created TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS preset_choice (
    model_sha256 TEXT PRIMARY KEY, preset_id INTEGER NOT NULL REFERENCES presets(id), chosen TEXT NOT NULL);
"""


class StoreError(RocforgeError):
    """The results database cannot be used (locked, corrupt, unwritable)."""

    exit_code = 11


def default_path() -> Path:
    override = os.environ.get("ROCFORGE_RESULTS_DB")
    return Path(override) if override else paths.data_dir() / "results.sqlite3"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _translate(exc: sqlite3.Error, path: Path) -> RocforgeError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreError(f"results database {path} is locked by another process",
                          "wait for the other rocforge bench/tune to finish, then run again")
    if "full" in text or isinstance(exc, sqlite3.OperationalError) and "disk I/O" in text:
        return DiskFullError(f"cannot write the results database {path}: {text} (every row written "
                             "before this one is kept)", "free disk space, then run again")
    # OperationalError is a DatabaseError too: a read-only file or an unopenable path is not corrupt
    if "not a database" in text or "malformed" in text or (
            isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)):
        return StoreError(f"results database {path} is corrupt or not a SQLite file ({text}); "
                          "rocforge leaves it untouched",
                          f"move it aside (mv {path} {path}.bad) to start a new one, or point "
                          "ROCFORGE_RESULTS_DB at another file")
    return StoreError(f"results database {path}: {text}")


@dataclass
class Row:
    id: int
    run_id: int
    kind: str
    prefix: str | None
    stamp: str | None
    model_sha256: str | None
    status: str
    created: str
    data: dict

    def to_json(self) -> dict:
        return {"id": self.id, "run": self.run_id, "kind": self.kind, "status": self.status,
                "created": self.created, **self.data}


class Store:
    def __init__(self, path: Path | None = None, *, timeout: float | None = None):
        self.path = Path(path or default_path())
        if timeout is None:
            timeout = float(os.environ.get("ROCFORGE_RESULTS_TIMEOUT", "10"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            self.db.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL: a committed row survives rocforge or llama-bench crashing (not a power cut);
            # no fsync per row, so the harness stays out of the measured time
            self.db.execute("PRAGMA synchronous = NORMAL")
            self.db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None
        except OSError as exc:
            raise StoreError(f"results database {self.path} cannot be opened: {exc.strerror}") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exec(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

    # -- writing: each call is its own committed transaction ---------------------------------------
    def start_run(self, kind: str, argv: list[str] | None = None, info: dict | None = None) -> int:
        cur = self._exec("INSERT INTO runs (kind, started, status, argv, info) VALUES (?, ?, ?, ?, ?)",
                         (kind, now(), "running", json.dumps(argv or []), json.dumps(info or {})))
        return int(cur.lastrowid)

    def finish_run(self, run_id: int, status: str, info: dict | None = None) -> None:
        if info is None:
            self._exec("UPDATE runs SET finished = ?, status = ? WHERE id = ?", (now(), status, run_id))
        else:
            self._exec("UPDATE runs SET finished = ?, status = ?, info = ? WHERE id = ?",
                       (now(), status, json.dumps(info), run_id))

    def add_row(self, run_id: int, kind: str, data: dict, *, status: str = "ok") -> int:
        cur = self._exec(
            "INSERT INTO rows (run_id, kind, prefix, stamp, model_sha256, status, created, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, kind, data.get("prefix"), data.get("stamp"), data.get("model_sha256"), status,
             now(), json.dumps(data, default=str)))
        return int(cur.lastrowid)

    def add_preset(self, model: str, sha: str | None, run_id: int | None, data: dict) -> int:
        cur = self._exec("INSERT INTO presets (model, model_sha256, run_id, created, data) VALUES (?, ?, ?, ?, ?)",
                         (model, sha, run_id, now(), json.dumps(data, default=str)))
        return int(cur.lastrowid)

    # -- reading -----------------------------------------------------------------------------------
    def runs(self) -> list[dict]:
        cur = self._exec("SELECT r.id, r.kind, r.started, r.finished, r.status, r.argv, "
                         "(SELECT COUNT(*) FROM rows WHERE run_id = r.id) FROM runs r ORDER BY r.id")
        return [{"id": i, "kind": k, "started": s, "finished": f, "status": st, "argv": json.loads(a or "[]"),
                 "rows": n} for i, k, s, f, st, a, n in cur.fetchall()]

    def run_info(self, run_id: int) -> dict | None:
        row = self._exec("SELECT kind, started, finished, status, argv, info FROM runs WHERE id = ?",
                         (run_id,)).fetchone()
        if row is None:
            return None
        kind, started, finished, status, argv, info = row
        return {"id": run_id, "kind": kind, "started": started, "finished": finished, "status": status,
                "argv": json.loads(argv or "[]"), "info": json.loads(info or "{}")}

    def rows(self, *, run_id: int | None = None, prefix: str | None = None, kind: str | None = None) -> Iterator[Row]:
        where, params = [], []
        for col, value in (("run_id", run_id), ("prefix", prefix), ("kind", kind)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = "SELECT id, run_id, kind, prefix, stamp, model_sha256, status, created, data FROM rows"
        if where:
            sql += " WHERE " + " AND ".join(where)
        for r in self._exec(sql + " ORDER BY id", tuple(params)).fetchall():
            yield Row(*r[:8], data=json.loads(r[8]))

    def last_run_of(self, prefix: str, kind: str = "bench") -> int | None:
        row = self._exec("SELECT MAX(run_id) FROM rows WHERE prefix = ? AND kind = ?", (prefix, kind)).fetchone()
        return row[0] if row and row[0] is not None else None

    def preset_history(self, model: str) -> list[dict]:
        """Every version of a model's preset (name or sha256), oldest first; each is a tune's."""
        rows = self._exec("SELECT id, model, model_sha256, run_id, created, data FROM presets "
                          "WHERE model = ? OR model_sha256 = ? ORDER BY id", (model, model)).fetchall()
        return [{"version": i, "model": m, "model_sha256": sha, "run_id": run, "created": c,
                 "data": json.loads(d)} for i, m, sha, run, c, d in rows]

    def preset(self, model: str) -> dict | None:
        """The version in use: the one `preset use` chose, else the newest."""
        history = self.preset_history(model)
        if not history:
            return None
        chosen = self._exec("SELECT preset_id FROM preset_choice WHERE model_sha256 = ?",
                            (history[-1]["model_sha256"],)).fetchone()
        pick = next((h for h in history if chosen and h["version"] == chosen[0]), history[-1])
        return {**pick["data"], "version": pick["version"], "in_use": "chosen" if chosen else "newest"}

    def use_preset(self, model: str, version: int) -> dict:
        history = self.preset_history(model)
        pick = next((h for h in history if h["version"] == version), None)
        if pick is None:
            raise UsageError(f"{model} has no preset version {version}",
                             "versions: " + (", ".join(str(h["version"]) for h in history) or "none"))
        self._exec("INSERT OR REPLACE INTO preset_choice (model_sha256, preset_id, chosen) VALUES (?, ?, ?)",
                   (pick["model_sha256"], version, now()))
        return pick

    def preset_models(self) -> list[str]:
        return [m for (m,) in self._exec("SELECT DISTINCT model FROM presets ORDER BY model").fetchall()]
