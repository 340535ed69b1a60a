"""How many jobs a build runs at once: min(cores, MemAvailable / the recipe's per-job memory),
and, when the OOM killer ended a build anyway, the line that names the setting to lower.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# per-job memory when a recipe has no `[[jobs]]` figure
DEFAULT_JOB_MB = 1024
_OOM_RE = re.compile(r"Killed signal terminated program|unable to execute command: Killed|"
                     r"signal 9|^Killed$|terminated by signal 9|Out of memory", re.M | re.I)


@dataclass(frozen=True)
class Jobs:
    jobs: int
    cores: int
    mem_available_mb: int | None
    per_job_mb: int
    reason: str
    tensile_threads: int
    evidence: tuple[str, ...] = ()  # the recipe's `[[jobs]]` rule's, where its reason is given

    def to_json(self) -> dict:
        return {"jobs": self.jobs, "cores": self.cores, "mem_available_mb": self.mem_available_mb,
                "per_job_mb": self.per_job_mb, "reason": self.reason,
                "tensile_cpu_threads": self.tensile_threads,
                **({"evidence": list(self.evidence)} if self.evidence else {})}


def cores(root) -> int:
    """CPUs this build may use: the affinity mask here, `processor` lines of a --root's cpuinfo."""
    if (root is None or root.is_host) and hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    try:
        n = sum(1 for line in root.read_text("/proc/cpuinfo").splitlines()
                if line.startswith("processor"))
    except OSError:
        n = 0
    return n or os.cpu_count() or 1


def mem_available_mb(root) -> int | None:
    from rocforge_build.discover.host import parse_meminfo

    try:
        kib = parse_meminfo(root.read_text("/proc/meminfo"), "MemAvailable")
    except OSError:
        return None
    return kib // 1024 if kib is not None else None


def choose_jobs(root, requested: int | None, per_job_mb: int, per_job_reason: str,
                per_job_evidence: tuple[str, ...] = ()) -> Jobs:
    n_cores = cores(root)
    avail = mem_available_mb(root)

    def tensile(jobs: int) -> int:  # spack's rocblas package: min(16, make_jobs)
        return min(16, jobs)

    if requested:
        return Jobs(requested, n_cores, avail, per_job_mb, "asked for with --jobs", tensile(requested))
    if avail is None:
        return Jobs(n_cores, n_cores, None, per_job_mb,
                    f"{n_cores} cores; /proc/meminfo has no MemAvailable, memory not counted",
                    tensile(n_cores))
    by_mem = max(1, avail // per_job_mb)
    jobs = min(n_cores, by_mem)
    why = (f"min({n_cores} cores, {avail} MB available / {per_job_mb} MB per job = {by_mem})"
           f" — {per_job_reason}")
    if by_mem < n_cores:
        why += "; memory is the limit: more jobs would risk the OOM killer"
    return Jobs(jobs, n_cores, avail, per_job_mb, why, tensile(jobs), per_job_evidence)


# -- after a failed build -------------------------------------------------------------------------

def oom_kills() -> int | None:
    """The OOM-kill count of this process's cgroup (v2 memory.events, v1 memory.oom_control)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            f = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            m = re.search(r"^oom_kill (\d+)", f.read_text(), re.M)
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def explain_oom(output_tail: str, kills_before: int | None, jobs: Jobs) -> str | None:
    """A line naming the OOM killer and the setting to lower, when the failure looks like it."""
    after = oom_kills()
    counted = kills_before is not None and after is not None and after > kills_before
    if not counted and not _OOM_RE.search(output_tail):
        return None
    lower = max(1, jobs.jobs // 2)
    evidence = "the kernel's OOM-kill count went up" if counted else "a compiler was killed (signal 9)"
    return (f"the build ran out of memory ({evidence}) with -j {jobs.jobs} ({jobs.reason}); "
            f"lower it: rocforge build ... --jobs {lower}")
