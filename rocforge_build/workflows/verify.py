"""`rocforge verify`: a build's logits compared with a reference build's at the shapes that run
(measure/verify.py), with llama.cpp's backend-ops stage, recorded in the results store.

The reference is the one given, else one on disk that serves, else one made now, asked of the
configured substitute stores first (`substitute.from_stores`) as any build is: that reach into
substitute/ puts the session here, above both rooms.  A CPU build of rocforge's default plan is
itself the reference: nothing is compared, and its verdict is recorded as proven.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rocforge_build.measure import backend_ops, serving, verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.session import Session, open_session
from rocforge_build.measure.verify_reference import refuse_self_compare, same_build
from rocforge_build.rootfs import Root


@dataclass(frozen=True)
class VerifyAsked:
    """One `rocforge verify` with every flag read: the build and the reference given (opened),
    the model, the coverage asked for (None: verify's default), the text, the runtime
    environment, the backend-ops stage, the root, the command line recorded with the run, and
    whether progress is kept quiet (`--json`)."""
    build: LlamaBuild
    model: str
    reference: LlamaBuild | None = None
    ctx: tuple[int, ...] | None = None
    max_ctx: int | None = None
    ubatch: tuple[int, ...] | None = None
    quick: bool = False
    fa: bool | None = None  # --fa on (True) or off (False); None: both
    kv: tuple[str, ...] | None = None
    load: tuple[str, ...] | None = None
    parallel: tuple[int, ...] | None = None
    text: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    backend_ops: backend_ops.StageAsked = backend_ops.StageAsked()
    rootfs: Root | None = None
    argv: tuple[str, ...] = ()
    quiet: bool = False


@dataclass(frozen=True)
class Verified:
    """What verify found: the build, the reference it was compared with (the build itself when
    it is the reference), and `rocforge verify --json`'s document."""
    build: LlamaBuild
    reference: LlamaBuild
    result: dict

    @property
    def passed(self) -> bool:
        return bool(self.result["passed"])

    @property
    def is_reference(self) -> bool:
        return bool(self.result.get("is_reference"))


def coverage_of(asked: VerifyAsked, session: Session) -> verify.Coverage:
    """The shapes checked: the ones asked for, else verify's default for this build and model."""
    build = asked.build
    return verify.plan(session.model, gpu=build.gpu, ctx=_listed(asked.ctx), max_ctx=asked.max_ctx,
                       quick=asked.quick, ubatch=_listed(asked.ubatch),
                       fa=None if asked.fa is None else [asked.fa], kv=_listed(asked.kv),
                       load=_listed(asked.load), parallel=_listed(asked.parallel),
                       support=serving.ServingSupport.of(build))


def _listed(values: tuple | None) -> list | None:
    return list(values) if values else None


def verify_build(asked: VerifyAsked, say: Callable[[str], None] | None) -> Verified:
    """The build checked against its reference at every shape of its coverage, then the
    backend-ops stage; the run and its verdict recorded.  `say` hears the progress (None: quiet)."""
    from rocforge_build import substitute

    build, given = asked.build, asked.reference
    s = open_session(asked.model, [build] + ([given] if given else []), ("llama-perplexity",),
                     asked.rootfs)
    coverage = coverage_of(asked, s)
    # a reference rocforge makes is asked of the substitute stores first, as any build is
    ref = given or verify.reference_for(build, None, quiet=asked.quiet, substitute=substitute.from_stores)
    if given is None and same_build(build, ref):
        return Verified(build, build, recorded_as_reference(build, s, asked.argv))
    refuse_self_compare(build, ref)  # a build against itself: nothing compared, never PASSED
    run_id = s.store.start_run("verify", list(asked.argv),
                               {"host": s.base["host"], "model": s.base["model"]})
    env = dict(asked.env)
    stage = backend_ops.stage_for(build, asked.backend_ops, quick=asked.quick, env=env, progress=say)
    try:
        result = verify.verify(build, ref, s.model, coverage, store=s.store, run_id=run_id,
                               base=s.base, text=asked.text, env=env, progress=say)
    except BaseException:
        s.store.finish_run(run_id, "failed")
        raise
    result = backend_ops.with_stage(build, result, stage, str(s.model.path), str(ref.prefix))
    s.store.finish_run(run_id, "passed" if result["passed"] else "failed")
    return Verified(build, ref, result)


def recorded_as_reference(build: LlamaBuild, s: Session, argv: tuple[str, ...]) -> dict:
    """A CPU build of rocforge's default plan is the reference every other build is verified
    against: nothing is compared, so no PASSED; the verdict is recorded so that `env`, tune's gate
    and `serve` count it as proven."""
    from rocforge_build.discover import choices

    line = (f"{build.prefix} is rocforge's reference (a CPU build of the default plan): nothing to "
            "compare it with; other builds of this source are verified against it")
    run_id = s.store.start_run("verify", list(argv), {"host": s.base["host"], "model": s.base["model"]})
    result = {"passed": True, "reference": str(build.prefix), "is_reference": True, "checks": [],
              "note": line}
    s.store.add_row(run_id, "verify", {**s.base, "prefix": str(build.prefix), "backend": build.backend,
                                       "stamp": build.stamp, "reference_stamp": build.stamp,
                                       "build": build.provenance(), **result}, status="passed")
    s.store.finish_run(run_id, "passed")
    choices.record_verify(build.prefix, build.stamp, True, model=str(s.model.path), reference=str(build.prefix))
    return result
