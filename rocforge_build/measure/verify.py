"""`rocforge verify`: is a build's output right?  Its llama-perplexity logits are compared with a
reference build of the same source (default: the `cpu` backend, verify_reference.py says which)
through llama.cpp's KL-divergence mode, at the shapes that run: contexts up to the model's
training context, the micro-batch sizes tune may choose, flash attention on and off, and for GPU
builds full and partial offload, as a covering design (data/verify.toml says why each).  Pass/fail
limits are data with their reasons."""

from __future__ import annotations

import dataclasses
import hashlib
import lzma
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import paths
from rocforge_build.errors import UsageError
from rocforge_build.measure import known_bad, serving
from rocforge_build.measure.gguf import Model
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.verify_reference import reference_for, same_build
from rocforge_build.progress import Heartbeat
from rocforge_build.resources import load_toml, package_data

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|-nan|-inf))"
# one chunk line of --kl-divergence: chunk, PPL ± u, ln(PPL/PPL_base) ± u, KLD ± u, dp RMS ± u %, same top ± u %
_CHUNK_RE = re.compile(rf"^\s*(\d+)\s+{_NUM}\s*±\s*{_NUM}\s+{_NUM}\s*±\s*{_NUM}\s+{_NUM}\s*±\s*{_NUM}"
                       rf"\s+{_NUM}\s*±\s*{_NUM}\s*%\s+{_NUM}\s*±\s*{_NUM}\s*%")
# what llama-perplexity prints of its own logits (the reference's run that writes the KL base)
_FINAL_RE = re.compile(rf"Final estimate: PPL = {_NUM}")
_TOO_SHORT_RE = re.compile(r"tokenizes to only (\d+) tokens")


class VerifyError(UsageError):
    """llama-perplexity could not produce the figures (too little text, program failed)."""


@dataclass(frozen=True)
class Threshold:
    metric: str
    limit: float
    upper: bool  # True: value must be <= limit
    reason: str
    # judged only when the reference's PPL is below this share of the vocabulary (None: always)
    below_chance: float | None = None
    not_judged_reason: str = ""

    def judged(self, ppl_ref: float, n_vocab: int | None) -> bool:
        if self.below_chance is None or not n_vocab or ppl_ref is None or math.isnan(ppl_ref):
            return True
        return ppl_ref < self.below_chance * n_vocab

    def holds(self, value: float) -> bool:
        if value is None or math.isnan(value):
            return False
        return value <= self.limit if self.upper else value >= self.limit


def _data() -> dict:
    return load_toml(package_data("verify.toml"), "verify limits")


UNQUANTIZED = ("F32", "F16", "BF16")


def rules(file_type: str | None = None) -> tuple[dict, dict, tuple[Threshold, ...]]:
    """(coverage, chunks, limits) from data/verify.toml; a quantized model's limits are its own
    (`[quantized]`: the CPU reference rounds activations where a GPU backend may not)."""
    data = _data()
    quantized = data.get("quantized", {}) if file_type and file_type not in UNQUANTIZED else {}
    quantized = quantized.get("types", {}).get(file_type, quantized)  # a measured type's own limits
    limits = []
    for t in data["threshold"]:
        limit, reason = float(t.get("max", t.get("min"))), t["reason"]
        if t["metric"] in quantized:
            limit, reason = float(quantized[t["metric"]]), f"{file_type} model: {quantized['reason']}"
        limits.append(Threshold(t["metric"], limit, "max" in t, reason, t.get("judged_below_chance"),
                                t.get("not_judged_reason", "")))
    return data["coverage"], data["chunks"], tuple(limits)


def chunks_for(ctx: int) -> int:
    table = _data()["chunks"]
    return int(table.get(str(ctx), table["default"]))


def cache_dir() -> Path:
    """verify's cache: the shipped text unpacked, and the reference's bases (refs/).  One function,
    so that the slow tests can share it between tests that are otherwise isolated."""
    return paths.cache_dir() / "verify"


def text_file() -> Path:
    """The shipped text, unpacked once into the cache (llama-perplexity reads a plain file); the
    unpacked copy is checked against the sha256 the data file states."""
    info = _data()["text"]
    out = cache_dir() / f"text-{info['sha256'][:16]}.txt"
    if out.is_file() and out.stat().st_size > 0:
        return out
    with open(package_data(info["file"]), "rb") as fh:
        raw = lzma.decompress(fh.read())
    if hashlib.sha256(raw).hexdigest() != info["sha256"]:
        raise VerifyError(f"the shipped verify text {info['file']} is damaged (sha256 differs)",
                          "reinstall rocforge")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tmp.write_bytes(raw)
    tmp.replace(out)
    return out


@dataclass(frozen=True, order=True)
class Shape:
    """One check's shape: the context, the micro-batch, flash attention and the layers offloaded
    (None: a CPU build, nothing to offload), and how a server holds it: the KV cache type, how the
    weights are loaded (serving.LOADS) and the sequences sharing one unified KV cache (1: rocforge asks for
    no more, as before; llama-perplexity may still batch chunks of a short context by itself)."""

    ctx: int
    ubatch: int
    fa: bool
    ngl: int | None = None
    kv: str = "f16"
    load: str = "mmap"
    parallel: int = 1

    def label(self) -> str:
        ngl = "" if self.ngl is None else f" ngl={self.ngl}"
        return f"ctx={self.ctx} ub={self.ubatch} fa={'on' if self.fa else 'off'}{ngl}{serving.serving_label(self.to_json())}"

    def to_json(self) -> dict:
        return {"ctx": self.ctx, "ubatch": self.ubatch, "fa": self.fa, "ngl": self.ngl,
                "kv": self.kv, "load": self.load, "parallel": self.parallel}

    @classmethod
    def from_json(cls, d: dict) -> Shape:
        """A stored shape; one stored before the serving dimensions existed has none of them and
        reads as llama.cpp's defaults (`serving.serving_known` tells the two apart)."""
        return cls(int(d["ctx"]), int(d["ubatch"]), bool(d["fa"]), d.get("ngl"), str(d.get("kv") or "f16"),
                   str(d.get("load") or "mmap"), int(d.get("parallel") or 1))


@dataclass
class Coverage:
    """The checks a verify runs, and what bounded them (said to the user)."""

    shapes: list[Shape]
    bounds: list[str] = field(default_factory=list)

    def contexts(self) -> list[int]:
        return sorted({s.ctx for s in self.shapes})

    def to_json(self) -> dict:
        return {"shapes": [s.to_json() for s in self.shapes], "bounds": self.bounds}


def covering(dims: list[list]) -> list[tuple]:
    """Rows in which every value of every dimension appears at least once, the first row taking
    each dimension's first value: max(len) rows instead of the product.  Row i takes value
    i mod len of each dimension, so the first values meet in row 0."""
    n = max(len(d) for d in dims)
    rows = []
    for i in range(n):
        row = tuple(d[i % len(d)] for d in dims)
        if row not in rows:
            rows.append(row)
    return rows


def search_ubatches() -> list[int]:
    """The smallest and the largest micro-batch tune searches."""
    from rocforge_build.measure import tune

    ub = [int(u) for u in tune.rules()["search"]["ubatch"]]
    return sorted({min(ub), max(ub)}, reverse=True)


def n_layers(model: Model) -> int | None:
    value = model.metadata.get(f"{model.arch}.block_count")
    return int(value) if isinstance(value, int) and value > 0 else None


def plan(model: Model, *, gpu: bool, ctx: list[int] | None = None, max_ctx: int | None = None,
         quick: bool = False, ubatch: list[int] | None = None, fa: list[bool] | None = None,
         kv: list[str] | None = None, load: list[str] | None = None, parallel: list[int] | None = None,
         support: serving.ServingSupport | None = None) -> Coverage:
    """The default coverage (or the one asked for): contexts from short up to the model's training
    context (capped), the micro-batches tune may choose, flash attention on and off, full and
    partial offload for GPU builds; the longest context meets the largest micro-batch and flash
    attention on in the first check.  The serving dimensions (KV cache f16 and q8_0, weights
    mapped, read and read with direct I/O, 1 and 4 sequences in one unified KV cache:
    data/verify.toml [coverage] kv/load/parallel) join where `support` (the build's llama-perplexity) runs them; without
    `support` (a caller that has not read the build's --help) and with --quick, only their first
    values (llama.cpp's defaults: as fast as before) unless they are asked for."""
    cov, _, _ = rules()
    bounds = []
    cap = int(cov["max_ctx"])
    if max_ctx:
        cap = min(cap, max_ctx)
        bounds.append(f"--max-ctx {max_ctx}")
    if model.n_ctx_train and model.n_ctx_train < cap:
        cap = model.n_ctx_train
        bounds.append(f"the model's training context ({model.n_ctx_train})")
    wanted = sorted(set(ctx), reverse=True) if ctx else sorted(
        {int(c) for c in cov["contexts"]}, reverse=True)
    ctxs = sorted({min(c, cap) for c in wanted}, reverse=True)
    if quick:
        ctxs = ctxs[-int(cov.get("quick_contexts", 1)):]
        bounds.append("--quick: the shortest context only")
    ubs = sorted(set(ubatch or search_ubatches()), reverse=True)
    fas = list(dict.fromkeys(fa if fa is not None else [True, False]))
    layers = n_layers(model)
    ngls: list[int | None] = [None]
    if gpu:
        ngls = [99] + ([max(1, layers // 2)] if layers and layers > 1 else [])
    shapes = [Shape(*row) for row in covering([ctxs, ubs, fas, ngls])]
    asked = {"kv": kv, "load": load, "parallel": parallel}
    values = {}
    for name in serving.SERVING_FIELDS:
        default = list(cov[name])
        values[name] = serving.values_for(name, asked[name], default, quick or support is None,
                                       support or serving.ALL_SERVING, bounds)
    if fas == [False] and any(k != "f16" for k in values["kv"]):
        raise UsageError("--kv q8_0 needs flash attention: llama.cpp quantizes the V cache only with it on",
                         "add --fa on, or leave --fa out")
    return Coverage(serving.with_serving(shapes, values), bounds)


def bound_by_text(coverage: Coverage, n_tokens: int) -> Coverage:
    """llama-perplexity needs two contexts of tokens: longer contexts than the text allows come down
    to the longest that fits (the covering design is kept: only the context values change)."""
    fit = n_tokens // 2
    if fit < 16:
        raise VerifyError(f"the verify text has only {n_tokens} tokens", "give a longer --text FILE")
    shapes, seen = [], set()
    for s in coverage.shapes:
        c = min(s.ctx, _floor_pow2(fit))
        new = dataclasses.replace(s, ctx=c)
        if new not in seen:
            seen.add(new)
            shapes.append(new)
    return Coverage(shapes, coverage.bounds + [f"the text's length ({n_tokens} tokens: contexts up to "
                                               f"{_floor_pow2(fit)})"])


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass
class Check:
    ctx: int
    kld_mean: float
    top1: float
    ppl: float
    ppl_ref: float
    ubatch: int | None = None
    fa: bool | None = None
    ngl: int | None = None
    passed: bool = False
    failed: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    kv: str = "f16"
    load: str = "mmap"
    parallel: int = 1
    batch: int | None = None  # the logical batch (-b) the check ran with; None: not recorded

    @property
    def shape(self) -> Shape:
        return Shape(self.ctx, self.ubatch or 0, bool(self.fa), self.ngl, self.kv, self.load, self.parallel)

    def to_json(self) -> dict:
        def clean(x):
            return None if x is None or math.isnan(x) or math.isinf(x) else round(x, 6)

        return {"ctx": self.ctx, "ubatch": self.ubatch, "fa": self.fa, "ngl": self.ngl,
                "kv": self.kv, "load": self.load, "parallel": self.parallel, "batch": self.batch,
                "kld_mean": clean(self.kld_mean), "top1": clean(self.top1),
                "ppl": clean(self.ppl), "ppl_ref": clean(self.ppl_ref), "passed": self.passed,
                "failed": self.failed, "not_judged": self.not_judged}


def kld_shown(x: float | None) -> float | None:
    """A mean KLD as a person reads it: the divergence is never negative (Gibbs' inequality), so a
    tiny negative left by llama-perplexity's floating-point sums is 0, not "-0.000000"; a clearly
    negative figure is kept so that a broken measurement stays visible."""
    return 0.0 if x is not None and -1e-6 < x <= 0.0 else x


def parse_kld(output: str) -> tuple[float, float, float]:
    """(kld_mean, top1, ppl) from the last chunk line (cumulative figures).  The line's
    ln(PPL/PPL_base) is not used: the base's log-probabilities are clamped at -16, so a PPL derived
    from it is not the reference's own (far from it for a sharp model)."""
    last = None
    for line in output.splitlines():
        m = _CHUNK_RE.match(line)
        if m:
            last = m
    if last is None:
        raise VerifyError("llama-perplexity --kl-divergence printed no result line")
    f = [float(x) for x in last.groups()[1:]]
    return f[4], f[8] / 100.0, f[0]


def parse_final_ppl(output: str) -> float:
    """The PPL a plain llama-perplexity run prints of its own logits."""
    found = _FINAL_RE.findall(output)
    if not found:
        raise VerifyError("llama-perplexity printed no final PPL estimate")
    return float(found[-1])


def _perplexity(build: LlamaBuild, args: list[str], env: dict | None = None,
                ngl: int | None = None) -> str:
    exe = build.program("llama-perplexity")
    argv = [str(exe), *args] + (["-ngl", str(99 if ngl is None else ngl)] if build.gpu else [])
    from rocforge_build import proc

    try:
        out = proc.run(argv, check=False, stderr=subprocess.PIPE, timeout=3600,
                       env={**build.runtime_env, **(env or {})})
    except proc.ToolTimedOut:
        raise VerifyError(f"{exe} ran over an hour and was stopped") from None
    text = out.stdout + out.stderr
    if out.returncode != 0:
        short = _TOO_SHORT_RE.search(text)
        if short:
            raise TextTooShort(int(short.group(1)))
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        how = f"signal {-out.returncode}" if out.returncode < 0 else f"exit code {out.returncode}"
        raise VerifyError(f"{exe} failed ({how}): {last[0][:200]}")
    return text


class TextTooShort(VerifyError):
    def __init__(self, n_tokens: int):
        super().__init__(f"the verify text tokenizes to only {n_tokens} tokens")
        self.n_tokens = n_tokens


REFS_KEPT = 6  # reference bases kept in the cache: one per context of the default coverage, twice


def _refs_dir() -> Path:
    d = cache_dir() / "refs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _ref_key(ref: LlamaBuild, model: Model, text: Path, ctx: int, fa: bool, chunks: int | None = None,
             kv: str = "f16") -> str:
    """What the reference's log-probabilities depend on: its binary, the model, the text, the
    context, the chunk count, flash attention and the KV cache type (the files' sizes and mtimes
    stand for their contents)."""
    exe = ref.program("llama-perplexity")
    parts = [str(ref.prefix), ref.stamp or "", ctx, chunks or chunks_for(ctx), fa] + ([kv] if kv != "f16" else [])
    for f in (exe, model.path, text):
        st = Path(f).stat()
        parts += [str(f), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


# llama-perplexity tokenizes the whole file before it reads the first chunk, which for a book
# takes minutes (docs/measurements/measuring.md).  The reference (whose base holds the tokens the
# build is then scored on) gets the text's start: 32 characters for each token a check needs,
# beyond any tokenizer's average.
CHARS_PER_TOKEN = 32


def read_chars(text: Path, want: int, block: int = 1 << 20) -> str:
    """The first `want` characters of `text` (UTF-8, undecodable bytes replaced), read a block at a
    time: the text is the user's, and a 1 GiB --text must not be held in memory for its start.  An
    incremental decoder joins a character split across two blocks."""
    import codecs

    from rocforge_build.rootfs import open_regular

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parts, have = [], 0
    with open_regular(text) as f:
        while have < want:
            data = f.read(block)
            piece = decoder.decode(data, final=not data)[:want - have]
            parts.append(piece)
            have += len(piece)
            if not data:
                break
    return "".join(parts)


def text_start(text: Path, ctx: int, chunks: int | None = None) -> Path:
    """The start of `text` that is enough for a check at `ctx` (llama-perplexity needs two contexts
    of tokens and scores `chunks_for(ctx)`, or `chunks`), cached beside the verify cache; the text
    itself when it is not longer."""
    from rocforge_build import userpath  # a FIFO would hang llama-perplexity, a loop is no text

    userpath.require(text, "--text", hint="give a text file (UTF-8)")
    want = max(2, (chunks or chunks_for(ctx)) + 1) * ctx * CHARS_PER_TOKEN
    st = text.stat()
    if st.st_size <= want:
        return text
    key = hashlib.sha256(repr((str(text), st.st_size, st.st_mtime_ns, want)).encode()).hexdigest()[:16]
    out = cache_dir() / f"text-start-{key}.txt"
    if not out.is_file():
        body = read_chars(text, want)
        cut = body.rfind("\n")  # end at a line, not inside a word
        out.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(out, body[:cut + 1] if cut > want // 2 else body)
    return out


def _reference(ref: LlamaBuild, model: Model, text: Path, ctx: int, fa: bool,
               progress=None, chunks: int | None = None, kv: str = "f16") -> tuple[Path, float]:
    """reference_base on the text's start; on the whole text where a tokenizer of longer tokens
    than CHARS_PER_TOKEN leaves the start too short (TextTooShort then counts the whole)."""
    more = {**({"chunks": chunks} if chunks else {}), **({"kv": kv} if kv != "f16" else {})}
    try:
        return reference_base(ref, model, text_start(text, ctx, chunks), ctx, fa, progress, **more)
    except TextTooShort:
        return reference_base(ref, model, text, ctx, fa, progress, **more)


def _ref_of(shape: Shape) -> tuple[int, bool, int, str]:
    """What a check's reference run is made of: context, flash attention, chunks and KV cache type."""
    return shape.ctx, shape.fa, chunks_of(shape), shape.kv


def chunks_of(shape: Shape) -> int:
    """Chunks a check at `shape` scores: the context's, and at least one per sequence, so that P
    sequences share a batch."""
    return max(chunks_for(shape.ctx), shape.parallel)


def own_ppl(build: LlamaBuild, model: Model, ctx: int, fa: bool, chunks: int, progress=None) -> float:
    """A build's own perplexity on the start of rocforge's text at `ctx` over `chunks` contexts,
    no log-probabilities written: what a substitute's evidence records, and what the machine that
    pulls it measures again the same way."""
    if progress:
        progress(f"{build.label()} at context {ctx}, flash attention {'on' if fa else 'off'}")
    text = text_start(text_file(), ctx)
    out = _perplexity(build, ["-m", str(model.path), "-c", str(ctx), "--chunks", str(chunks),
                              "-f", str(text), *build.fa_args("llama-perplexity", fa)])
    return parse_final_ppl(out)


def reference_base(ref: LlamaBuild, model: Model, text: Path, ctx: int, fa: bool,
                   progress=None, chunks: int | None = None, kv: str = "f16") -> tuple[Path, float]:
    """The reference's log-probabilities at `ctx` (llama-perplexity --kl-divergence-base) and the
    PPL it computed of its own, unclamped logits (what the build's PPL is compared with).  The
    reference runs with the check's flash-attention setting: like is compared with like (the CPU
    backend's own flash attention, F16 accumulation, differs from its plain attention by a mean
    KLD of 0.0064 at 8192 tokens of SmolLM2-135M Q4_1, more than the limit), and with the check's KV
    cache type for the same reason (a q8_0 cache rounds K and V: the build's q8_0 path is judged
    against the reference's, not against f16's precision).  Kept in the cache:
    every check at a shape, every candidate of a tune and every later verify against the same
    reference share one reference run."""
    import json

    d = _refs_dir()
    key = _ref_key(ref, model, text, ctx, fa, chunks, kv)
    base, meta = d / f"{key}.kld", d / f"{key}.json"
    try:
        ppl = float(json.loads(meta.read_text(encoding="utf-8"))["ppl"])
        if base.is_file():
            base.touch()
            return base, ppl
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if progress:
        progress(f"reference {ref.label()} at context {ctx}, flash attention {'on' if fa else 'off'}"
                 + (f", KV cache {kv}" if kv != "f16" else ""))
    part = d / f"{key}.kld.part"
    out = _perplexity(ref, ["-m", str(model.path), "-c", str(ctx), "--chunks", str(chunks or chunks_for(ctx)),
                            "-f", str(text), "--kl-divergence-base", str(part),
                            *(["-ctk", kv, "-ctv", kv] if kv != "f16" else []),
                            *ref.fa_args("llama-perplexity", fa)])
    ppl = parse_final_ppl(out)
    part.replace(base)
    meta.write_text(json.dumps({"ppl": ppl, "ctx": ctx, "fa": fa, "kv": kv, "reference": str(ref.prefix)}),
                    encoding="utf-8")
    _prune_refs(d)
    return base, ppl


def _prune_refs(d: Path) -> None:
    bases = sorted(d.glob("*.kld"), key=lambda f: f.stat().st_mtime, reverse=True)
    for old in bases[REFS_KEPT:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)


def run_checks(build: LlamaBuild, ref: LlamaBuild, model: Model, coverage: Coverage, *,
               text: Path | None = None, env: dict | None = None,
               progress=None, beat: Heartbeat | None = None) -> tuple[list[Check], Coverage]:
    """Each shape: the build against the reference's base at that context.  The references come
    first (longest context first), so a text too short for a context bounds the coverage before
    any build run.  `beat` counts the checks done of the coverage's ([n/N] of its line)."""
    beat = beat or Heartbeat("verify", enabled=False)
    _, _, limits = rules(model.file_type)
    text = Path(text) if text else text_file()
    if not text.is_file():
        raise UsageError(f"verify text {text} does not exist")
    build.program("llama-perplexity")
    ref.program("llama-perplexity")
    refs = {}
    beat.update(0, len(coverage.shapes))
    for ctx, fa, chunks, kv in sorted({_ref_of(s) for s in coverage.shapes}, reverse=True):
        try:
            refs[ctx, fa, chunks, kv] = _reference(ref, model, text, ctx, fa, progress,
                                                   None if chunks == chunks_for(ctx) else chunks, kv)
        except TextTooShort as short:
            coverage = bound_by_text(coverage, short.n_tokens)
            return run_checks(build, ref, model, coverage, text=text, env=env, progress=progress,
                              beat=beat)
    checks = []
    for shape in coverage.shapes:
        checks.append(check_shape(build, model, shape, refs[_ref_of(shape)], limits, env, progress))
        beat.update(len(checks))
    return checks, coverage


def _telling(progress, beat: Heartbeat):
    """The progress callback, also giving the heartbeat's line the work now running."""

    def tell(text: str) -> None:
        beat.update(detail=text)
        if progress:
            progress(text)

    return tell


def check_shape(build: LlamaBuild, model: Model, shape: Shape, ref: tuple[Path, float],
                limits: tuple[Threshold, ...], env: dict | None, progress=None) -> Check:
    base, ppl_ref = ref
    if progress:
        progress(f"{build.label()} at {shape.label()}")
    batch = max(shape.ubatch, 2048)
    args = ["-m", str(model.path), "-c", str(shape.ctx), "--chunks", str(chunks_of(shape)),
            "--kl-divergence-base", str(base), "--kl-divergence", "-ub", str(shape.ubatch),
            *serving_args(build, "llama-perplexity", shape, batch),
            *build.fa_args("llama-perplexity", shape.fa)]
    out = _perplexity(build, args, env, shape.ngl)
    kld, top, ppl = parse_kld(out)
    check = Check(shape.ctx, kld, top, ppl, ppl_ref, shape.ubatch, shape.fa, shape.ngl,
                  kv=shape.kv, load=shape.load, parallel=shape.parallel,
                  batch=logical_batch(shape, batch))
    return judge(check, limits, model.n_vocab)


def logical_batch(shape: Shape, batch: int) -> int:
    """The logical batch (-b) a check at `shape` runs with: P sequences of the context in one
    batch when it has P > 1 slots, else `batch`; what the check records beside its shape."""
    return shape.ctx * shape.parallel if shape.parallel > 1 else batch


def serving_args(build: LlamaBuild, program: str, shape: Shape, batch: int) -> list[str]:
    """llama-perplexity's arguments for a shape's serving dimensions and its logical batch: P
    sequences of the context in one batch and one unified KV cache (ServingSupport says why
    -b P*ctx with -kvu does that), the KV cache type of K and V, the weights' loading
    (`load_args`).  A value the program cannot run is one line, never a silent default."""
    out = ["-b", str(logical_batch(shape, batch))]
    if shape.parallel > 1:
        out.append("-kvu")
    if shape.kv != "f16":
        out += ["-ctk", shape.kv, "-ctv", shape.kv]
    load = serving.load_args(build, program, shape.load)
    if load is None:
        raise VerifyError(f"{build.prefix}/bin/{program} cannot load the weights as {shape.load!r}",
                          "check the build at a loading its --help lists (--load)")
    return out + load


def judge(c: Check, limits: tuple[Threshold, ...], n_vocab: int | None) -> Check:
    """Apply the limits to one check: which fail, and which do not apply to this reference."""
    values = {"kld_mean": c.kld_mean, "top1": c.top1,
              "ppl_ratio": c.ppl / c.ppl_ref if c.ppl_ref and not math.isnan(c.ppl_ref) else float("nan")}
    for t in limits:
        if not t.judged(c.ppl_ref, n_vocab):
            c.not_judged.append(f"{t.metric} {_fmt(values[t.metric])}: {t.not_judged_reason} (reference PPL "
                                f"{_fmt(c.ppl_ref)}, vocabulary {n_vocab})")
        elif not t.holds(values[t.metric]):
            c.failed.append(f"{t.metric} {_fmt(values[t.metric])} {'>' if t.upper else '<'} {t.limit}: {t.reason}")
    c.passed = not c.failed
    return c


def _fmt(x: float) -> str:
    return "nan" if x is None or math.isnan(x) else f"{x:.6g}"


def verify(build: LlamaBuild, ref: LlamaBuild, model: Model, coverage: Coverage, *,
           store=None, run_id: int | None = None, base: dict | None = None, text: Path | None = None,
           env: dict | None = None, progress=None, attribute: bool = False, record: bool = True) -> dict:
    """Run the checks and record them (one verify row); the dict is `rocforge verify --json`.
    With `attribute`, each failed shape is checked again with flash attention flipped, so that a
    build wrong on one attention path only is still usable on the other (`verdicts`).  `record`:
    the verdict `rocforge env` reads (a check of one shape alone is not a verify of the build)."""
    # not a terminal (a CI log): a line every interval while llama-perplexity runs, [n/N] checks
    with Heartbeat("verify", enabled=progress is not None) as beat:
        tell = _telling(progress, beat)
        checks, coverage = run_checks(build, ref, model, coverage, text=text, env=env, progress=tell,
                                      beat=beat)
        if attribute and any(not c.passed for c in checks):
            _attribute(build, ref, model, checks, text, env, tell, beat)
    failed = [c.to_json() for c in known_bad.name_failures(build.manifest, checks) if not c.passed]
    result = {"passed": not failed, "reference": str(ref.prefix), "env": env or {},
              "coverage": coverage.to_json(), "verdicts": verdicts(checks),
              "failed_checks": [{k: c[k] for k in ("ctx", "ubatch", "fa", "ngl", *serving.SERVING_FIELDS)} for c in failed],
              "checks": [c.to_json() for c in checks]}
    if store is not None:
        row = {**(base or {}), "prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp,
               "reference_stamp": ref.stamp, "build": build.provenance(), **result}
        store.add_row(run_id, "verify", row, status="passed" if result["passed"] else "failed")
    if not record:
        return result
    from rocforge_build.discover import choices

    # the verdict `rocforge env` reads (it must not open the results store on shell start-up)
    choices.record_verify(build.prefix, build.stamp, result["passed"],
                          model=str(model.path), reference=str(ref.prefix))
    return result


def _attribute(build: LlamaBuild, ref: LlamaBuild, model: Model, checks: list[Check],
               text: Path | None, env: dict | None, progress, beat: Heartbeat) -> None:
    """Each failed shape again with flash attention flipped (appended to `checks`)."""
    _, _, limits = rules(model.file_type)
    have = {c.shape for c in checks}
    flips = []
    for c in [c for c in checks if not c.passed]:
        flipped = dataclasses.replace(c.shape, fa=not c.fa)
        if flipped.kv != "f16" and not flipped.fa:  # a quantized V cache needs flash attention
            continue
        if flipped not in have:
            have.add(flipped)
            flips.append(flipped)
    beat.update(len(checks), len(checks) + len(flips))
    for flipped in flips:
        refb = _reference(ref, model, Path(text) if text else text_file(), flipped.ctx,
                          flipped.fa, progress,
                          None if chunks_of(flipped) == chunks_for(flipped.ctx) else chunks_of(flipped), flipped.kv)
        checks.append(check_shape(build, model, flipped, refb, limits, env, progress))
        beat.update(len(checks))


def verdicts(checks: list[Check]) -> dict[str, str]:
    """Per flash-attention setting: "passed" when no check with it failed and every failed check
    (with the other setting) passed with this one at the same shape; else "failed"."""
    out = {}
    for fa in (True, False):
        mine = [c for c in checks if bool(c.fa) == fa]
        others_failed = [c for c in checks if bool(c.fa) != fa and not c.passed]
        cleared = all(any(m.passed and dataclasses.replace(m.shape, fa=fa) == dataclasses.replace(o.shape, fa=fa)
                          for m in mine)
                      for o in others_failed)
        out["on" if fa else "off"] = "passed" if mine and all(m.passed for m in mine) and cleared else "failed"
    return out


def gate(build: LlamaBuild, model: Model, *, reference: str | None, store, run_id: int, base: dict,
         coverage: Coverage, fa: bool = True, quiet: bool = False,
         progress=None) -> tuple[str, dict | None]:
    """'passed' / 'failed' for bench and tune with flash attention on or off: one default verify
    per build (every shape of the coverage), its failures attributed to an attention path where
    they follow it.  A verify of the same build (stamp), model, reference and shapes already in the
    store is reused; the reference passes by definition."""
    ref = reference_for(build, reference, quiet=quiet)
    if same_build(build, ref):
        return "passed", {"passed": True, "reference": str(ref.prefix), "checks": [], "note": "the reference"}
    key = "on" if fa else "off"
    sha = base.get("model_sha256")
    wanted = coverage.to_json()["shapes"]
    for row in reversed(list(store.rows(prefix=str(build.prefix), kind="verify"))):
        d = row.data
        if (d.get("stamp") == build.stamp and d.get("model_sha256") == sha and build.stamp
                and d.get("reference_stamp") == ref.stamp and d.get("verdicts")
                and (d.get("coverage") or {}).get("requested") == wanted):
            return d["verdicts"].get(key, "failed"), {**d, "reused": row.id}
    result = verify(build, ref, model, coverage, store=None, progress=progress, attribute=True)
    result["coverage"]["requested"] = wanted
    row = {**base, "prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp,
           "reference_stamp": ref.stamp, "build": build.provenance(), **result}
    store.add_row(run_id, "verify", row, status="passed" if result["passed"] else "failed")
    return result["verdicts"][key], result


def command_line(prefix, model_path, shape: dict, env: dict | None = None) -> str:
    """The `rocforge verify` command whose first check is exactly `shape` with `env` (plan() puts
    the given context, micro-batch and flash attention in row 0 with full offload, -ngl 99, and
    one value of each serving dimension is that value in every row)."""
    from rocforge_build.proc import quote

    argv = ["rocforge", "verify", str(prefix), "--model", str(model_path), "--ctx", str(shape["ctx"]),
            "--ubatch", str(shape["ubatch"]), "--fa", "on" if shape["fa"] else "off",
            "--kv", str(shape.get("kv") or "f16"), "--load", str(shape.get("load") or "mmap"),
            "--parallel", str(shape.get("parallel") or 1)]
    for k, v in sorted((env or {}).items()):
        argv += ["--env", f"{k}={v}"]
    return quote(argv)


def verify_shape(build: LlamaBuild, model: Model, shape: Shape, *, reference: str | None,
                 env: dict | None = None, quiet: bool = False, progress=None) -> dict:
    """One check at exactly the shape a preset will run (tune's winner, before it is stored).  The
    reference itself (rocforge's default-plan CPU build) is right by definition: comparing it with
    itself would measure nothing, so its check says so and runs nothing."""
    ref = reference_for(build, reference, quiet=quiet)
    if same_build(build, ref):
        return {"passed": True, "reference": str(ref.prefix), "note": "the reference: nothing compared",
                "checks": [{**shape.to_json(), "kld_mean": None, "top1": None, "passed": True,
                            "failed": [], "note": "the reference: nothing compared"}]}
    return verify(build, ref, model, Coverage([shape], ["the preset's own shape"]), env=env,
                  progress=progress, record=False)
