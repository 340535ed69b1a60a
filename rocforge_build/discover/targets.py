"""The target table (package data `data/targets.toml`) and the gfx name <-> KFD version encoding.

Kept import-light (stdlib only): `rocforge env` reads it on every shell start-up.
"""

from __future__ import annotations

import re
from functools import cache

from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.records import FRESH, Record, fresh, init
from rocforge_build.resources import load_toml, package_data

_TABLE = package_data("targets.toml")
_GFX_RE = re.compile(r"^gfx([0-9]{1,2})([0-9a-f])([0-9a-f])$")

_KEYS = {
    "gfx_target_version", "generation", "kind", "wave_size", "generic", "families",
    "legacy_families", "override_with", "wmma", "mfma", "marketing", "compute_units",
    "peak_bandwidth_gbs", "peak_fp16_tflops",
}


class Target(Record):
    __slots__ = ("name", "gfx_target_version", "generation", "kind", "wave_size", "generic",
                 "families", "legacy_families", "override_with", "wmma", "mfma", "marketing",
                 "compute_units", "peak_bandwidth_gbs", "peak_fp16_tflops", "extra")
    _hidden = ("extra",)

    def __init__(self, name: str, gfx_target_version: int, generation: str,
                 kind: str,  # "igpu" or "dgpu"
                 wave_size: int, generic: str | None = None, families: tuple[str, ...] = (),
                 legacy_families: tuple[str, ...] = (), override_with: str | None = None,
                 wmma: bool = False, mfma: bool = False, marketing: tuple[str, ...] = (),
                 compute_units: int | None = None, peak_bandwidth_gbs: float | None = None,
                 peak_fp16_tflops: float | None = None, extra: dict = FRESH):
        init(self, name, gfx_target_version, generation, kind, wave_size, generic, families,
             legacy_families, override_with, wmma, mfma, marketing, compute_units,
             peak_bandwidth_gbs, peak_fp16_tflops, fresh(extra))

    @property
    def hsa_version(self) -> str:
        """`major.minor.stepping` in decimal, the form HSA_OVERRIDE_GFX_VERSION takes."""
        return version_string(self.gfx_target_version)

    @property
    def therock_groups(self) -> tuple[str, ...]:
        """TheRock target groups serving this target, in order of preference."""
        return (self.name, *self.families, *self.legacy_families)

    def to_json(self) -> dict:
        override = get_target(self.override_with) if self.override_with else None
        return {
            "name": self.name,
            "gfx_target_version": self.gfx_target_version,
            "hsa_version": self.hsa_version,
            "generation": self.generation,
            "kind": self.kind,
            "wave_size": self.wave_size,
            "generic": self.generic,
            "families": list(self.families),
            "legacy_families": list(self.legacy_families),
            "override_with": self.override_with,
            "override_value": override.hsa_version if override else None,
            "wmma": self.wmma,
            "mfma": self.mfma,
            "marketing": list(self.marketing),
            "compute_units": self.compute_units,
            "peak_bandwidth_gbs": self.peak_bandwidth_gbs,
            "peak_fp16_tflops": self.peak_fp16_tflops,
        }


def gfx_name(gfx_target_version: int) -> str:
    """KFD `gfx_target_version` (e.g. 110501) -> gfx name (`gfx1151`)."""
    if gfx_target_version <= 0:
        raise ValueError(f"gfx_target_version {gfx_target_version} is not a GPU")
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if minor > 15 or stepping > 15:
        raise ValueError(f"gfx_target_version {gfx_target_version} is not a valid encoding")
    return f"gfx{major}{minor:x}{stepping:x}"


def gfx_version(name: str) -> int:
    """gfx name (`gfx90a`) -> KFD `gfx_target_version` (90010)."""
    m = _GFX_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a gfx target name")
    return int(m.group(1)) * 10000 + int(m.group(2), 16) * 100 + int(m.group(3), 16)


def version_string(gfx_target_version: int) -> str:
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"{major}.{minor}.{stepping}"


def parse_version_string(value: str) -> int:
    """`11.0.0` (HSA_OVERRIDE_GFX_VERSION form) -> 110000."""
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{value!r} is not major.minor.stepping")
    major, minor, stepping = (int(p) for p in parts)
    return major * 10000 + minor * 100 + stepping


@cache
def _load() -> dict[str, Target]:
    raw = load_toml(_TABLE, "target table")
    table: dict[str, Target] = {}
    for name, entry in raw.items():
        unknown = set(entry) - _KEYS
        if unknown:
            raise ConfigError(f"target table: {name}: unknown key(s) {sorted(unknown)}")
        if gfx_version(name) != entry["gfx_target_version"]:
            raise ConfigError(f"target table: {name}: gfx_target_version does not encode the name")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
        table[name] = Target(name=name, **values)
    for t in table.values():
        if t.override_with and t.override_with not in table:
            raise ConfigError(f"target table: {t.name}: override_with {t.override_with} unknown")
    return table


def all_targets() -> list[Target]:
    return sorted(_load().values(), key=lambda t: t.gfx_target_version)


def choices_hint() -> str:
    """The hint of every "no target" error: the targets to choose from."""
    return "pass --target GFX, one of: " + ", ".join(t.name for t in all_targets())


def known(name: str) -> bool:
    return name in _load()


def get_target(name: str) -> Target:
    """Look a target up by name; a clear UsageError with the closest names otherwise."""
    table = _load()
    key = name.strip().lower()
    if key in table:
        return table[key]
    import difflib  # only for the error

    close = difflib.get_close_matches(key, table, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see `rocforge targets` for the list"
    raise UsageError(f"unknown GPU target {name!r}", hint)


def family_members(family: str) -> list[Target]:
    """Targets served by a TheRock family name (current or legacy spelling)."""
    return [t for t in all_targets() if family in t.families or family in t.legacy_families]


def all_families() -> list[str]:
    seen: dict[str, None] = {}
    for t in all_targets():
        for f in (*t.families, *t.legacy_families):
            seen.setdefault(f, None)
    return list(seen)
