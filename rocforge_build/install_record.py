"""The record a nightly install carries (`rocforge-install.toml`): its fields' types, a reader
that keeps only the well-typed ones, and whether a record is whole, which is what proves to
`ownership` that a directory is a nightly install rocforge made and may remove.  It sits with the
shared helpers because nightly/ writes and reads it and `ownership` reads it too.
"""

from __future__ import annotations

import re
from pathlib import Path

from rocforge_build.errors import reason
from rocforge_build.toml_subset import tomllib_parse

RECORD = "rocforge-install.toml"
_RECORD_TYPES = {"version": str, "family": str, "platform": str, "url": str, "sha256": str,
                 "size": int, "verified": bool, "date": str, "build_date": str}
_LAYER_TYPES = {"name": str, "url": str, "family": str, "version": str, "sha256": str,
                "size": int, "checksum": str, "verified": bool}


def read_record(path: Path) -> dict:
    return read_record_checked(path)[0]


def read_record_checked(path: Path) -> tuple[dict, str | None]:
    """(record, problem): the fields of the right type only, so one damaged record (hand-edited,
    half-written by another tool) never breaks the listing or pruning of every install."""
    import tomllib

    file = path / RECORD if path.is_dir() else path
    try:
        raw = tomllib_parse(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else reason(exc)
        return {}, f"{RECORD} cannot be read ({why})"
    record = {k: v for k, v in raw.items() if _typed(v, _RECORD_TYPES.get(k))}
    bad = sorted(k for k in raw if k in _RECORD_TYPES and k not in record)
    layers = raw.get("layers", [])
    if isinstance(layers, list) and all(isinstance(layer, dict) for layer in layers):
        record["layers"] = [{k: v for k, v in layer.items() if _typed(v, _LAYER_TYPES.get(k))}
                            for layer in layers]
    else:
        record["layers"] = []
        bad.append("layers")
    return record, (f"{RECORD} has fields of the wrong type: {', '.join(sorted(bad))}"
                    if bad else None)


def _typed(value, kind) -> bool:
    if kind is None:
        return False
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def valid_record(path: Path) -> bool:
    """Whether `path` holds a rocforge-install.toml as `nightly/install.py`'s `make_record`
    writes it: readable, every field of its type, the version, URL, sha256 and size set, and
    each layer named with its own."""
    if not (path / RECORD).is_file() or (path / RECORD).is_symlink():
        return False
    record, problem = read_record_checked(path)
    layers = record.get("layers") or []
    return (problem is None and all(k in record for k in ("version", "url", "sha256", "size"))
            and bool(_SHA256.fullmatch(record["sha256"])) and bool(layers)
            and all({"name", "url", "sha256", "size"} <= set(layer) for layer in layers))
