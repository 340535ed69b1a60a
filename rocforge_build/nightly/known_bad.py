"""Known-bad nightlies (data/known_bad.toml): which versions break which GPUs, and why."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rocforge_build.discover.installs import version_key
from rocforge_build.errors import ConfigError
from rocforge_build.resources import load_toml, package_data

_KEYS = {"from", "to", "targets", "symptom", "evidence"}


@dataclass(frozen=True)
class KnownBad:
    first: str
    last: str
    targets: tuple[str, ...]
    symptom: str
    evidence: str

    def covers(self, version: str | None) -> bool:
        return bool(version) and version_key(self.first) <= version_key(version) \
            <= version_key(self.last)

    def hits(self, target: str | None, family: str | None = None) -> bool:
        """Whether it breaks `target` (or, with no target, a group such as gfx115X-all)."""
        if not self.targets:
            return True
        if target:
            return target in self.targets
        return bool(family) and any(t in family or family.startswith(t[:-1]) for t in self.targets)

    def describe(self, version: str) -> str:
        return (f"{version} is a known-bad nightly ({self.first} to {self.last} "
                f"{self.symptom} on {', '.join(self.targets) or 'every GPU'}; {self.evidence})")


@cache
def table() -> tuple[KnownBad, ...]:
    raw = load_toml(package_data("known_bad.toml"), "known-bad nightlies")
    out = []
    for i, entry in enumerate(raw.get("nightly", [])):
        unknown = set(entry) - _KEYS
        if unknown or not {"from", "to", "symptom", "evidence"} <= set(entry):
            raise ConfigError(f"known_bad.toml: entry {i + 1}: unknown keys {sorted(unknown)} "
                              "or missing from/to/symptom/evidence")
        out.append(KnownBad(str(entry["from"]), str(entry["to"]), tuple(entry.get("targets", ())),
                            str(entry["symptom"]), str(entry["evidence"])))
    return tuple(out)


def find(version: str | None, target: str | None = None,
         family: str | None = None) -> KnownBad | None:
    for bad in table():
        if bad.covers(version) and bad.hits(target, family):
            return bad
    return None


def doctor_warnings(res) -> list[str]:
    """A warning for rocforge's current nightly when it is known-bad for a GPU here."""
    out = []
    gfxs = {g.gfx for g in res.gpus} | ({res.target} if res.target else set())
    for inst in res.installs:
        if not inst.nightly_current:
            continue
        for gfx in sorted(gfxs) or [None]:
            bad = find(inst.version, gfx, inst.family)
            if bad is not None:
                out.append(f"the current nightly {inst.path}: {bad.describe(inst.version)}; "
                           "switch with `rocforge nightly use VERSION` or install another")
                break
    return out
