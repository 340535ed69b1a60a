"""What `rocforge doctor` finds on a host: the system's access and kernel checks, the host checks,
the known-bad list and the resolved stack's own problems, gathered once into one `Findings`
value that the JSON and the text report both print, so neither can judge the stack differently."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from rocforge_build.discover import host, host_checks, known_bad, resolver
from rocforge_build.resources import load_toml, package_data
from rocforge_build.rootfs import Root

_CHECKS = package_data("doctor.toml")


@dataclass(frozen=True, kw_only=True)
class Findings:
    """Everything doctor reports beyond the resolution: the host checks, the warnings, and the
    blockers (empty exactly when the stack is usable for running GPU code)."""

    host: tuple[host_checks.Check, ...]
    warnings: tuple[str, ...]
    blockers: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not self.blockers


# given a reporter of a store's problem (one line each), a known-bad finder: what the substitute
# stores' signed nightly advisories add to known_bad.find (substitute/advisories.py, above this room)
AdvisoryFinder = Callable[[Callable[[str], None]], Callable]


def gather(rootfs: Root, res: resolver.Resolution, advisories: AdvisoryFinder | None = None) -> Findings:
    """The findings of every source doctor asks: the resolver, the system checks, the host checks
    and the known-bad list, joined to `advisories` when a current nightly is there to judge (only
    then is a store asked; its problem is a warning line)."""
    sys_warnings, sys_blockers = system_checks(rootfs, res)
    found = host_checks.checks(rootfs, res.gpus)  # a host check at "fail" blocks; "warn" does not
    # known-bad host states, less those the host checks already report (with their fix)
    reported = {c.id for c in found if c.status != "ok"}
    bad_host = [m for m in known_bad.host_matches(host_fingerprint(rootfs, res)) if m.doctor_check not in reported]
    blockers = [*stack_blockers(res), *res.blockers, *sys_blockers, *host_checks.blockers(found),
                *(m.text for m in bad_host if m.severity == "blocker")]
    store_lines: list[str] = []
    finder = known_bad.find
    if advisories is not None and any(inst.nightly_current for inst in res.installs):
        finder = advisories(lambda line: store_lines.append(f"nightly advisories: {line}"))
    warnings = [*res.warnings, *sys_warnings, *known_bad.doctor_warnings(res, finder), *store_lines,
                *(m.text for m in bad_host if m.severity == "warning")]
    return Findings(host=tuple(found), warnings=tuple(warnings), blockers=tuple(blockers))


def _groups(root: Root) -> dict[str, list[str]]:
    text = root.read_text("/etc/group") if root.is_file("/etc/group") else ""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[0]:
            out[parts[0]] = [m for m in parts[3].split(",") if m]
    return out


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")


def _kernel_version(root: Root) -> str | None:
    """`6.14` or `6.14.0` of the running kernel, read by host.py (osrelease, /proc/version, uname)."""
    kernel = host.read_kernel(root)
    m = re.search(r"(\d+\.\d+)(?:\.\d+)?", kernel.release) if kernel else None
    return m.group(0) if m else None


def _vkey(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def system_checks(root: Root, res: resolver.Resolution) -> tuple[list[str], list[str]]:
    """(warnings, blockers): blockers make the stack unusable for running GPU code."""
    checks = load_toml(_CHECKS, "doctor checks")
    warnings: list[str] = []
    blockers: list[str] = []
    detected = [g for g in res.gpus if g.source != "--target"]
    group_names = checks["access"]["groups"]
    groups = _groups(root)
    user = _user()
    kfd = "/dev/kfd"
    if not root.exists(kfd):
        msg = ("/dev/kfd is missing: the amdgpu kernel driver is not loaded, or the container "
               "was started without --device=/dev/kfd --device=/dev/dri")
        (blockers if detected else warnings).append(msg)
    else:
        device = root.host(kfd)
        if root.is_host:
            ok = os.access(device, os.R_OK | os.W_OK)
        else:
            mode = device.stat().st_mode
            ok = (mode & 0o006) == 0o006 or any(user in groups.get(g, []) for g in group_names)
        if not ok:
            members = "; ".join(f"{g}: {', '.join(groups[g]) or 'no members'}"
                                for g in group_names if g in groups) or "no render/video group"
            blockers.append(
                f"/dev/kfd is not readable and writable by {user or 'this user'} ({members}); "
                f"run `sudo usermod -aG {','.join(group_names)} {user or '$USER'}` and log in again")
    kernel = _kernel_version(root)
    if kernel:
        for g in {t.generation for g in detected if (t := g.target)}:
            rule = checks["kernel"].get(g)
            if rule and _vkey(kernel) < _vkey(rule["min"]):
                warnings.append(f"kernel {kernel} is older than {rule['min']}, which rocforge "
                                f"recommends for {g} GPUs: {rule['why']}")
    return warnings, blockers


def host_fingerprint(root: Root, res: resolver.Resolution) -> dict:
    """The fields of a measurement's host (measure/provenance.host) that the known-bad list
    matches, read from the same files: kernel, the detected GPUs, firmware, command line."""
    kernel = host.read_kernel(root)
    gpus = [g for g in res.gpus if g.source != "--target"]
    return {**host.fingerprint(root, gpus), "kernel": kernel.release if kernel else None,
            "gpus": [{"gfx": g.gfx} for g in gpus]}


def _interesting_targets(res: resolver.Resolution) -> list[str]:
    names: list[str] = []
    for g in res.gpus:
        names.append(g.gfx)
        if g.known and g.target.override_with:
            names.append(g.target.override_with)
    if res.target:
        names.append(res.target)
    return list(dict.fromkeys(names))


def coverage_rows(res: resolver.Resolution) -> list[dict]:
    """Per ROCm install and per target doctor shows (the GPUs', their overrides', the asked
    one): whether it has kernels, and which libraries name the target."""
    rows = []
    for inst in res.installs:
        for gfx in _interesting_targets(res):
            ok, why = inst.coverage.kernels_for(gfx)
            c = inst.coverage
            rows.append({"install": str(inst.path), "target": gfx, "kernels": ok, "evidence": why,
                         "rocblas": gfx in c.rocblas, "hipblaslt": gfx in c.hipblaslt,
                         "bitcode": gfx in c.bitcode, "dist_info": gfx in c.dist})
    return rows


def stack_blockers(res: resolver.Resolution) -> list[str]:
    """Why the resolved stack cannot serve the target: every `usable: false` has a reason."""
    if res.rocm is None:
        return [f"no ROCm install found: {resolver.install_hint(res.target)}"]
    if res.target is not None:
        ok, why = res.rocm.coverage.kernels_for(res.target)
        if not ok:
            return [f"ROCm {res.rocm.path} has no kernels for {res.target} ({why}): "
                    + resolver.install_hint(res.target)]
    return []
