"""Known-bad nightlies and host states (data/known_bad.toml): which versions, firmware and
kernels break which GPUs, and why.  Nightlies are matched by `nightly install` and `doctor`;
every entry is matched against a host fingerprint (measure/provenance.host) by `doctor` and
before bench, verify, tune and serve measure anything (`warn_before_measuring`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rocforge_build.discover import host as host_facts
from rocforge_build.discover.rocm_version import version_key
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


def doctor_warnings(res, finder=find) -> list[str]:
    """A warning for rocforge's current nightly when it is known-bad for a GPU here (`finder`: the
    packaged table's `find`, or that joined to the stores' signed advisories)."""
    out = []
    gfxs = {g.gfx for g in res.gpus} | ({res.target} if res.target else set())
    for inst in res.installs:
        if not inst.nightly_current:
            continue
        for gfx in sorted(gfxs) or [None]:
            bad = finder(inst.version, gfx, inst.family)
            if bad is not None:
                out.append(f"the current nightly {inst.path}: {bad.describe(inst.version)}; "
                           "switch with `rocforge nightly use VERSION` or install another")
                break
    return out


# -- host states, matched against a fingerprint ----------------------------------------------------
_HOST_KEYS = {"targets", "kernel_below", "ubuntu_hwe", "ubuntu_oem", "firmware", "firmware_snapshot",
              "cmdline", "severity", "symptom", "evidence", "doctor_check"}
_CONDITIONS = {"kernel_below", "firmware", "cmdline"}


@dataclass(frozen=True)
class KnownBadHost:
    targets: tuple[str, ...]
    kernel: dict | None  # host.toml's floor shape: {"min", "ubuntu_hwe", "ubuntu_oem"}
    firmware: tuple[tuple[str, tuple[int, ...]], ...]
    snapshots: tuple[str, ...]
    cmdline: tuple[str, ...]
    severity: str
    symptom: str
    evidence: str
    doctor_check: str | None = None  # doctor's host check that already reports it (host.toml)

    def found(self, fp: dict) -> str | None:
        """What of the fingerprint matches every condition ("firmware mes 0x83"), None when
        one does not or cannot be read: an unreadable fact never matches."""
        seen = []
        if self.kernel is not None:
            release = fp.get("kernel")
            if not isinstance(release, str) or host_facts.meets_floor(
                    host_facts.Kernel(release, "fingerprint"), self.kernel)[0]:
                return None
            seen.append(f"kernel {release} (below {self.kernel['min']})")
        for name, bad in self.firmware:
            got = _hex((fp.get("firmware") or {}).get(name))
            if got is not None:
                if got not in bad:
                    return None
                seen.append(f"firmware {name} 0x{got:02x}")
                continue
            packages = fp.get("firmware_packages") or {}
            hits = [f"{n} {v}" for n, v in sorted(packages.items())
                    if host_facts.snapshot_of(str(v)) in self.snapshots]
            if not hits:
                return None
            seen.append(f"{', '.join(hits)} ({name} version unreadable)")
        if self.cmdline:
            words = host_facts.parse_cmdline(fp.get("cmdline") or "")
            if not all(w in words for w in self.cmdline):
                return None
            seen.append("kernel command line " + " ".join(self.cmdline))
        return "; ".join(seen)


def _hex(value) -> int | None:
    try:
        return int(str(value), 16) if value is not None else None
    except ValueError:
        return None


@cache
def host_table() -> tuple[KnownBadHost, ...]:
    raw = load_toml(package_data("known_bad.toml"), "known-bad host states")
    out = []
    for i, entry in enumerate(raw.get("host", [])):
        unknown = set(entry) - _HOST_KEYS
        if unknown or not {"symptom", "evidence"} <= set(entry) or not _CONDITIONS & set(entry) \
                or entry.get("severity", "warning") not in ("warning", "blocker"):
            raise ConfigError(f"known_bad.toml: host entry {i + 1}: unknown keys {sorted(unknown)}, "
                              "no condition (kernel_below, firmware, cmdline), no symptom/evidence, "
                              "or a severity other than warning/blocker")
        kernel = ({"min": str(entry["kernel_below"]), "ubuntu_hwe": entry.get("ubuntu_hwe"),
                   "ubuntu_oem": entry.get("ubuntu_oem")} if "kernel_below" in entry else None)
        try:
            firmware = tuple((str(k), tuple(v if isinstance(v, int) else int(str(v), 16) for v in vs))
                             for k, vs in dict(entry.get("firmware", {})).items())
        except (TypeError, ValueError):
            raise ConfigError(f"known_bad.toml: host entry {i + 1}: firmware versions must be "
                              'lists of hexadecimal numbers ("0x83")') from None
        out.append(KnownBadHost(tuple(entry.get("targets", ())), kernel, firmware,
                                tuple(str(s) for s in entry.get("firmware_snapshot", ())),
                                tuple(str(w) for w in entry.get("cmdline", ())),
                                str(entry.get("severity", "warning")), str(entry["symptom"]),
                                str(entry["evidence"]), entry.get("doctor_check")))
    return tuple(out)


@dataclass(frozen=True)
class Match:
    severity: str  # "warning" | "blocker"
    text: str  # one line: what matched, on which GPU, the symptom and its public source
    doctor_check: str | None = None  # the doctor host check that reports the same state

    def to_json(self) -> dict:
        return {"severity": self.severity, "text": self.text}


def _gfxs(fp: dict) -> list[str]:
    return sorted({g.get("gfx") for g in fp.get("gpus") or [] if isinstance(g, dict) and g.get("gfx")})


def host_matches(fp: dict) -> list[Match]:
    """The known-bad host states this fingerprint (a row's `host`) is in."""
    out = []
    for bad in host_table():
        gfxs = [g for g in _gfxs(fp) if not bad.targets or g in bad.targets]
        if bad.targets and not gfxs:
            continue
        found = bad.found(fp)
        if found is not None:
            where = f" on {', '.join(gfxs)}" if gfxs else ""
            out.append(Match(bad.severity, f"known bad: {found}{where}: {bad.symptom} ({bad.evidence})",
                             bad.doctor_check))
    return out


def matches(fp: dict) -> list[Match]:
    """Host states, and the ROCm of the fingerprint when it is a known-bad nightly."""
    out = host_matches(fp)
    version = fp.get("rocm")
    for gfx in _gfxs(fp) or [None]:
        bad = find(version, gfx)
        if bad is not None:
            out.append(Match("warning", f"known bad: ROCm {bad.describe(version)}"))
            break
    return out


def warn_before_measuring(fp: dict, stream=None) -> list[Match]:
    """One `rocforge: warning:` line per match on stderr, before bench, verify, tune or serve
    measure anything: a result from a known-bad host is still recorded, but nobody should read
    it as the build's fault without knowing."""
    import sys

    found = matches(fp)
    for m in found:
        (stream or sys.stderr).write(f"rocforge: warning: {m.text}\n")
    return found
