"""`rocforge verify`: is a build's output right?  Its llama-perplexity logits are compared with a
reference build of the same source (default: the `cpu` backend, built by rocforge when absent)
through llama.cpp's KL-divergence mode, at a short and a long context.  Pass/fail limits are data
(data/verify.toml) with their reasons."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import paths
from rocforge_build.errors import UsageError
from rocforge_build.measure.gguf import Model
from rocforge_build.measure.llama_tools import MEASURE_TARGETS, BuildNotUsable, LlamaBuild
from rocforge_build.resources import load_toml, package_data

TEXT = "verify-text.txt"
_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|-nan|-inf))"
# one chunk line of --kl-divergence: chunk, PPL ± u, ln(PPL/PPL_base) ± u, KLD ± u, dp RMS ± u %, same top ± u %
_CHUNK_RE = re.compile(rf"^\s*(\d+)\s+{_NUM}\s*±\s*{_NUM}\s+{_NUM}\s*±\s*{_NUM}\s+{_NUM}\s*±\s*{_NUM}"
                       rf"\s+{_NUM}\s*±\s*{_NUM}\s*%\s+{_NUM}\s*±\s*{_NUM}\s*%")


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


def rules() -> tuple[dict, dict, tuple[Threshold, ...]]:
    data = load_toml(package_data("verify.toml"), "verify limits")
    limits = tuple(Threshold(t["metric"], float(t.get("max", t.get("min"))), "max" in t, t["reason"],
                             t.get("judged_below_chance"), t.get("not_judged_reason", ""))
                   for t in data["threshold"])
    return data["contexts"], data["chunks"], limits


def text_file() -> Path:
    return package_data(TEXT)


@dataclass
class Check:
    ctx: int
    kld_mean: float
    top1: float
    ppl: float
    ppl_ref: float
    passed: bool = False
    failed: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        def clean(x):
            return None if x is None or math.isnan(x) or math.isinf(x) else round(x, 6)

        return {"ctx": self.ctx, "kld_mean": clean(self.kld_mean), "top1": clean(self.top1),
                "ppl": clean(self.ppl), "ppl_ref": clean(self.ppl_ref), "passed": self.passed,
                "failed": self.failed, "not_judged": self.not_judged}


def contexts(model: Model, requested: list[int] | None) -> list[tuple[str, int]]:
    defaults, _, _ = rules()
    wanted = [("custom", c) for c in requested] if requested else list(defaults.items())
    bound = model.n_ctx_train or max(c for _, c in wanted)
    out, seen = [], set()
    for name, c in wanted:
        c = min(int(c), bound)
        if c not in seen:
            seen.add(c)
            out.append((name, c))
    return out


def parse_kld(output: str) -> tuple[float, float, float, float]:
    """(kld_mean, top1, ppl, ppl_ref) from the last chunk line (cumulative figures)."""
    last = None
    for line in output.splitlines():
        m = _CHUNK_RE.match(line)
        if m:
            last = m
    if last is None:
        raise VerifyError("llama-perplexity --kl-divergence printed no result line")
    f = [float(x) for x in last.groups()[1:]]
    ppl, ln_ratio, kld, top = f[0], f[2], f[4], f[8] / 100.0
    try:
        ppl_ref = ppl / math.exp(ln_ratio)
    except OverflowError:
        ppl_ref = float("nan")
    return kld, top, ppl, ppl_ref


def _perplexity(build: LlamaBuild, args: list[str], env: dict | None = None) -> str:
    exe = build.program("llama-perplexity")
    argv = [str(exe), *args] + (["-ngl", "99"] if build.gpu else [])
    from rocforge_build.proc import merged_env

    try:
        out = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                             env=merged_env({**build.runtime_env, **(env or {})}), timeout=3600)
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{exe} ran over an hour and was stopped") from None
    text = out.stdout + out.stderr
    if out.returncode != 0:
        need = re.search(r"you need at least (\d+) tokens", text)
        if need:
            raise VerifyError(f"the verify text is too short for context {args[args.index('-c') + 1]}: "
                              f"llama-perplexity needs {need.group(1)} tokens",
                              "give a smaller --ctx (or a longer --text FILE)")
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        how = f"signal {-out.returncode}" if out.returncode < 0 else f"exit code {out.returncode}"
        raise VerifyError(f"{exe} failed ({how}): {last[0][:200]}")
    return text


def reference_for(build: LlamaBuild, reference: str | None, *, quiet: bool = False) -> LlamaBuild:
    """The reference build: the one given, else the `cpu` backend of the build's recipe and source
    (built now when it is not there or out of date)."""
    if reference:
        return LlamaBuild.open(reference)
    m = build.manifest
    if not m:
        raise BuildNotUsable(f"{build.prefix} has no rocforge manifest, so its source is unknown",
                             "give --reference PREFIX (a CPU build of the same llama.cpp source)")
    from rocforge_build.build import pipeline, recipes
    from rocforge_build.build.plan import Request
    from rocforge_build.rootfs import Root

    recipe = recipes.load(m["recipe"]["name"])
    src = m.get("source", {})
    location = src.get("location")
    ref = None
    if src.get("kind") == "git":
        ref = src.get("commit") or src.get("ref")
    if location == recipe.source.url or (src.get("kind") == "git" and location == recipe.source.git):
        location = None
    req = Request(recipe.name, m["target"], backend="cpu", source=location, ref=ref,
                  build_targets=MEASURE_TARGETS)
    out = pipeline.execute(req, Root("/"), quiet=quiet)
    return LlamaBuild.open(out.prefix)


def run_checks(build: LlamaBuild, ref: LlamaBuild, model: Model, ctxs: list[tuple[str, int]], *,
               text: Path | None = None, workdir: Path | None = None, fa: bool = True,
               env: dict | None = None, progress=None) -> list[Check]:
    """Each context: the reference writes its log-probabilities, the build is compared with them."""
    _, chunks, limits = rules()
    text = Path(text or text_file())
    if not text.is_file():
        raise UsageError(f"verify text {text} does not exist")
    build.program("llama-perplexity")
    ref.program("llama-perplexity")
    base_dir = workdir or paths.cache_dir() / "verify"
    base_dir.mkdir(parents=True, exist_ok=True)
    checks = []
    with tempfile.TemporaryDirectory(dir=base_dir) as tmp:
        for name, ctx in ctxs:
            n = int(chunks.get(name, min(chunks.values())))
            base = Path(tmp) / f"ref-{ctx}.kld"
            common = ["-m", str(model.path), "-c", str(ctx), "--chunks", str(n)]
            if progress:
                progress(f"reference {ref.label()} at context {ctx}")
            _perplexity(ref, [*common, "-f", str(text), "--kl-divergence-base", str(base),
                              *ref.fa_args("llama-perplexity", fa)])
            if progress:
                progress(f"{build.label()} at context {ctx}")
            out = _perplexity(build, [*common, "--kl-divergence-base", str(base), "--kl-divergence",
                                      *build.fa_args("llama-perplexity", fa)], env)
            base.unlink(missing_ok=True)
            kld, top, ppl, ppl_ref = parse_kld(out)
            checks.append(judge(Check(ctx, kld, top, ppl, ppl_ref), limits, model.n_vocab))
    return checks


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


def verify(build: LlamaBuild, ref: LlamaBuild, model: Model, ctxs: list[tuple[str, int]], *,
           store=None, run_id: int | None = None, base: dict | None = None, text: Path | None = None,
           fa: bool = True, env: dict | None = None, progress=None) -> dict:
    """Run the checks and record them (one verify row); the dict is `rocforge verify --json`."""
    checks = run_checks(build, ref, model, ctxs, text=text, fa=fa, env=env, progress=progress)
    result = {"passed": all(c.passed for c in checks), "reference": str(ref.prefix), "fa": fa, "env": env or {},
              "checks": [c.to_json() for c in checks]}
    if store is not None:
        row = {**(base or {}), "prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp,
               "reference_stamp": ref.stamp, "build": build.provenance(), **result}
        store.add_row(run_id, "verify", row, status="passed" if result["passed"] else "failed")
    from rocforge_build.discover import choices

    # the verdict `rocforge env` reads (it must not open the results store on shell start-up)
    choices.record_verify(build.prefix, build.stamp, result["passed"],
                          model=str(model.path), reference=str(ref.prefix))
    return result


def gate(build: LlamaBuild, model: Model, *, reference: str | None, store, run_id: int, base: dict,
         ctxs: list[tuple[str, int]], fa: bool = True, quiet: bool = False,
         progress=None) -> tuple[str, dict | None]:
    """'passed' / 'failed' for bench and tune, with flash attention on or off (a build can be right
    with one and wrong with the other).  A verify of the same build (stamp), model, reference and
    flash-attention setting already in the store is reused; the reference passes by definition."""
    ref = reference_for(build, reference, quiet=quiet)
    if ref.prefix == build.prefix:
        return "passed", {"passed": True, "reference": str(ref.prefix), "checks": [], "note": "the reference"}
    sha = base.get("model_sha256")
    wanted = [c for _, c in ctxs]
    for row in reversed(list(store.rows(prefix=str(build.prefix), kind="verify"))):
        d = row.data
        if (d.get("stamp") == build.stamp and d.get("model_sha256") == sha and build.stamp
                and d.get("reference_stamp") == ref.stamp and d.get("fa", True) == fa
                and [c["ctx"] for c in d.get("checks", [])] == wanted):
            return ("passed" if d.get("passed") else "failed"), {**d, "reused": row.id}
    result = verify(build, ref, model, ctxs, store=store, run_id=run_id, base=base, fa=fa, progress=progress)
    return ("passed" if result["passed"] else "failed"), result
