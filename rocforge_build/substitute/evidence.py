"""The evidence a build carries to a store: what a verification measured (every check's shape and
figures, the reference, the model's sha256, bench rows, the full host fingerprint, rocforge's
version), and the build's own perplexity at the quick shapes, which the machine that pulls it
measures again.  One document per verification; each is signed and attached to the build as an
OCI referrer, so a build gathers the verdicts of every machine that ran it."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import __version__
from rocforge_build.download import sha256_file

SCHEMA = "rocforge.evidence/1"
KINDS = ("verify", "reference", "verified-here", "failed-here", "unverified")


@dataclass(frozen=True)
class OwnFigure:
    """A build's own perplexity on rocforge's text at one shape: what a second machine measures
    again and compares (within verify's PPL-ratio limit) before it counts the build."""

    ctx: int
    chunks: int
    fa: bool
    ppl: float
    # how llama-perplexity held it (`own_serving`): its logical and micro-batch defaults read
    # from its --help, the KV cache type, the weights' loading and the sequences at once; None:
    # not recorded (a figure published before they were, or a tree whose --help names no default)
    batch: int | None = None
    ubatch: int | None = None
    kv: str | None = None
    load: str | None = None
    parallel: int | None = None

    def to_json(self) -> dict:
        serving = {k: getattr(self, k) for k in SERVING if getattr(self, k) is not None}
        return {"ctx": self.ctx, "chunks": self.chunks, "fa": self.fa, "ppl": self.ppl, **serving}


SERVING = ("batch", "ubatch", "kv", "load", "parallel")  # an own figure's serving dimensions


def help_default(help_text: str, option: str) -> int | None:
    """The default a llama.cpp program's --help gives a numeric option (`-b, --batch-size N ...
    (default: 2048)`), None where its line names none.  Linear in the text (a help line is
    short: a longer one is no option's), whatever the program printed."""
    for line in help_text[:1 << 20].splitlines():
        if len(line) > MAX_HELP_LINE or not line.lstrip().startswith("-"):
            continue
        if option in re.split(r"[\s,=]+", _option_column(line)):
            found = re.search(r"\(default: (\d{1,9})[,)]", line)  # a count, never 4,300 digits int() refuses
            return int(found.group(1)) if found else None
    return None


MAX_HELP_LINE = 1000


def _option_column(line: str) -> str:
    """A help line's options and their arguments: up to the first run of two or more spaces
    followed by a word that is not an option (`-b,    --batch-size N    logical ...`)."""
    text, at = line.strip(), 0
    while (gap := text.find("  ", at)) >= 0:
        word = gap
        while word < len(text) and text[word].isspace():
            word += 1
        if word >= len(text) or text[word] != "-":
            return text[:gap]
        at = word
    return text


def own_serving(help_text: str) -> dict:
    """How `own_ppl` holds the model, which passes only the context, the chunks and flash
    attention: the program's own batch defaults (read from its --help, as each tree prints
    them), llama.cpp's default KV cache type (f16), mapped weights and one sequence (one chunk)."""
    return {"batch": help_default(help_text, "--batch-size"), "ubatch": help_default(help_text, "--ubatch-size"),
            "kv": "f16", "load": "mmap", "parallel": OWN_CHUNKS}


# Contexts of text each own figure scores: one 512-token context per attention path keeps a
# pulled CPU build's check near 8 s on 2 cores (llama-perplexity of SmolLM2-135M: ~130 tokens/s),
# and a build that computes differently here (flash attention's output scaled by 1.25 gave a PPL
# ratio far past 1.01) still fails it; verify's own quick check runs 4 (data/verify.toml chunks).
OWN_CHUNKS = 1


def document(*, kind: str, key: str, host: dict, model: dict | None, passed: bool | None,
             verify_rows: list[dict] = (), bench_rows: list[dict] = (),
             own: list[OwnFigure] = (), text_sha256: str = "", note: str = "",
             reference: dict | None = None) -> dict:
    """`reference`: a GPU build's CPU reference by key and stamp (published beside it)."""
    assert kind in KINDS
    return {
        **({"reference": reference} if reference else {}),
        "schema": SCHEMA, "kind": kind, "key": key, "rocforge": __version__,
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "passed": passed, "host": host, "model": model or {},
        "text_sha256": text_sha256, "own_figures": [f.to_json() for f in own],
        "verify": [_verify_summary(r) for r in verify_rows],
        "bench": [_bench_summary(r) for r in bench_rows], "note": note,
    }


def _verify_summary(row: dict) -> dict:
    """A verify row without this machine's paths (prefixes say nothing elsewhere)."""
    keep = ("passed", "verdicts", "coverage", "failed_checks", "checks", "env", "reference_stamp",
            "model_sha256")
    return {k: row.get(k) for k in keep if k in row}


def _bench_summary(row: dict) -> dict:
    keep = ("args", "env", "pp", "tg", "ctx", "ubatch", "fa", "ngl", "tokens_per_s", "t_s",
            "model_sha256", "shape", "figures")
    return {k: row.get(k) for k in keep if k in row}


def own_figures(prefix: Path, model_path: str, *, progress=None) -> tuple[list[OwnFigure], dict, str]:
    """The build's perplexity at verify's quick shapes with this model: (figures, the model's
    provenance, the text's sha256)."""
    from rocforge_build.measure import gguf, provenance, verify
    from rocforge_build.measure.llama_tools import LlamaBuild

    build = LlamaBuild.open(prefix)
    build.program("llama-perplexity")
    model = gguf.check(model_path)
    coverage = verify.plan(model, gpu=build.gpu, quick=True)
    text = verify.text_file()
    serving = own_serving(build.help_text("llama-perplexity"))
    figures = []
    for ctx, fa in sorted({(s.ctx, s.fa) for s in coverage.shapes}):
        ppl = verify.own_ppl(build, model, ctx, fa, OWN_CHUNKS, progress)
        figures.append(OwnFigure(ctx, OWN_CHUNKS, fa, float(ppl), **serving))
    return figures, provenance.model(model), sha256_file(text)


def compare_own(here: list[OwnFigure], there: list, file_type) -> tuple[bool, list[str]] | None:
    """Whether this machine's figures match the store's at every shape both have, within
    verify's PPL-ratio limit, the lines saying each shape's ratio; None when they share none."""
    from rocforge_build.measure import verify

    if not isinstance(there, list):
        return None
    _, _, limits = verify.rules(file_type)
    ratio_limits = [t for t in limits if t.metric == "ppl_ratio"]
    lines, ok, compared = [], True, 0
    for f in here:
        match = next((t for t in there if isinstance(t, dict) and t.get("ctx") == f.ctx
                      and t.get("fa") == f.fa and t.get("chunks") == f.chunks), None)
        if match is None or isinstance(match.get("ppl"), bool) or not isinstance(match.get("ppl"), (int, float)):
            continue
        ref = float(match["ppl"])
        ratio = f.ppl / ref if ref and math.isfinite(ref) else float("nan")
        holds = math.isfinite(ratio) and all(t.holds(ratio) for t in ratio_limits)
        compared += 1
        ok = ok and holds
        lines.append(f"ctx {f.ctx} fa {'on' if f.fa else 'off'}: PPL {f.ppl:.4f} here, "
                     f"{ref:.4f} where it was published (ratio {ratio:.4f}"
                     f"{'' if holds else ', past the limit'})")
    return (ok, lines) if compared else None
