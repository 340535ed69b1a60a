"""The results store: one SQLite database in the data dir that every bench, verify and tune
appends to.  Each row is committed as soon as it exists (WAL journal, so a crash or Ctrl-C keeps
every finished row).  A locked, corrupt or full database is one clear line; rocforge never
rewrites or deletes a database it cannot read."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import paths, rootfs, schema
from rocforge_build.credentials import redact_data
from rocforge_build.errors import ConfigError, DiskFullError, RocforgeError, StoreError, UsageError
from rocforge_build.shellsafe import one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from rocforge_build.measure.preset_values import Preset, PresetVersion

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
    created TEXT NOT NULL, data TEXT NOT NULL, model_version INTEGER);
CREATE TABLE IF NOT EXISTS preset_choice (
    model_sha256 TEXT PRIMARY KEY, preset_id INTEGER NOT NULL REFERENCES presets(id), chosen TEXT NOT NULL);
"""


# PRAGMA application_id (sqlite.org/pragma.html#pragma_application_id): marks a database as made by
# rocforge, so the store never writes to a SQLite file of someone else's at ROCFORGE_RESULTS_DB
APPLICATION_ID = int.from_bytes(b"RFrs", "big")
OWN_NAMES = {"runs", "rows", "rows_prefix", "presets"}  # what SCHEMA made before the stamp
# PRAGMA user_version: the schema's version, raised by each change that existing rows must follow
# (_migrate).  0: presets numbered by the table's row id, shared by every model; 1: a preset
# history per model, keyed by its sha256, numbered 1, 2, 3... (presets.model_version).
SCHEMA_VERSION = 1
# the key of a preset history: the model's sha256 (a row stored without one, by a test or an early
# rocforge, keeps its name as its key)
_HISTORY = "COALESCE(model_sha256, model)"
_SHA_PREFIX = re.compile(r"[0-9a-f]{12,64}")
_MAX_INT = 2 ** 63 - 1  # SQLite INTEGER: 64-bit signed


def _ok_has_figure(row: dict, path: str) -> None:
    if row["status"] == "ok" and row["test"] != "gate" and row["t_s"] is None:
        raise schema.Bad("t_s", "is null in a row whose status is ok (a measured row has its figure)")


# What bench/tune (measure/bench.py) and verify (measure/verify.py) store in a row's data, as
# `results`, `compare`, `plot`, serve and recheck read it: checked per row as the store reads it.
_COUNT = schema.Int(0, 1 << 30)
_FIGURE = schema.Optional(schema.Num(0))
_ROW_SCHEMAS = {
    "bench": schema.Record({
        "prefix": schema.Optional(schema.Str()), "test": schema.Optional(schema.Str(one_line=True)),
        "n_prompt": schema.Optional(_COUNT), "n_gen": schema.Optional(_COUNT), "depth": schema.Optional(_COUNT),
        "ubatch": schema.Optional(_COUNT), "fa": schema.Optional(schema.Bool()),
        "env": schema.Optional(schema.TableOf(schema.Scalar())), "t_s": _FIGURE, "stddev": _FIGURE,
        "status": schema.Str(one_line=True), "error": schema.Optional(schema.Str(empty=True)),
        "ceiling": schema.Optional(schema.Record({  # roofline.note formats these as numbers
            **{k: schema.Optional(schema.Num()) for k in ("tg_pct_of_bandwidth", "bandwidth_gbs",
                                                          "pp_pct_of_gemm_peak", "gemm_peak_tflops")},
            "bandwidth_source": schema.Optional(schema.Str(empty=True))})),
    }, rules=(_ok_has_figure,)),
    "verify": schema.Record({
        "prefix": schema.Optional(schema.Str()), "passed": schema.Bool(), "stamp": schema.Optional(schema.Str()),
        "env": schema.Optional(schema.TableOf(schema.Scalar())),
        "checks": schema.Optional(schema.ListOf(schema.Record({
            "ctx": _COUNT, "ubatch": schema.Optional(_COUNT), "fa": schema.Optional(schema.Bool()),
            "ngl": schema.Optional(_COUNT), "kld_mean": _FIGURE, "top1": _FIGURE,
            "passed": schema.Optional(schema.Bool())}))),  # results show reads each figure
    }),
}


# The columns beside the JSON (SQLite keeps any type in any column): checked as they are read, so a
# version, a status or a name that is not what rocforge wrote is one line, like a bad JSON field.
_TEXT = schema.Str(empty=True)
_ID = schema.Int(0, _MAX_INT)
_COLUMNS = {
    "runs": schema.Record({"id": _ID, "kind": schema.Str(one_line=True), "started": _TEXT,
                           "finished": schema.Optional(_TEXT), "status": schema.Str(one_line=True)}),
    "rows": schema.Record({"id": _ID, "run_id": _ID, "kind": schema.Str(one_line=True),
                           "prefix": schema.Optional(_TEXT), "stamp": schema.Optional(_TEXT),
                           "model_sha256": schema.Optional(_TEXT), "status": schema.Str(one_line=True),
                           "created": _TEXT}),
    "presets": schema.Record({"id": _ID, "model": schema.Str(), "model_sha256": schema.Optional(_TEXT),
                              "run_id": schema.Optional(_ID), "created": _TEXT,
                              "version": schema.Int(1, _MAX_INT)}),
}


class _KeyTwice(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _one_each(pairs: list) -> dict:
    """A JSON object whose keys are each given once (json's hook): a key twice is refused, not
    read as its last value, so what rocforge reads is what every reader of the row reads."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        raise _KeyTwice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def _timeout() -> float:
    """ROCFORGE_RESULTS_TIMEOUT: seconds to wait for a locked database (default 10)."""
    text = os.environ.get("ROCFORGE_RESULTS_TIMEOUT", "10")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:  # also nan and inf
        raise ConfigError(f"ROCFORGE_RESULTS_TIMEOUT={text!r} is not a number of seconds from 0 to "
                         "86400", "unset it (the default is 10 s) or give e.g. 30")
    return value


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


def _unwritable(path: Path) -> RocforgeError | None:
    """Where the database's directory cannot be written (a read-only data directory): the one
    line `paths.unwritable` gives for rocforge's own directories (naming the variable that moves
    it), else one naming the directory and ROCFORGE_RESULTS_DB; None where it can be written."""
    exc = paths.write_refusal(path.parent)
    if exc is None:
        return None
    return paths.unwritable(exc) or StoreError(
        f"results database {path} cannot be opened: {exc.filename} cannot be written "
        f"({exc.strerror})", "point ROCFORGE_RESULTS_DB at a file in a writable directory")


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
    def __init__(self, path: Path | None = None, *, timeout: float | None = None, threads: bool = False):
        """`threads`: the connection may be used from other threads than this one, one call at a
        time (the caller serializes them: serve's front records from its own threads)."""
        self.path = Path(path or paths.results_db())
        timeout = _timeout() if timeout is None else timeout
        self._regular_or_absent()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                      check_same_thread=not threads)
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            self._claim()
            self._not_newer()
            self.db.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL: a committed row survives rocforge or llama-bench crashing (not a power cut);
            # no fsync per row, so the harness stays out of the measured time
            self.db.execute("PRAGMA synchronous = NORMAL")
            self.db.executescript(SCHEMA)
            self._migrate()
        except sqlite3.Error as exc:
            raise _unwritable(self.path) or _translate(exc, self.path) from None
        except OSError as exc:
            raise paths.unwritable(exc) or StoreError(
                f"results database {self.path} cannot be opened: {exc.strerror}") from None

    def _regular_or_absent(self) -> None:
        """The database and its journals are regular files or absent: SQLite opens a FIFO, a
        directory or a device at that path and then fails with "disk I/O error", which says
        nothing of what is there (stat follows a link and never blocks on a FIFO)."""
        for path in (self.path, *(Path(f"{self.path}{end}") for end in ("-wal", "-shm", "-journal"))):
            try:
                mode = path.stat().st_mode
            except OSError:  # absent (SQLite creates it), else a link loop, a name too long...
                from rocforge_build import userpath

                userpath.require(path, "results database", missing_ok=True,
                                 hint="point ROCFORGE_RESULTS_DB at a regular file")
                continue
            if not stat.S_ISREG(mode):
                raise StoreError(f"results database {path} is {rootfs.file_kind(mode)}, not a "
                                 "regular file; rocforge leaves it untouched",
                                 "remove it, or point ROCFORGE_RESULTS_DB at a regular file")

    def _claim(self) -> None:
        """Refuse a SQLite file that is not rocforge's before anything is written to it (no table,
        no WAL switch); stamp a new, empty one as rocforge's (PRAGMA application_id)."""
        app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
        names = {n for (n,) in self.db.execute(
            "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()}
        if app_id == APPLICATION_ID:
            return
        if app_id == 0 and (names == OWN_NAMES or not names):
            # new and empty, or made by rocforge before the stamp existed: stamped now, so that the
            # tables SCHEMA adds below (preset_choice) do not make it look like someone else's
            self.db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            return
        self.db.close()
        what = (f"its application id is {app_id:#x}" if app_id else
                f"it holds {', '.join(sorted(names - OWN_NAMES) or sorted(names))}")
        raise StoreError(f"results database {self.path} is a SQLite database that rocforge did not "
                         f"make ({what}); rocforge leaves it untouched",
                         "point ROCFORGE_RESULTS_DB at another file (or unset it)")

    def _not_newer(self) -> None:
        """Refuse, untouched, a database a newer rocforge changed past the schema this one knows."""
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self.db.close()
            raise StoreError(f"results database {self.path} was written by a newer rocforge (schema "
                             f"version {version}; this one knows up to {SCHEMA_VERSION}); rocforge "
                             "leaves it untouched",
                             "upgrade rocforge, or point ROCFORGE_RESULTS_DB at another file")

    def _migrate(self) -> None:
        """Bring an older schema's rows to SCHEMA_VERSION in one transaction (the write lock held:
        two rocforges opening the old file at once migrate it once).  0 -> 1: presets gain
        model_version, each model's history numbered 1, 2, 3... in the order it was stored."""
        if self.db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if self.db.execute("PRAGMA user_version").fetchone()[0] < 1:
                if "model_version" not in {c[1] for c in self.db.execute("PRAGMA table_info(presets)")}:
                    self.db.execute("ALTER TABLE presets ADD COLUMN model_version INTEGER")
                self.db.execute("UPDATE presets SET model_version = (SELECT COUNT(*) FROM presets p WHERE "
                                "COALESCE(p.model_sha256, p.model) = COALESCE(presets.model_sha256, presets.model) "
                                "AND p.id <= presets.id)")
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # not when BEGIN itself failed (a locked database)
                self.db.execute("ROLLBACK")
            raise

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
        argv, info = redact_data(argv), redact_data(info)  # a credential is never stored
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
        data = redact_data(data)  # a URL's password, a server's echoed token: never stored
        cur = self._exec(
            "INSERT INTO rows (run_id, kind, prefix, stamp, model_sha256, status, created, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, kind, data.get("prefix"), data.get("stamp"), data.get("model_sha256"), status,
             now(), json.dumps(data, default=str)))
        return int(cur.lastrowid)

    def add_preset(self, model: str, sha: str, run_id: int | None, data: dict) -> int:
        """Store a new version of the model's preset; returns its version, the model's own 1, 2, 3...
        (one statement: two tunes finishing at once cannot take the same number)."""
        if not sha:
            raise ValueError("a preset history is keyed by its model's sha256")
        cur = self._exec("INSERT INTO presets (model, model_sha256, run_id, created, data, model_version) "
                         "SELECT ?, ?, ?, ?, ?, COALESCE(MAX(model_version), 0) + 1 FROM presets "
                         "WHERE model_sha256 = ?",
                         (model, sha, run_id, now(), json.dumps(data, default=str), sha))
        return int(self._exec("SELECT model_version FROM presets WHERE id = ?", (cur.lastrowid,)).fetchone()[0])

    # -- reading -----------------------------------------------------------------------------------
    def runs(self) -> list[dict]:
        cur = self._exec("SELECT r.id, r.kind, r.started, r.finished, r.status, r.argv, "
                         "(SELECT COUNT(*) FROM rows WHERE run_id = r.id) FROM runs r ORDER BY r.id")
        return [{**self._columns("runs", {"id": i, "kind": k, "started": s, "finished": f, "status": st},
                                 f"run {i} (table runs)"),
                 "argv": self._argv(a, i), "rows": n} for i, k, s, f, st, a, n in cur.fetchall()]

    def run_info(self, run_id: int) -> dict | None:
        if not 0 <= run_id <= _MAX_INT:  # no row can have it; SQLite would refuse the number
            return None
        row = self._exec("SELECT kind, started, finished, status, argv, info FROM runs WHERE id = ?",
                         (run_id,)).fetchone()
        if row is None:
            return None
        kind, started, finished, status, argv, info = row
        cols = {"id": run_id, "kind": kind, "started": started, "finished": finished, "status": status}
        return {**self._columns("runs", cols, f"run {run_id} (table runs)"), "argv": self._argv(argv, run_id),
                "info": self._decode(info or "{}", dict, f"run {run_id}'s info (table runs)")}

    def rows(self, *, run_id: int | None = None, prefix: str | None = None, kind: str | None = None) -> Iterator[Row]:
        if run_id is not None and not 0 <= run_id <= _MAX_INT:
            return  # no row can have it; SQLite would refuse the number
        where, params = [], []
        for col, value in (("run_id", run_id), ("prefix", prefix), ("kind", kind)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = "SELECT id, run_id, kind, prefix, stamp, model_sha256, status, created, data FROM rows"
        if where:
            sql += " WHERE " + " AND ".join(where)
        for r in self._exec(sql + " ORDER BY id", tuple(params)).fetchall():
            what = f"row {r[0]} of run {r[1]} (table rows)"
            cols = self._columns("rows", dict(zip(("id", "run_id", "kind", "prefix", "stamp", "model_sha256",
                                                   "status", "created"), r[:8], strict=True)), what)
            data = self._decode(r[8], dict, what)
            if r[2] in _ROW_SCHEMAS:
                data = schema.check(data, _ROW_SCHEMAS[r[2]], f"results database {self.path}: {what}",
                                    StoreError, "repair or delete that row with the sqlite3 program, "
                                    "or point ROCFORGE_RESULTS_DB at another file")
            yield Row(**cols, data=data)

    def _columns(self, table: str, values: dict, what: str) -> dict:
        return schema.check(values, _COLUMNS[table], f"results database {self.path}: {what}", StoreError,
                            "repair or delete that row with the sqlite3 program, or point "
                            "ROCFORGE_RESULTS_DB at another file")

    def _decode(self, text, kind: type, what: str):
        """A JSON column, or one line naming the row whose text is not the JSON rocforge wrote
        (edited by hand, written by another program); rocforge leaves the row as it is."""
        try:
            value = json.loads(text, object_pairs_hook=_one_each)
        except _KeyTwice as twice:
            raise StoreError(f"results database {self.path}: {what} holds the key {twice.key!r} twice in one "
                             "object (which one counts is no JSON reader's to guess); rocforge leaves it "
                             "untouched", "repair or delete that row with the sqlite3 program, or point "
                             "ROCFORGE_RESULTS_DB at another file") from None
        except (TypeError, ValueError, RecursionError):
            value = None
        if not isinstance(value, kind):
            raise StoreError(f"results database {self.path}: {what} does not hold a JSON "
                             f"{'object' if kind is dict else 'list'}; rocforge leaves it untouched",
                             "repair or delete that row with the sqlite3 program, or point "
                             "ROCFORGE_RESULTS_DB at another file")
        return value

    def _argv(self, text, run_id: int) -> list[str]:
        argv = self._decode(text or "[]", list, f"run {run_id}'s argv (table runs)")
        return [str(a) for a in argv]

    def last_run_of(self, prefix: str, kind: str = "bench") -> int | None:
        row = self._exec("SELECT MAX(run_id) FROM rows WHERE prefix = ? AND kind = ?", (prefix, kind)).fetchone()
        return row[0] if row and row[0] is not None else None

    def _histories(self, key: str) -> list[str]:
        """The preset histories `key` names: a model's sha256 names its own; else every model whose
        name is `key` or whose sha256 starts with it (12 hex digits or more)."""
        low = key.lower()
        if self._exec("SELECT 1 FROM presets WHERE model_sha256 = ? LIMIT 1", (low,)).fetchone():
            return [low]
        prefix = low if _SHA_PREFIX.fullmatch(low) else None
        rows = self._exec(f"SELECT {_HISTORY}, MIN(id) FROM presets WHERE model = ? "
                          "OR (? IS NOT NULL AND substr(model_sha256, 1, length(?)) = ?) "
                          f"GROUP BY {_HISTORY} ORDER BY MIN(id)", (key, prefix, prefix, prefix)).fetchall()
        return [k for k, _ in rows]

    def resolve(self, key: str) -> str | None:
        """The one preset history a MODEL argument names, None when it names none.  A name two
        models share (two quantizations of one model have one general.name) is refused, listing
        them: their histories are apart, and which to use is the user's to say."""
        keys = self._histories(key)
        if len(keys) < 2:
            return keys[0] if keys else None
        known = {m["sha256"] or m["name"]: m for m in self.preset_models()}
        listing = ", ".join(f"{k[:12]} ({known[k]['path'] or 'path unknown'})" for k in keys)
        raise UsageError(f"{key!r} names {len(keys)} models with presets: {listing}",
                         "pick one: pass its GGUF path or its sha256 (the first 12 hex digits are enough)")

    def _history(self, k: str) -> list[dict]:
        rows = self._exec("SELECT id, model, model_sha256, run_id, created, data, model_version FROM presets "
                          f"WHERE {_HISTORY} = ? ORDER BY model_version, id", (k,)).fetchall()
        out = []
        for i, m, sha, run, c, d, v in rows:
            what = f"preset {i} (table presets)"
            cols = self._columns("presets", {"id": i, "version": v, "model": m, "model_sha256": sha,
                                             "run_id": run, "created": c}, what)
            out.append({**cols, "data": self._decode(d, dict, f"preset {i} (table presets: {one_line(m)} version {v})")})
        return out

    def _checked(self, h: dict, in_use: str | None = None) -> PresetVersion:
        """A preset version as read, its data held to the preset schema (measure/preset.py
        PRESET) and made values there: a row that does not match is one line naming the row and
        the field."""
        from rocforge_build.measure.preset import checked
        from rocforge_build.measure.preset_values import PresetVersion

        where = (f"results database {self.path}: preset {h['id']} (table presets: {one_line(h['model'])} "
                 f"version {h['version']})")
        return PresetVersion(version=h["version"], model=h["model"], model_sha256=h["model_sha256"],
                             run_id=h["run_id"], created=h["created"],
                             preset=checked(h["data"], where, version=h["version"], in_use=in_use))

    def preset_history(self, model: str) -> list[PresetVersion]:
        """Every version of one model's preset (a name, a sha256 or its prefix: `resolve`), oldest
        first; each is a tune's, numbered 1, 2, 3... for that model."""
        k = self.resolve(model)
        return [] if k is None else [self._checked(h) for h in self._history(k)]

    def preset(self, model: str) -> Preset | None:
        """The version in use: the one `preset use` chose, else the newest."""
        k = self.resolve(model)
        history = self._history(k) if k is not None else []
        if not history:
            return None
        chosen = self._exec("SELECT preset_id FROM preset_choice WHERE model_sha256 = ?", (k,)).fetchone()
        pick = next((h for h in history if chosen and h["id"] == chosen[0]), None)
        return self._checked(pick or history[-1], "chosen" if pick else "newest").preset

    def use_preset(self, model: str, version: int) -> PresetVersion:
        k = self.resolve(model)
        history = self._history(k) if k is not None else []
        pick = next((h for h in history if h["version"] == version), None)
        if pick is None:
            raise UsageError(f"{model} has no preset version {version}",
                             "versions: " + (", ".join(str(h["version"]) for h in history) or "none"))
        got = self._checked(pick)  # a version that does not match the schema is never put in use
        # preset_choice.model_sha256 holds the history's key (the sha256; the name for a row without one)
        self._exec("INSERT OR REPLACE INTO preset_choice (model_sha256, preset_id, chosen) VALUES (?, ?, ?)",
                   (k, pick["id"], now()))
        return got

    def preset_models(self) -> list[dict]:
        """One entry per preset history, by name, then in the order first tuned: the model's name,
        sha256 and path (the newest version's) and how many versions it has."""
        rows = self._exec(f"SELECT model, model_sha256, data, n FROM presets JOIN (SELECT {_HISTORY} AS k, "
                          "MAX(id) AS newest, MIN(id) AS first, COUNT(*) AS n FROM presets GROUP BY k) "
                          "ON id = newest ORDER BY model, first").fetchall()
        out = []
        for name, sha, data, n in rows:
            try:
                path = (json.loads(data).get("model") or {}).get("path")
            except (ValueError, AttributeError, TypeError, RecursionError):
                path = None  # a hand-edited row: `preset show` names it; a listing still lists it
            out.append({"name": name, "sha256": sha, "path": path if isinstance(path, str) else None,
                        "versions": n})
        return out
