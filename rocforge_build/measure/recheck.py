"""After a rebuild: when the results store holds bench results of the same prefix from an earlier
build, verify and bench the new build the same way and compare, so a new nightly or source that is
slower or wrong is caught at once (`rocforge build --no-recheck` skips it)."""

from __future__ import annotations

import sys
from pathlib import Path

from rocforge_build import paths
from rocforge_build.errors import RocforgeError


def earlier_run(store, prefix: str, stamp: str | None) -> tuple[int, list[dict]] | None:
    """The latest bench run of `prefix` measured on a different build (stamp)."""
    rows = [r for r in store.rows(prefix=prefix, kind="bench") if r.stamp != stamp]
    if not rows:
        return None
    run_id = rows[-1].run_id
    return run_id, [r.data for r in rows if r.run_id == run_id]


def after_build(prefix: Path, *, threshold: float | None = None, argv: list[str] | None = None) -> int | None:
    """Re-measure and compare; returns the number of flagged lines, or None when there was nothing
    to compare with.  Never fails the build it follows: problems are reported as one line."""
    from rocforge_build.measure.store import Store

    if not paths.results_db().is_file():
        return None
    try:
        with Store() as store:
            return _recheck(store, prefix, threshold, argv)
    except RocforgeError as exc:
        sys.stderr.write(f"rocforge: recheck skipped: {exc.message}\n")
        return None


def _recheck(store, prefix: Path, threshold, argv) -> int | None:
    from rocforge_build.measure import bench, compare, verify
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.session import open_session

    if threshold is None:
        threshold = compare.DEFAULT_THRESHOLD
    build = LlamaBuild.open(prefix)
    found = earlier_run(store, str(build.prefix), build.stamp)
    if found is None:
        return None
    old_run, old = found
    model_path = old[0].get("model", {}).get("path")
    if not model_path or not Path(model_path).is_file():
        sys.stderr.write(f"rocforge: recheck skipped: the model of run {old_run} ({model_path}) is gone\n")
        return None
    ok = [r for r in old if r.get("test") in ("pp", "tg")]
    depths = tuple(sorted({int(r["depth"]) for r in ok})) or (0,)
    n_prompt = next((r["n_prompt"] for r in ok if r["test"] == "pp"), 0)
    n_gen = next((r["n_gen"] for r in ok if r["test"] == "tg"), 0)
    reps = len((ok[0].get("llama_bench") or {}).get("samples_ts") or []) or 3 if ok else 3
    vs = sorted({bench.Variant(r.get("ubatch"), r.get("fa"), tuple(sorted((r.get("env") or {}).items())))
                 for r in ok}, key=lambda v: v.label()) or [bench.Variant()]
    s = open_session(model_path, [build], ("llama-bench", "llama-perplexity"))
    spec = bench.Spec(s.model, depths, n_prompt, n_gen, reps)
    sys.stderr.write(f"rocforge: {build.prefix} has results from an earlier build (run {old_run}): "
                     f"verifying and measuring the new one the same way\n")
    run_id = s.store.start_run("recheck", argv or [], {"host": s.base["host"], "model": s.base["model"],
                                                        "compared_with": old_run})

    def gate(b, fa):
        return verify.gate(b, s.model, reference=None, store=s.store, run_id=run_id, base=s.base,
                           coverage=verify.plan(s.model, gpu=b.gpu),
                           fa=fa, quiet=True)

    out = bench.run([build], spec, vs, store=s.store, run_id=run_id, base=s.base, gate=gate)
    s.store.finish_run(run_id, "done")
    lines = compare.compare(old, out.rows, threshold)
    if any(r.get("gate") == "failed" for r in out.rows):
        print(f"WRONG: the new build of {build.prefix} fails `rocforge verify` (its output differs from the "
              f"reference); the earlier build passed")
    print(compare.table(lines, f"run {old_run} (earlier build)", f"run {run_id} (this build)", threshold))
    return len(compare.flagged(lines))
