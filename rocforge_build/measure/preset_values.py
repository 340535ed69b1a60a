"""A preset as the results store hands it out: frozen, typed values built in one place
(`Preset.of_checked`) from the record the preset schema (measure/preset.py PRESET) checked where
the store read it, so code past the read uses attributes, never a key a hand-edited row may lack.

Each record value keeps the keys this rocforge does not read (tune's `reason`, a range's
`repetitions`, a newer rocforge's additions) in `extra`, frozen and never read, and the order the
record held its keys in, so `to_json` gives back exactly the record as checked: `preset show
--json` prints what the store holds, and a round trip loses nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rocforge_build.measure.serving import SERVING_FIELDS

_NOTHING: Mapping = MappingProxyType({})
# what `preset show --json` prints beside the record, from the store: never a key of the record
STORE_KEYS = ("version", "in_use")


def _nothing() -> Mapping:
    return _NOTHING


def _frozen(value):
    """A JSON value made read-only: objects become read-only mappings, arrays tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value):
    """`_frozen`'s JSON value back (a JSON value holds no tuple, so each is an array)."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class StoredRecord:
    """What every record value keeps beside its typed fields: the keys it does not read (`extra`)
    and the order of the record's keys as read (`key_order`; None for a value made in code: its
    fields, then `extra`)."""

    extra: Mapping[str, object] = field(default_factory=_nothing)
    key_order: tuple[str, ...] | None = None

    @staticmethod
    def _kept(d: Mapping, known: tuple[str, ...]) -> dict:
        """The keyword arguments that keep `d`'s unread keys and key order."""
        return {"extra": MappingProxyType({k: _frozen(v) for k, v in d.items() if k not in known}),
                "key_order": tuple(d)}

    def _json(self, fields: dict) -> dict:
        merged = {**fields, **{k: _thawed(v) for k, v in self.extra.items()}}
        return {k: merged[k] for k in (tuple(merged) if self.key_order is None else self.key_order)}


@dataclass(frozen=True, kw_only=True)
class PresetModel(StoredRecord):
    """The model a preset was tuned for: its name, its file's sha256 and the path tune was given
    (as given: it may be relative)."""

    name: str
    sha256: str
    path: str

    FIELDS = ("name", "sha256", "path")

    @classmethod
    def of_checked(cls, d: Mapping) -> PresetModel:
        return cls(name=d["name"], sha256=d["sha256"], path=d["path"], **cls._kept(d, cls.FIELDS))

    def to_json(self) -> dict:
        return self._json({"name": self.name, "sha256": self.sha256, "path": self.path})


@dataclass(frozen=True, kw_only=True)
class RangeVariant(StoredRecord):
    """The runtime settings tune chose for a range (bench.Variant as stored): micro-batch, flash
    attention, extra environment, and the serving dimensions (None where a preset stored before
    verify knew them, or the variant, leaves them out)."""

    ubatch: int | None = None
    fa: bool | None = None
    env: Mapping[str, str] = field(default_factory=_nothing)
    kv: str | None = None
    load: str | None = None
    parallel: int | None = None

    FIELDS = ("ubatch", "fa", "env", *SERVING_FIELDS)

    @classmethod
    def of_checked(cls, d: Mapping) -> RangeVariant:
        """A variant stored as null or left out is checked as {}: no key, each field None."""
        return cls(ubatch=d.get("ubatch"), fa=d.get("fa"), env=MappingProxyType(dict(d.get("env") or {})),
                   kv=d.get("kv"), load=d.get("load"), parallel=d.get("parallel"), **cls._kept(d, cls.FIELDS))

    def to_json(self) -> dict:
        return self._json({"ubatch": self.ubatch, "fa": self.fa, "env": dict(self.env), "kv": self.kv,
                           "load": self.load, "parallel": self.parallel})


@dataclass(frozen=True, kw_only=True)
class Figure(StoredRecord):
    """One measured figure that chose a range: test (pp, tg), tokens, depth, t/s and its spread."""

    test: str
    n: int
    depth: int
    t_s: float
    stddev: float | None = None

    FIELDS = ("test", "n", "depth", "t_s", "stddev")

    @classmethod
    def of_checked(cls, d: Mapping) -> Figure:
        return cls(test=d["test"], n=d["n"], depth=d["depth"], t_s=d["t_s"], stddev=d["stddev"],
                   **cls._kept(d, cls.FIELDS))

    def to_json(self) -> dict:
        return self._json({"test": self.test, "n": self.n, "depth": self.depth, "t_s": self.t_s,
                           "stddev": self.stddev})


@dataclass(frozen=True, kw_only=True)
class VerifiedShape(StoredRecord):
    """The shape tune verified a range at (verify.Shape as stored), each dimension as stored: a
    preset verified before verify knew the serving dimensions has none of them (`serving_known`)."""

    ctx: int
    ubatch: int | None = None
    fa: bool | None = None
    ngl: int | None = None
    kv: str | None = None
    load: str | None = None
    parallel: int | None = None

    FIELDS = ("ctx", "ubatch", "fa", "ngl", *SERVING_FIELDS)

    @classmethod
    def of_checked(cls, d: Mapping) -> VerifiedShape:
        return cls(ctx=d["ctx"], ubatch=d["ubatch"], fa=d["fa"], ngl=d["ngl"], kv=d["kv"], load=d["load"],
                   parallel=d["parallel"], **cls._kept(d, cls.FIELDS))

    @property
    def serving_known(self) -> bool:
        """Whether it names its serving dimensions (serving.serving_known)."""
        return all(getattr(self, k) is not None for k in SERVING_FIELDS)

    def to_json(self) -> dict:
        return self._json({"ctx": self.ctx, "ubatch": self.ubatch, "fa": self.fa, "ngl": self.ngl,
                           "kv": self.kv, "load": self.load, "parallel": self.parallel})


@dataclass(frozen=True, kw_only=True)
class Verified(StoredRecord):
    """The check a range passed before it was stored: its shape (its divergence and reference are
    kept, unread, in `extra`)."""

    shape: VerifiedShape | None = None

    @classmethod
    def of_checked(cls, d: Mapping) -> Verified:
        shape = d["shape"]
        return cls(shape=None if shape is None else VerifiedShape.of_checked(shape), **cls._kept(d, ("shape",)))

    def to_json(self) -> dict:
        return self._json({"shape": None if self.shape is None else self.shape.to_json()})


@dataclass(frozen=True, kw_only=True)
class PresetRange(StoredRecord):
    """One context range of a preset: the build (prefix, backend, stamp) and variant tune chose at
    that depth and context, the figures and score that chose it, the check it passed, and the
    command (env, argv, notes) that runs it."""

    prefix: str
    backend: str
    stamp: str | None
    depth: int
    ctx: int
    variant: RangeVariant
    variant_label: str
    score: float
    figures: tuple[Figure, ...]
    runner_up: str | None
    verified: Verified | None
    env: Mapping[str, str]
    argv: tuple[str, ...]
    notes: tuple[str, ...]

    FIELDS = ("prefix", "backend", "stamp", "depth", "ctx", "variant", "variant_label", "score", "figures",
              "runner_up", "verified", "env", "argv", "notes")

    @classmethod
    def of_checked(cls, d: Mapping) -> PresetRange:
        return cls(prefix=d["prefix"], backend=d["backend"], stamp=d["stamp"], depth=d["depth"], ctx=d["ctx"],
                   variant=RangeVariant.of_checked(d["variant"]), variant_label=d["variant_label"],
                   score=d["score"], figures=tuple(Figure.of_checked(f) for f in d["figures"]),
                   runner_up=d["runner_up"],
                   verified=None if d["verified"] is None else Verified.of_checked(d["verified"]),
                   env=MappingProxyType(dict(d["env"])), argv=tuple(d["argv"]), notes=tuple(d["notes"]),
                   **cls._kept(d, cls.FIELDS))

    @property
    def verified_shape(self) -> VerifiedShape | None:
        """The shape it was verified at; None for a range stored without one."""
        return None if self.verified is None else self.verified.shape

    def to_json(self) -> dict:
        return self._json({
            "prefix": self.prefix, "backend": self.backend, "stamp": self.stamp, "depth": self.depth,
            "ctx": self.ctx, "variant": self.variant.to_json(), "variant_label": self.variant_label,
            "score": self.score, "figures": [f.to_json() for f in self.figures], "runner_up": self.runner_up,
            "verified": None if self.verified is None else self.verified.to_json(), "env": dict(self.env),
            "argv": list(self.argv), "notes": list(self.notes)})


@dataclass(frozen=True, kw_only=True)
class Preset(StoredRecord):
    """A model's preset as one version of its history: the model, when it was tuned, its ranges
    by name in stored order, whether tune searched exhaustively, and, from the store, its version
    and why it is in use ("chosen" by `preset use`, else "newest"; None where that was not asked)."""

    model: PresetModel
    created: str
    ranges: Mapping[str, PresetRange]
    exhaustive: bool | None = None
    version: int | None = None
    in_use: str | None = None

    FIELDS = ("model", "created", "ranges", "exhaustive")

    @classmethod
    def of_checked(cls, d: Mapping, *, version: int | None = None, in_use: str | None = None) -> Preset:
        """The one place a checked preset record (measure/preset.py `checked`) becomes values."""
        return cls(model=PresetModel.of_checked(d["model"]), created=d["created"],
                   ranges=MappingProxyType({name: PresetRange.of_checked(r) for name, r in d["ranges"].items()}),
                   exhaustive=d.get("exhaustive"), version=version, in_use=in_use, **cls._kept(d, cls.FIELDS))

    def stored_json(self) -> dict:
        """The record as the store holds it (a history entry's `data`)."""
        return self._json({"model": self.model.to_json(), "created": self.created,
                           "ranges": {name: r.to_json() for name, r in self.ranges.items()},
                           "exhaustive": self.exhaustive})

    def to_json(self) -> dict:
        """As `preset show --json` prints it: the record, its version, and why it is in use."""
        out = self.stored_json()
        for key, value in zip(STORE_KEYS, (self.version, self.in_use), strict=True):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, kw_only=True)
class PresetVersion:
    """One version of a model's preset history: its number, the model's name and sha256 as the
    store keys it, the tune run that made it, when it was stored, and the preset itself."""

    version: int
    model: str
    model_sha256: str | None
    run_id: int | None
    created: str
    preset: Preset

    def to_json(self) -> dict:
        """As `preset history --json` prints each version (without whether it is in use)."""
        return {"version": self.version, "model": self.model, "model_sha256": self.model_sha256,
                "run_id": self.run_id, "created": self.created, "data": self.preset.stored_json()}
