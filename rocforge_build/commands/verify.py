"""`rocforge verify PREFIX --model GGUF`: compare a build's logits with a reference build of the
same source (llama.cpp's KL-divergence mode) at the shapes that run — contexts up to the model's
training context, the micro-batches tune may choose, flash attention on and off, full and partial
offload — and exit 1 when any check fails."""

from __future__ import annotations

import argparse
import json
import sys

from rocforge_build import argtypes
from rocforge_build.measure import backend_ops, bench, serving, verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.session import open_session
from rocforge_build.measure.verify_reference import refuse_self_compare, same_build


def add_arguments(parser) -> None:
    parser.add_argument("prefix", metavar="PREFIX", help="the build to check (its install prefix)")
    parser.add_argument("--model", required=True, metavar="GGUF", help="the model to run")
    parser.add_argument("--reference", metavar="PREFIX",
                        help="reference build (default: a cpu build of the same recipe and source; "
                        "built under the builds directory's reference/ when none has llama-perplexity)")
    parser.add_argument("--ctx", type=argtypes.int_list(1), metavar="N,...",
                        help="contexts to check (default: 512 up to the model's training context, capped at 32768)")
    parser.add_argument("--max-ctx", type=argtypes.context, metavar="N",
                        help="check no context longer than N")
    parser.add_argument("--ubatch", type=argtypes.int_list(1), metavar="N,...",
                        help="micro-batches to check (default: the smallest and largest tune searches)")
    parser.add_argument("--quick", action="store_true", help="the shortest context's checks only (seconds, not minutes)")
    parser.add_argument("--text", metavar="FILE", help="text to evaluate (default: the one rocforge ships, "
                        "Pride and Prejudice, public domain)")
    parser.add_argument("--fa", choices=("on", "off"),
                        help="check this flash-attention setting only (default: both)")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                        help="runtime environment for the build's run (repeatable)")
    parser.add_argument("--kv", type=serving.kv_list, metavar="f16,q8_0",
                        help="KV cache types to check (default: f16 and q8_0 where the build has -ctk/-ctv; --quick: f16)")
    parser.add_argument("--load", type=serving.load_list, metavar="mmap,read,dio",
                        help="how the weights are loaded: mapped (llama.cpp's default), read (--no-mmap), "
                        "direct I/O (default: each the build's llama-perplexity has; --quick: mmap)")
    parser.add_argument("--parallel", type=argtypes.int_list(1, serving.PARALLEL_MAX), metavar="P,...",
                        help="sequences sharing one unified KV cache (-np with --kv-unified; default 1 and 4 "
                        "where the build's llama-perplexity has --kv-unified; --quick: 1)")
    parser.add_argument("--json", action="store_true", help="the result as JSON")
    add_backend_ops_arguments(parser)


def add_backend_ops_arguments(parser) -> None:
    """The backend-ops stage's flags (measure/backend_ops.py): llama.cpp's test-backend-ops."""
    parser.add_argument("--backend-ops", action=argparse.BooleanOptionalAction, default=None,
                        help="run llama.cpp's test-backend-ops (every op of the build's backend "
                        "against the CPU backend) as a stage; default: on when the build has it "
                        "(rocforge build ... --cmake-target test-backend-ops), off with --quick")
    parser.add_argument("--ops", metavar="OP,...", type=backend_ops.ops_argument,
                        help="the backend-ops stage on these ops only (e.g. MUL_MAT,FLASH_ATTN_EXT); "
                        "implies --backend-ops")
    parser.add_argument("--backend-ops-timeout", type=argtypes.positive_seconds, metavar="SECONDS",
                        help="stop test-backend-ops after SECONDS and report a hang "
                        "(default: 1800)")


def run(args) -> int:
    build = LlamaBuild.open(args.prefix)
    ctx = args.ctx or None
    env = {k: v[0] for k, v in bench.env_pairs(args.env).items()}
    ref_given = LlamaBuild.open(args.reference) if args.reference else None
    s = open_session(args.model, [build] + ([ref_given] if ref_given else []), ("llama-perplexity",), args.rootfs)
    coverage = verify.plan(s.model, gpu=build.gpu, ctx=ctx, max_ctx=args.max_ctx, quick=args.quick,
                           ubatch=args.ubatch or None, fa=None if args.fa is None else [args.fa == "on"],
                           kv=args.kv, load=args.load, parallel=args.parallel,
                           support=serving.ServingSupport.of(build))
    from rocforge_build.substitute import pull

    # a reference rocforge makes is asked of the substitute stores first, as any build is
    ref = verify.reference_for(build, args.reference, quiet=args.json, substitute=pull.attempt)
    if not args.reference and same_build(build, ref):
        return _is_the_reference(build, s, args)
    refuse_self_compare(build, ref)  # a build against itself: nothing compared, never PASSED
    run_id = s.store.start_run("verify", args.argv, {"host": s.base["host"], "model": s.base["model"]})
    say = None if args.json else (lambda text: sys.stderr.write(f"rocforge: verify: {text}\n"))
    stage = backend_ops_stage(build, args, env, say)
    try:
        result = verify.verify(build, ref, s.model, coverage, store=s.store, run_id=run_id, base=s.base,
                               text=args.text, env=env, progress=say)
    except BaseException:
        s.store.finish_run(run_id, "failed")
        raise
    result = with_backend_ops(build, result, stage, str(s.model.path), str(ref.prefix))
    s.store.finish_run(run_id, "passed" if result["passed"] else "failed")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(build, ref, result)
    return 0 if result["passed"] else 1


def _is_the_reference(build, s, args) -> int:
    """A CPU build of rocforge's default plan is the reference every other build is verified
    against: nothing is compared, so no PASSED; the verdict is recorded so that `env`, tune's gate
    and `serve` count it as proven."""
    from rocforge_build.discover import choices

    line = (f"{build.prefix} is rocforge's reference (a CPU build of the default plan): nothing to "
            "compare it with; other builds of this source are verified against it")
    run_id = s.store.start_run("verify", args.argv, {"host": s.base["host"], "model": s.base["model"]})
    result = {"passed": True, "reference": str(build.prefix), "is_reference": True, "checks": [],
              "note": line}
    s.store.add_row(run_id, "verify", {**s.base, "prefix": str(build.prefix), "backend": build.backend,
                                       "stamp": build.stamp, "reference_stamp": build.stamp,
                                       "build": build.provenance(), **result}, status="passed")
    s.store.finish_run(run_id, "passed")
    choices.record_verify(build.prefix, build.stamp, True, model=str(s.model.path), reference=str(build.prefix))
    print(json.dumps(result, indent=2) if args.json else line)
    return 0


def backend_ops_stage(build, args, env: dict, say):
    """The backend-ops stage's result, or None when it is not run (asked off, --quick, or the
    build lacks the program and it was not asked for)."""
    ops = args.ops or ()
    asked = getattr(args, "backend_ops", None)
    if asked is False and ops:
        raise backend_ops.BackendOpsError("--ops needs the backend-ops stage, which --no-backend-ops turns off")
    have = backend_ops.find_program(build.prefix) is not None
    if not (asked or ops) and (asked is False or args.quick or not have):
        return None
    timeout = args.backend_ops_timeout or backend_ops.DEFAULT_TIMEOUT
    return backend_ops.run(build.prefix, gpu=build.gpu, backend=build.backend, ops=ops,
                           timeout=timeout, env={**build.runtime_env, **env}, progress=say)


def with_backend_ops(build, result: dict, stage, model: str, reference: str) -> dict:
    """verify's result with the stage's: a failing stage fails verify (and its recorded verdict)."""
    if stage is None:
        return result
    result = {**result, "backend_ops": stage.to_json()}
    if stage.passed is False and result["passed"]:
        from rocforge_build.discover import choices

        result["passed"] = False
        choices.record_verify(build.prefix, build.stamp, False, model=model, reference=reference)
    return result


def report(build, ref, result: dict) -> None:
    print(f"{build.prefix} against {ref.prefix}: {'PASSED' if result['passed'] else 'FAILED'}")
    cov = result["coverage"]
    ctxs = sorted({s["ctx"] for s in cov["shapes"]})
    print(f"  covered: contexts {', '.join(map(str, ctxs))}; micro-batches "
          f"{', '.join(str(u) for u in sorted({s['ubatch'] for s in cov['shapes']}))}; flash attention "
          f"{' and '.join(sorted({'on' if s['fa'] else 'off' for s in cov['shapes']}, reverse=True))}"
          + ("; -ngl " + ", ".join(str(n) for n in sorted({s['ngl'] for s in cov['shapes']}, reverse=True))
             if any(s["ngl"] is not None for s in cov["shapes"]) else ""))
    if cov["bounds"]:
        print(f"  bounded by: {'; '.join(cov['bounds'])}")
    print(f"  {'ctx':>6} {'ub':>5} {'fa':>3} {'ngl':>4} {'mean KLD':>12} {'top-1':>8} {'PPL':>12} "
          f"{'PPL ref':>12}  verdict")
    for c in result["checks"]:
        ngl = "-" if c["ngl"] is None else str(c["ngl"])
        print(f"  {c['ctx']:>6} {c['ubatch']:>5} {'on' if c['fa'] else 'off':>3} {ngl:>4} "
              f"{_f(verify.kld_shown(c['kld_mean']), 6):>12} {_f(c['top1'] and c['top1'] * 100, 2):>7}% "
              f"{_f(c['ppl'], 4):>12} {_f(c['ppl_ref'], 4):>12}  {'pass' if c['passed'] else 'FAIL'}"
              f"{serving.serving_label(c)}")
        for why in c["failed"]:
            print(f"         {why}")
        for why in c.get("not_judged", []):
            print(f"         {why}")
    if "backend_ops" in result:
        from rocforge_build.measure.backend_ops import lines_of

        for line in lines_of(result["backend_ops"]):
            print(f"  {line}")


def _f(x, digits: int) -> str:
    return "nan" if x is None else f"{x:.{digits}f}"
