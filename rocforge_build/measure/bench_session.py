"""`rocforge bench` as one recorded run: the spec it asked in the results store, each build gated
by `rocforge verify` first, and how the run ended — kept apart from measure/bench.py, which
measures, because verify's gate itself measures with bench (tune's race)."""

from __future__ import annotations

from dataclasses import dataclass

from rocforge_build.measure import bench
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.session import Progress, Session


@dataclass(frozen=True, kw_only=True)
class Gate:
    """`rocforge verify` before a build is measured: against `reference` (None: the reference
    rocforge makes) at the contexts `ctx` (None: verify's own coverage of the model)."""

    reference: str | None = None
    ctx: list[int] | None = None


def recorded(session: Session, builds: list[LlamaBuild], spec: bench.Spec, vs: list[bench.Variant], *,
             gate: Gate | None, argv: list[str] | None, quiet: bool) -> tuple[int, bench.Outcome]:
    """(run id, outcome) of `bench.run` recorded as one results-store run of kind "bench": the spec it
    asked, each build gated by verify first unless `gate` is None, and how it ended (done, partly
    failed, interrupted, failed) with the time llama-bench and the warm-ups took — an interrupted
    run keeps the rows it measured."""
    s = session
    run_id = s.store.start_run("bench", argv, {"host": s.base["host"], "model": s.base["model"],
                                               "spec": {"depths": spec.depths, "n_prompt": spec.n_prompt,
                                                        "n_gen": spec.n_gen, "reps": spec.reps}})
    progress = Progress(len(builds) * len(vs) * len(bench.expected(spec, spec.depths)), quiet=quiet)

    def verified(build: LlamaBuild, fa):
        from rocforge_build.measure import verify  # only gated runs pay for importing it

        coverage = verify.plan(s.model, gpu=build.gpu, ctx=gate.ctx)
        return verify.gate(build, s.model, reference=gate.reference, store=s.store, run_id=run_id,
                           base=s.base, coverage=coverage, fa=fa, quiet=quiet)

    status, out = "failed", None
    try:
        out = bench.run(builds, spec, vs, store=s.store, run_id=run_id, base=s.base,
                  gate=None if gate is None else verified, progress=progress)
        status = "done" if not out.failed else "partly failed"
    except bench.Interrupted:
        status = "interrupted"
        raise
    finally:
        progress.close()
        s.store.finish_run(run_id, status, None if out is None else
                           {**(s.store.run_info(run_id) or {}).get("info", {}), "llama_bench_s": round(out.child_s, 4),
                            "warmup_s": out.warmup_s})
    return run_id, out
