"""The serving dimensions of a check: how `llama-server` holds what it serves beyond a context, a
micro-batch, flash attention and offload — the KV cache type, how the weights are loaded, and
several sequences in one unified KV cache — which of them a build's program can run (read from its
own --help), and the arguments that run them.  Verify's coverage places them (measure/verify.py),
tune searches the KV type, a preset serves exactly the verified ones (measure/preset.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rocforge_build.errors import UsageError
from rocforge_build.measure.llama_tools import LlamaBuild

KV_TYPES = ("f16", "q8_0")  # the KV cache types verify and tune know: llama.cpp's default, and half its size
# How the weights are loaded: mapped (llama.cpp's default), read into memory (`--no-mmap`; `-lm none`
# in trees with --load-mode), or read with direct I/O (`-dio`/`--direct-io`; `-lm dio`)
LOADS = ("mmap", "read", "dio")
SERVING_FIELDS = ("kv", "load", "parallel")


def serving_known(d: dict) -> bool:
    """Whether a stored shape (a check, a preset's verified shape) names its serving dimensions:
    one stored before they existed proves nothing about them."""
    return isinstance(d, dict) and all(d.get(k) is not None for k in SERVING_FIELDS)


def serving_label(d: dict) -> str:
    """A shape's serving dimensions beyond llama.cpp's defaults, as words (empty for the defaults)."""
    words = [f"kv={d['kv']}" if d.get("kv", "f16") != "f16" else "",
             f"load={d['load']}" if d.get("load", "mmap") != "mmap" else "",
             f"np={d['parallel']}" if (d.get("parallel") or 1) != 1 else ""]
    return "".join(f" {w}" for w in words if w)


def load_args(build: LlamaBuild, program: str, load: str) -> list[str] | None:
    """How `program` of this build loads the weights as `load` says, spelled as its own --help
    spells it (None: it cannot).  May 2025 (0.3.9): --no-mmap, no direct I/O; later trees added
    -dio/--direct-io; the Oct 2026 tree (0.3.36) has neither flag but `-lm/--load-mode` with
    mmap|none|dio (common/arg.cpp)."""
    opts = build.options(program)
    mode = "-lm" if "-lm" in opts else "--load-mode" if "--load-mode" in opts else None
    if load == "mmap":
        return []
    if load == "read":
        return ["--no-mmap"] if "--no-mmap" in opts else [mode, "none"] if mode else None
    if load == "dio":  # with --no-mmap where the tree has it: read, not mapped, where O_DIRECT is not available
        direct = next((o for o in ("-dio", "--direct-io") if o in opts), None)
        if direct:
            return (["--no-mmap"] if "--no-mmap" in opts else []) + [direct]
        return [mode, "dio"] if mode and "- dio:" in build.help_text(program) else None
    return None


@dataclass(frozen=True)
class ServingSupport:
    """Which serving dimensions a build's program can run, read from its own --help (never from a
    version number).

    Several sequences in one unified KV cache: llama-perplexity evaluates n_seq = n_batch / n_ctx
    chunks per batch, each its own sequence.  In the May 2025 tree (llama-cpp-python 0.3.9,
    tools/perplexity/perplexity.cpp main()) the KL-divergence mode forces n_parallel = 1 and
    kl_divergence() decodes one chunk at a time (and the one KV cache of that era holds every
    sequence: there is no --kv-unified): verify cannot run several sequences there.  In the tree
    that lists `-kvu/--kv-unified` for llama-perplexity (0.3.36, Oct 2026: common/arg.cpp sets it
    for LLAMA_EXAMPLE_PERPLEXITY) main() sets n_parallel = n_batch / n_ctx for KL divergence too and
    kl_divergence() puts n_seq = n_batch / n_ctx chunks (capped at llama_n_seq_max) in each batch:
    `-c C -b P*C -kvu` over at least P chunks runs P sequences in one unified KV cache, each
    micro-batch mixing tokens of several sequences: the path of `llama-server -np P --kv-unified`
    (llama.cpp #25992).  Measured on that tree's CPU build (2026-11-27): `-c 256 -b 1024 -kvu
    --kl-divergence` over 4 chunks logs "kl_divergence: computing over 4 chunks, n_ctx=256,
    batch_size=1024, n_seq=4" with mean KLD 0.000000 against the one-sequence base; `-lm none`
    and `-lm dio` run; -ctk/-ctv q8_0 without flash attention fails to create the context."""

    kv: bool = False
    loads: tuple[str, ...] = ("mmap",)
    parallel: bool = False
    program: str = "llama-perplexity"

    @classmethod
    def of(cls, build: LlamaBuild, program: str = "llama-perplexity") -> ServingSupport:
        opts = build.options(program)
        return cls(kv=bool({"-ctk", "--cache-type-k"} & opts) and bool({"-ctv", "--cache-type-v"} & opts),
                   loads=tuple(x for x in LOADS if load_args(build, program, x) is not None),
                   parallel=bool({"-kvu", "--kv-unified"} & opts), program=program)

    def runs(self, name: str, value) -> bool:
        """Whether the program can run `value` of serving dimension `name` (its default always)."""
        if name == "kv":
            return value == "f16" or self.kv
        if name == "load":
            return value in self.loads
        return value == 1 or self.parallel

    def why_not(self, name: str) -> str:
        return {"kv": f"the build's {self.program} has no -ctk/-ctv",
                "load": f"the build's {self.program} loads the weights only as {', '.join(self.loads)}",
                "parallel": f"the build's {self.program} has no --kv-unified"
                            + (" (its KL-divergence mode runs one sequence at a time)"
                               if self.program == "llama-perplexity" else "")}[name]


ALL_SERVING = ServingSupport(True, LOADS, True)


def kv_list(text: str) -> list[str]:
    """`--kv f16,q8_0`: KV cache types verify knows (argparse's one line for anything else)."""
    from argparse import ArgumentTypeError

    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in KV_TYPES]
    if bad or not items:
        raise ArgumentTypeError(f"{text!r}: KV cache types are {', '.join(KV_TYPES)}")
    return list(dict.fromkeys(items))


def load_list(text: str) -> list[str]:
    """`--load mmap,read,dio`: how the weights are loaded (LOADS)."""
    from argparse import ArgumentTypeError

    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not items or any(x not in LOADS for x in items):
        raise ArgumentTypeError(f"{text!r}: weight loading is one or more of {', '.join(LOADS)} "
                                "(mmap: mapped, llama.cpp's default; read: --no-mmap; dio: direct I/O)")
    return list(dict.fromkeys(items))


PARALLEL_MAX = 64  # sequences in one batch: far above a server's usual -np, and P x context tokens are decoded at once


def with_serving(rows: list, values: dict[str, list]) -> list:
    """The covering design's rows (verify.Shape values) with every serving dimension's first value in
    every row (also when it is not llama.cpp's default: `--parallel 4` alone checks 4 sequences
    everywhere), and its values beyond the first placed from the last row backwards (the shortest
    context: the cheapest check, and P sequences of it one batch), never in the first row (the
    shape asked for first stays whole: `command_line`), a quantized KV cache only where flash
    attention is on (llama.cpp quantizes V only with flash attention: a row without it gets it);
    where no row is left, a copy of the last row takes the value."""

    def fits(row, name: str, value) -> bool:
        return name != "kv" or value == "f16" or row.fa

    def given(row, name: str, value):
        return dataclasses.replace(row, **{name: value}, **({} if fits(row, name, value) else {"fa": True}))

    for name in SERVING_FIELDS:
        first, extra = values[name][0], list(values[name][1:])
        rows = list(dict.fromkeys(given(r, name, first) for r in rows))
        for i in range(len(rows) - 1, 0, -1):
            if extra and getattr(rows[i], name) == first and fits(rows[i], name, extra[0]):
                rows[i] = dataclasses.replace(rows[i], **{name: extra.pop(0)})
        for value in extra:
            base = next((r for r in reversed(rows) if fits(r, name, value)), rows[-1])
            rows.append(given(base, name, value))
    return list(dict.fromkeys(rows))


def values_for(name: str, asked: list | None, default: list, quick: bool, support: ServingSupport,
                    bounds: list[str]) -> list:
    """One serving dimension's values: those asked for (each one the build can run, else one
    line), else the default ones the build runs (only the first with --quick, as fast as before;
    the ones left out are said among the bounds)."""
    if asked:
        cannot = [v for v in asked if not support.runs(name, v)]
        if cannot:
            raise UsageError(f"--{name} {','.join(map(str, cannot))}: {support.why_not(name)}",
                             f"leave --{name} out: the build is checked at what it can run")
        return list(dict.fromkeys(asked))
    if quick:
        return default[:1]
    runs = [v for v in dict.fromkeys(default) if support.runs(name, v)]
    if len(runs) < len(set(default)):
        bounds.append(f"{name} {', '.join(str(v) for v in default if v not in runs)} not checked: "
                      f"{support.why_not(name)}")
    return runs
