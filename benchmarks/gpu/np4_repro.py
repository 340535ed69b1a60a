"""Where does `verify --ctx 8192 --ubatch 512 --fa off --parallel 4` fail on Vulkan: in llama.cpp's
Vulkan backend, or in verify's way of running four sequences?  llama-perplexity run directly, no
rocforge in between, over a matrix of the dimensions that could matter: backend (CPU, Vulkan),
context, sequences in one batch (`-b P*ctx`, P sequences), unified KV cache (`-kvu`) or one cache
per sequence, flash attention, micro-batch and offload.  Each cell prints llama-perplexity's own
final PPL of its own logits (no reference file involved) and, where a KL base is given, the KLD
against the CPU's one-sequence logits — the figures verify compares.

Usage (benchmarks/gpu/journey.sh runs it on the GPU machine):
    python3 np4_repro.py --cpu CPU_PREFIX --vulkan VK_PREFIX --model M.gguf --text TEXT \
        [--cells quick|full] [--kld] --json OUT.json
Each cell is one process; a row's `argv` is the exact command, for an upstream report."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
FINAL = re.compile(rf"Final estimate: PPL = {NUM}")
KLD = re.compile(rf"^Mean\s+KLD:\s+{NUM}", re.M)
TOP1 = re.compile(rf"^Same top p:\s+{NUM}", re.M)
NSEQ = re.compile(r"n_seq\s*=\s*(\d+)")
DEVICE = re.compile(r"ggml_vulkan: 0 = (.*)")


def say(text: str) -> None:
    print(f"[np4 {time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(prefix: str, args: list[str], timeout: float) -> dict:
    exe = str(Path(prefix) / "bin" / "llama-perplexity")
    argv = [exe, *args]
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors="replace")
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    row = {"argv": argv, "rc": rc, "seconds": round(time.monotonic() - t0, 2)}
    m = FINAL.findall(out)
    row["ppl"] = float(m[-1]) if m else None
    k = KLD.findall(out)
    row["kld_mean"] = float(k[-1]) if k else None
    t = TOP1.findall(out)
    row["top1_pct"] = float(t[-1]) if t else None
    n = NSEQ.findall(out)
    row["n_seq"] = int(n[-1]) if n else None
    d = DEVICE.findall(out)
    row["device"] = d[0].strip() if d else None
    if rc != 0:
        row["tail"] = out.strip().splitlines()[-6:]
    return row


def cells(kind: str) -> list[dict]:
    """The matrix: the failing cell (8192, P=4, -kvu, fa off, -ub 512) and one step away from it in
    each dimension, then (full) the context and sequence sweep."""
    fail = {"ctx": 8192, "seqs": 4, "kvu": True, "fa": "off", "ub": 512, "ngl": 99}
    out = [fail,
           {**fail, "seqs": 1, "kvu": False},
           {**fail, "fa": "on"},
           {**fail, "kvu": False},
           {**fail, "seqs": 2},
           {**fail, "ub": 2048},
           {**fail, "ub": 256},
           {**fail, "ngl": 0}]
    if kind == "sizes":  # where does it start: sequences against cells in the one unified cache
        return [{**fail, "seqs": 1, "kvu": False},
                {**fail, "seqs": 3}, {**fail, "seqs": 2, "ctx": 8192},
                {**fail, "seqs": 5, "ctx": 4096}, {**fail, "seqs": 6, "ctx": 4096},
                {**fail, "seqs": 8, "ctx": 2048}, {**fail, "seqs": 4, "ctx": 4096}, fail]
    if kind == "full":
        for ctx in (2048, 4096):
            for seqs in (1, 4):
                for fa in ("off", "on"):
                    out.append({**fail, "ctx": ctx, "seqs": seqs, "kvu": seqs > 1, "fa": fa})
        out.append({**fail, "seqs": 3})
    return out


def args_of(cell: dict, model: str, text: str, threads: int) -> list[str]:
    chunks = max(4, cell["seqs"])
    a = ["-m", model, "-f", text, "-c", str(cell["ctx"]), "--chunks", str(chunks),
         "-b", str(cell["ctx"] * cell["seqs"]), "-ub", str(cell["ub"]), "-fa", cell["fa"],
         "-t", str(threads)]
    if cell["kvu"]:
        a.append("-kvu")
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--vulkan", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default="model", help="what the model is (trained / random), for the rows")
    ap.add_argument("--text", required=True)
    ap.add_argument("--cells", default="quick", choices=("quick", "full", "sizes"))
    ap.add_argument("--cpu-cells", default="fail,seq1,fa", help="which of the first cells also run on the CPU")
    ap.add_argument("--kld", action="store_true", help="also KLD against the CPU's one-sequence logits at 8192")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for the whole matrix")
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    t_end = time.monotonic() + a.budget
    rows: list[dict] = []

    def record(backend: str, cell: dict, extra: list[str], mode: str) -> None:
        left = t_end - time.monotonic()
        if left < 20:
            say(f"skipped (budget): {backend} {cell}")
            rows.append({"backend": backend, **cell, "mode": mode, "model": a.label, "skipped": "budget"})
            return
        prefix = a.cpu if backend == "cpu" else a.vulkan
        args = args_of(cell, a.model, a.text, a.threads) + extra
        if backend == "vulkan":
            args += ["-ngl", str(cell["ngl"])]
        r = {"backend": backend, **cell, "mode": mode, "model": a.label, **run(prefix, args, min(left, 240))}
        rows.append(r)
        say(f"{backend:6} ctx={cell['ctx']} P={cell['seqs']} kvu={int(cell['kvu'])} fa={cell['fa']} "
            f"ub={cell['ub']} ngl={cell['ngl']} {mode}: PPL {r['ppl']} KLD {r['kld_mean']} top1 {r['top1_pct']} "
            f"n_seq {r['n_seq']} rc {r['rc']} {r['seconds']} s")
        a.json.write_text(json.dumps(rows, indent=1))

    matrix = cells(a.cells)
    names = {"fail": 0, "seq1": 1, "fa": 2, "split": 3, "seq2": 4}
    for name in a.cpu_cells.split(","):
        if name in names:
            record("cpu", {**matrix[names[name]], "ngl": 0}, [], "ppl")
    for cell in matrix:
        record("vulkan", cell, [], "ppl")
    if a.kld:  # the figures verify compares: KLD against the CPU's one-sequence logits
        base = Path("/tmp/np4-base-8192.kld")
        one = {**matrix[1], "ngl": 0}
        record("cpu", one, ["--kl-divergence-base", str(base)], "kld-base")
        if base.is_file():
            for cell in (matrix[0], matrix[1], matrix[2], matrix[3]):
                record("vulkan", cell, ["--kl-divergence-base", str(base), "--kl-divergence"], "kld")
            record("cpu", {**matrix[0], "ngl": 0}, ["--kl-divergence-base", str(base), "--kl-divergence"], "kld")
            base.unlink()
    say(f"done: {len(rows)} rows -> {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
