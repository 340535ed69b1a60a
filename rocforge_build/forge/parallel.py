"""One plan's share of the machines: the compiler cache (`cache.py`), the job count
(`jobs.py`) and the distribution (`distributed.py`) decided together for a build, printed with
their reasons, and wrapped around the build step (`during_build`); `doctor_checks` asks the
configured cache server and build hosts whether they answer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rocforge_build.errors import BuildError, UsageError
from rocforge_build.forge.cache import (
    CCACHE_SCHEMES,
    CacheSetup,
    probe,
    read_stats,
    redact,
    run_sccache,
    sccache_stats,
    setup_cache,
    stats_log,
    summary,
)
from rocforge_build.forge.distributed import (
    Distribution,
    check_host,
    compiler_ident,
    icecc_daemon,
    icecc_scheduler_hosts,
    setup_distribution,
)
from rocforge_build.forge.jobs import DEFAULT_JOB_MB, Jobs, choose_jobs, explain_oom, oom_kills
from rocforge_build.forge.plan_values import CMakeOption
from rocforge_build.forge.recipes import evidence_lines
from rocforge_build.proc import which


@dataclass
class Parallel:
    """What this module decides for one plan."""

    cache: CacheSetup
    jobs: Jobs
    build_jobs: int  # ninja -j: the local jobs, plus the hosts' slots when distributing
    distribution: Distribution | None = None
    options: list[CMakeOption] = field(default_factory=list)

    @property
    def launcher(self) -> str | None:
        if self.cache.launcher:
            return self.cache.launcher
        return self.distribution.env.get("DISTCC_LAUNCHER") if self.distribution else None

    @property
    def hip_launcher(self) -> str | None:
        """CMAKE_HIP_COMPILER_LAUNCHER: the launcher, or, when HIP compiles need a server of
        their own (sccache-dist), the launcher run through env with that server's variables."""
        d = self.distribution
        if d is None or not d.hip_server or not self.cache.launcher:
            return self.launcher
        return ";".join(["env", *(f"{k}={v}" for k, v in d.hip_server.items()), self.cache.launcher])

    @property
    def env(self) -> dict[str, str]:
        out = dict(self.cache.env)
        if self.distribution:
            out.update({k: v for k, v in self.distribution.env.items() if k != "DISTCC_LAUNCHER"})
        return out

    @property
    def reasons(self) -> dict[str, str]:
        return {**self.cache.reasons, **(self.distribution.reasons if self.distribution else {})}

    @property
    def notes(self) -> list[str]:
        notes = list(self.cache.notes)
        if self.cache.remote and not self.cache.remote_used:
            notes.append(f"cache server {self.cache.remote} {self.cache.remote_status}: this build "
                         "uses the local cache only")
        if self.distribution:
            what = {"distcc": "distcc host", "icecc": "icecream:"}.get(self.distribution.tool, "sccache-dist:")
            notes += [f"{what} {h} left out: {why}" for h, _, why in
                      (x.partition(": ") for x in self.distribution.left_out)]
            notes += [f"kept local: {what}" for what in self.distribution.local]
        return notes

    def to_json(self) -> dict:
        return {"cache": self.cache.to_json(), "jobs": self.jobs.to_json(),
                "build_jobs": self.build_jobs,
                "distribution": self.distribution.to_json() if self.distribution else None}


def for_plan(rules: list, facts, *, root, requested_jobs: int | None, no_cache: bool,
             distribute: bool, kind: str, work: Path, environ: Mapping[str, str],
             cfg: Mapping) -> Parallel:
    """The cache, the jobs and the distribution of one build; `rules` are the recipe's `[[jobs]]`,
    `cfg` the request's settings snapshot (Request.settings)."""
    from rocforge_build.forge import conditions

    per_job, per_job_reason = DEFAULT_JOB_MB, "no per-job memory figure in the recipe: 1 GB assumed"
    per_job_evidence: tuple[str, ...] = ()
    for rule in rules:
        holds, why = conditions.explain(rule.when, facts)
        if holds:
            per_job, per_job_reason = rule.get("memory_mb"), rule.get("reason")
            per_job_evidence = tuple(rule.get("evidence", ()))
    jobs = choose_jobs(root, requested_jobs, per_job, per_job_reason, per_job_evidence)
    setup = setup_cache(cfg["cache"], no_cache=no_cache, hip=kind == "hip", work=work, environ=environ)
    if setup.kind == "ccache":
        setup.env["CCACHE_STATSLOG"] = str(stats_log(work))
        setup.reasons["CCACHE_STATSLOG"] = "this build's hits and misses, for the manifest"
    par = Parallel(setup, jobs, jobs.jobs)
    if not distribute:
        return par
    compilers = [environ.get("CC", "cc"), environ.get("CXX", "c++")]
    dist = setup_distribution(cfg["build"], setup, local_jobs=jobs.jobs, hip=kind == "hip",
                              compilers=compilers, environ=environ, work=work)
    if setup.launcher is None:  # --no-cache: distcc itself is the launcher
        dist.env["DISTCC_LAUNCHER"] = which(dist.tool, environ.get("PATH")) or dist.tool
    par.distribution = dist
    par.build_jobs = jobs.jobs + dist.capacity
    par.options = [CMakeOption(name="CMAKE_JOB_POOLS", value=f"link={jobs.jobs}", because="--distribute",
                               reason="links stay local: at most the local job count at once"),
                   CMakeOption(name="CMAKE_JOB_POOL_LINK", value="link", because="--distribute",
                               reason="every link step in the local pool")]
    return par


def print_plan(par: Parallel, w) -> None:
    """The plan's cache / distribution / jobs lines, each with its reason."""
    c = par.cache
    if c.kind is None:
        w("cache    none (--no-cache, cache.launcher = none, or no ccache/sccache on PATH)\n")
    else:
        w(f"cache    {c.kind} ({c.launcher}), local"
          + (" + remote" if c.remote_used and not c.remote_only else " (remote only)" if c.remote_used
             else "") + "\n")
        if c.remote:
            w(f"  remote {c.remote}: {c.remote_status}\n")
        if c.hip:
            w(f"  HIP: {c.hip}\n")
    j = par.jobs
    w(f"jobs     {j.jobs} — {j.reason}\n")
    for line in evidence_lines(j.evidence, "  "):
        w(line + "\n")
    if j.tensile_threads != j.jobs:
        w(f"  Tensile_CPU_THREADS-capable recipes get {j.tensile_threads}: min(16, jobs), as spack's "
          "rocblas package does (Tensile starts a job per core and uses a lot of memory)\n")
    d = par.distribution
    if d:
        w(f"distribute {d.tool}: {', '.join(d.hosts) or 'no host answered'} — {d.capacity} remote "
          f"slots; ninja -j {par.build_jobs}\n")
        if d.daemon:
            w(f"  local iceccd at {d.daemon}; the hosts compile with this machine's compiler, "
              "which icecream ships to them (icecc-create-env)\n")
        for x in d.left_out:
            w(f"  left out {x}\n")
        for x in d.local:
            w(f"  local: {x}\n")


def secret_env(par: Parallel | None) -> dict[str, str]:
    """The launcher's variables with their credentials, for the build's processes only."""
    return dict(par.cache.secret_env) if par else {}


@dataclass
class CacheCounts:
    """The compiler cache's counts for one build (hits, misses...), known once it has run."""

    counts: dict[str, int] | None = None


@contextlib.contextmanager
def during_build(par: Parallel | None, work: Path, say) -> Iterator[CacheCounts]:
    """Around the build step: a fresh stats log before; after, this build's counts (yielded, for
    the manifest) and the hit-rate line; a failure the OOM killer caused says so and what to lower."""
    found = CacheCounts()
    if par is None:
        yield found
        return
    log = stats_log(work)
    log.unlink(missing_ok=True)
    hip_env = par.distribution.hip_server if par.distribution else {}
    if par.distribution and par.distribution.hip_conf:
        path, text = par.distribution.hip_conf
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    if par.cache.kind == "sccache":
        run_sccache(par.cache, "--zero-stats")
        if hip_env:
            run_sccache(par.cache, "--zero-stats", env=hip_env)
    kills = oom_kills()
    try:
        yield found
    except BuildError as exc:
        why = explain_oom(exc.message, kills, par.jobs)
        if why:
            raise BuildError(f"{why}\n{exc.message}", exc.hint) from exc
        raise
    finally:
        if par.cache.kind in ("ccache", "sccache"):
            stats = read_stats(log) if par.cache.kind == "ccache" else sccache_stats(par.cache)
            if par.cache.kind == "sccache" and hip_env:  # the HIP compiles' own server
                for k, v in sccache_stats(par.cache, env=hip_env).items():
                    stats[k] = stats.get(k, 0) + v
            found.counts = stats
            for line in summary(par.cache, stats):
                say(f"  {line}")


def doctor_checks(environ: Mapping[str, str] | None = None) -> list[dict]:
    """For `rocforge doctor`: does the configured cache server and does each build host answer
    (and compile like this machine)? Empty when none is configured."""
    from rocforge_build import config

    environ = dict(os.environ if environ is None else environ)
    cfg = config.effective()
    rows = []
    url = cfg["cache"]["remote"]
    if url:
        scheme = urlsplit(url).scheme.lower()
        status = ("not checked: S3 needs the bucket's credentials" if scheme == "s3" else
                  probe(url) if scheme in CCACHE_SCHEMES else f"left out: unknown scheme {scheme!r}")
        rows.append({"what": "cache server", "address": redact(url), "status": status})
    compilers = [environ.get("CC", "cc"), environ.get("CXX", "c++")]
    reference = {c: compiler_ident(c, None, environ) for c in compilers} if cfg["build"]["distcc_hosts"] else {}
    for spec in cfg["build"]["distcc_hosts"]:
        try:
            why = check_host(spec, compilers, reference, environ)
        except UsageError as exc:
            why = exc.message
        rows.append({"what": "distcc host", "address": spec, "status": why or "answers"})
    sched = cfg["build"]["icecc_scheduler"]
    if sched:
        try:
            servers = icecc_scheduler_hosts(sched)
            status = (f"answers: {len(servers)} host(s), "
                      f"{sum(h.max_jobs for h in servers if h.port)} remote job slots"
                      + "".join(f"; {h.name} ({h.address}) {h.max_jobs} jobs" for h in servers))
        except OSError as exc:
            status = f"does not answer ({exc.strerror or exc})"
        rows.append({"what": "icecream scheduler", "address": sched, "status": status})
        daemon = icecc_daemon(environ)
        rows.append({"what": "icecream daemon", "address": daemon or "this machine",
                     "status": "answers" if daemon else "not running (no iceccd socket answers)"})
    return rows
