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
    from rocforge_build.workflows.verify import verify_build

    asked = _asked(args)
    say = None if args.json else (lambda text: sys.stderr.write(f"rocforge: verify: {text}\n"))
    done = verify_build(asked, say)
    if done.is_reference:
        print(json.dumps(done.result, indent=2) if args.json else done.result["note"])
        return 0
    if args.json:
        print(json.dumps(done.result, indent=2))
    else:
        report(done.build, done.reference, done.result)
    return 0 if done.passed else 1


def _asked(args):
    """The verify as one value: the build and the given reference opened, and --env read, in
    that order (the first that is wrong is the one line said)."""
    from rocforge_build.workflows.verify import VerifyAsked

    build = LlamaBuild.open(args.prefix)
    env = {k: v[0] for k, v in bench.env_pairs(args.env).items()}
    reference = LlamaBuild.open(args.reference) if args.reference else None
    stage = backend_ops.StageAsked(on=args.backend_ops, ops=args.ops or (),
                                   timeout=args.backend_ops_timeout)
    return VerifyAsked(build=build, model=args.model, reference=reference,
                       ctx=_tuple(args.ctx), max_ctx=args.max_ctx, ubatch=_tuple(args.ubatch),
                       quick=args.quick, fa=None if args.fa is None else args.fa == "on",
                       kv=_tuple(args.kv), load=_tuple(args.load), parallel=_tuple(args.parallel),
                       text=args.text, env=env, backend_ops=stage, rootfs=args.rootfs,
                       argv=tuple(args.argv), quiet=args.json)


def _tuple(values) -> tuple | None:
    return tuple(values) if values is not None else None


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
