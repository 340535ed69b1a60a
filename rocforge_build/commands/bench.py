"""`rocforge bench PREFIX... --model GGUF`: llama-bench over builds x variants (depth, ubatch,
flash attention, env), each build gated by `rocforge verify` first; every row goes to the results
store as soon as it exists."""

from __future__ import annotations

import argparse
import json

from rocforge_build import argtypes
from rocforge_build.errors import UsageError
from rocforge_build.measure import bench, bench_session
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.session import describe, open_session


def add_arguments(parser) -> None:
    parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="builds to measure (install prefixes)")
    parser.add_argument("--model", required=True, metavar="GGUF", help="the model file to run")
    parser.add_argument("--depth", default="0", type=argtypes.int_list(0), metavar="N,...", help="KV depths (llama-bench -d; default 0)")
    parser.add_argument("--ubatch", type=argtypes.int_list(1), metavar="N,...", help="micro-batch sizes (-ub; default: the tree's)")
    parser.add_argument("--fa", metavar="on,off", help="flash attention values (default: the tree's)")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=a,b",
                        help="runtime environment values to try (repeatable)")
    parser.add_argument("--reps", type=argtypes.reps, default=3, metavar="N", help="repetitions (-r; default 3)")
    parser.add_argument("-p", "--n-prompt", type=argtypes.tokens, default=512, metavar="N", help="prompt tokens (pp test)")
    parser.add_argument("-n", "--n-gen", type=argtypes.tokens, default=128, metavar="N", help="generated tokens (tg test)")
    parser.add_argument("--threads", type=argtypes.threads, metavar="N", help="CPU threads (-t)")
    parser.add_argument("--timeout", type=argtypes.positive_seconds, metavar="S",
                        help="stop a llama-bench run after S seconds; what it did not finish is recorded as failed")
    parser.add_argument("--no-gate", action="store_true", help="do not run `rocforge verify` first")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help="one discarded llama-bench run per build before its matrix (default: on for "
                             "GPU builds, whose first runs pay the driver's pipeline compiles)")
    parser.add_argument("--reference", metavar="PREFIX", help="the gate's reference build (see rocforge verify)")
    parser.add_argument("--ctx", type=argtypes.int_list(1), metavar="N,...", help="the gate's contexts (see rocforge verify)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")


def spec_from(args, model) -> bench.Spec:
    if not (args.n_prompt or args.n_gen):
        raise UsageError("-p/--n-prompt and -n/--n-gen are both 0: there is nothing to measure",
                         "give one of them a number of tokens above 0")
    depths = tuple(args.depth) or (0,)
    return bench.Spec(model, depths, args.n_prompt, args.n_gen, args.reps, args.threads, timeout=args.timeout,
                      warmup=args.warmup)


def run(args) -> int:
    builds = [LlamaBuild.open(p) for p in args.prefixes]
    vs = bench.variants(args.ubatch or [], bench.fa_list(args.fa), bench.env_pairs(args.env))
    programs = ("llama-bench",) if args.no_gate else ("llama-bench", "llama-perplexity")
    s = open_session(args.model, builds, programs, args.rootfs)
    spec = spec_from(args, s.model)
    gate = None if args.no_gate else bench_session.Gate(reference=args.reference, ctx=args.ctx or None)
    run_id, out = bench_session.recorded(s, builds, spec, vs, gate=gate, argv=args.argv, quiet=args.json)
    if args.json:
        print(json.dumps(out.rows, indent=2, default=str))
    else:
        for note in out.notes:
            print(f"note: {note}")
        for r in out.rows:
            print(f"{r['prefix']}  {bench.Variant(r.get('ubatch'), r.get('fa'), tuple(r.get('env', {}).items())).label()}"
                  f"  gate={r['gate']}  {describe(r)}")
        print(f"run {run_id}: {len(out.rows)} rows in {s.store.path}")
    return 1 if out.failed else 0
