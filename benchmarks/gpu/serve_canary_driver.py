"""What benchmarks/gpu/vulkan_serve_canary.sh measures once the builds are there: a GPU build served by
`rocforge serve` (a preset stored here after `rocforge verify` passed at its shape: -np 4 in one
unified KV cache), the numerics canary at serve start timed (its reference and its check apart), the
official `openai` client against `rocforge serve --canary-every 10s`, and throughput with N client
threads straight to llama-server, through the front without a canary, and with the canary every 60 s
and 10 s (rounds rotated, medians, ratios); one JSON summary.

Run by the script (PARTS: any of start, openai, front); also runnable on a CPU build alone for its
logic: --vulkan and --cpu may name the same prefix.  `--load URL` is the load generator, a
separate process so that the client threads never share an interpreter with what they measure."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

SLOTS = 4  # -np by default, in one unified KV cache (-kvu), as preset.command serves parallel slots


def say(text: str) -> None:
    print(f"[driver {time.strftime('%H:%M:%S')}] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- the preset

def make_preset(args, summary: dict) -> None:
    """What tune does before it stores a preset, for the GPU build at one shape (-np SLOTS in one
    unified KV cache, `args.ctx` tokens a slot, flash attention off, f16 KV, mmap): `rocforge verify`
    at exactly that shape against the CPU build, then the preset stored with that verified shape
    (tests/e2e/test_verify_shapes.py stores one the same way), so `rocforge serve MODEL` runs it."""
    from rocforge_build.measure import gguf, preset, provenance
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.store import Store

    model = gguf.check(args.model)
    build = LlamaBuild.open(args.vulkan)
    variant = {"fa": False, "parallel": args.slots}
    shape = preset.serving_shape(build, variant, args.ctx, False)
    env, argv, notes = preset.command(build, str(model.path), variant, args.ctx, False)
    argv += args.server_arg  # e.g. --cache-ram 0: what the 2026-11-27 run could not try (docs/measurements/serve-canary.md)
    sha = provenance.model_sha256(model.path)
    with Store() as s:
        stored = s.preset(sha)
    r = (stored or {}).get("ranges", {}).get("long") or {}
    if r.get("argv") == argv and r.get("stamp") == build.stamp and (r.get("verified") or {}).get("shape"):
        summary["preset_argv"] = argv
        say("preset: stored by an earlier run, verified at its shape: " + " ".join(argv))
        return
    cmd = [sys.executable, "-m", "rocforge_build", "verify", args.vulkan, "--model", args.model, "--reference",
           args.cpu, "--ctx", str(shape.ctx), "--ubatch", str(shape.ubatch), "--fa", "on" if shape.fa else "off",
           "--kv", shape.kv, "--load", shape.load, "--parallel", str(shape.parallel), "--json"]
    say("verify: " + " ".join(cmd[3:]))
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    seconds = time.monotonic() - t0
    try:
        result = json.loads(r.stdout)
    except ValueError:
        result = {"passed": False, "stderr": r.stderr.strip()[-600:]}
    checks = [{k: c.get(k) for k in ("ctx", "ubatch", "fa", "ngl", "kv", "load", "parallel", "kld_mean", "top1",
                                      "ppl", "ppl_ref", "passed")} for c in result.get("checks") or []]
    summary["verify"] = {"rc": r.returncode, "seconds": round(seconds, 2), "passed": result.get("passed"),
                         "checks": checks, "argv": cmd[3:]}
    say(f"verify rc={r.returncode} in {seconds:.1f} s: passed {result.get('passed')} {checks} "
        f"{result.get('stderr', '')}")
    entry = {"prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp, "depth": 0,
             "ctx": args.ctx, "variant": variant, "variant_label": f"fa=0 np={args.slots}", "score": 1.0,
             "figures": [], "runner_up": None, "env": env, "argv": argv, "notes": notes}
    want = shape.to_json()
    covered = result.get("passed") is True and any(
        c.get("passed") is True and all(c.get(k) == v for k, v in want.items()) for c in result.get("checks") or [])
    summary["verify"]["covers_preset_shape"] = covered
    if covered:  # only a passed check at exactly the served shape proves it (tune stores no less)
        entry["verified"] = {"shape": want}
    else:
        say(f"verify has no passed check at exactly {want}: the preset is stored unproven (serve refuses it)")
    with Store() as s:
        s.add_preset(model.name, sha, None, {"model": {"name": model.name, "sha256": sha, "path": str(model.path)},
                                             "created": "serve_canary_driver", "ranges": {"long": entry}})
    summary["preset_argv"] = argv
    say("preset: " + " ".join(argv))


def use_stored_preset(args, summary: dict) -> None:
    """The preset `rocforge tune` stored for the model, served as it is (the journey: tune's winner,
    not one made here); `--server-arg` words are added to every range's command as a new version
    (its verified shape unchanged: they change the server's host-side caching, not its numerics)."""
    from rocforge_build.measure import gguf, provenance
    from rocforge_build.measure.store import Store

    model = gguf.check(args.model)
    sha = provenance.model_sha256(model.path)
    with Store() as s:
        stored = s.preset(sha)
    if not stored:
        raise RuntimeError("no stored preset for the model: run rocforge tune first")
    summary["preset_stored"] = {name: {k: r.get(k) for k in ("prefix", "backend", "variant_label", "argv", "verified")}
                                for name, r in stored.get("ranges", {}).items()}
    if args.server_arg:
        ranges = {name: {**r, "argv": list(r["argv"]) + args.server_arg} for name, r in stored["ranges"].items()}
        with Store() as s:
            s.add_preset(model.name, sha, None, {"model": stored["model"], "created": "serve_canary_driver",
                                                 "ranges": ranges})
    say(f"preset (tune's): {summary['preset_stored']}")


class Served:
    """`rocforge serve MODEL --port P ...` in its own session: `ready_s` is the time from the start
    until it printed its URL (after load, warm-up and, unless --no-canary, the canary); its stderr
    (serve's lines and llama-server's output) goes to `log`.  Stopped with SIGINT, as Ctrl-C does."""

    def __init__(self, model: str, log: Path, extra: list[str], wait: float = 400.0):
        self.port = free_port()
        self.log = log
        self.argv = [sys.executable, "-m", "rocforge_build", "serve", model, "--port", str(self.port), *extra]
        self.wait = wait
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_s: float | None = None
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Served:
        say("start: " + " ".join(self.argv[1:]))
        err = open(self.log, "w")
        start = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        err.close()
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.wait)
        if not line or self.url not in line[0]:
            self.stop()
            raise RuntimeError(f"rocforge serve did not print its URL (rc {self.proc.returncode}): "
                               f"{self.tail(3)}")
        self.ready_s = time.monotonic() - start
        say(f"ready in {self.ready_s:.2f} s: {line[0].strip()}")
        return self

    def tail(self, n: int) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-n:])
        return ""

    def lines(self, pattern: str) -> list[str]:
        with contextlib.suppress(OSError):
            return [ln for ln in self.log.read_text(errors="replace").splitlines() if re.search(pattern, ln)]
        return []

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()


def canary_seconds(served: Served) -> float | None:
    for ln in served.lines(r"canary passed in"):
        m = re.search(r"canary passed in ([0-9.]+) s", ln)
        if m:
            return float(m.group(1))
    return None


def device_line(served: Served) -> str | None:
    found = served.lines(r"ggml_vulkan: 0 =|Vulkan0")
    return found[0].strip()[:300] if found else None


# ------------------------------------------------------------------------------------- the parts

def part_start(args, summary: dict) -> None:
    """Serve start with and without the canary; the canary's reference and check timed apart."""
    from rocforge_build.measure import gguf, verify
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.serve import canary

    model = gguf.check(args.model)
    refdir = verify.cache_dir() / "canary"
    shutil.rmtree(refdir, ignore_errors=True)
    out: dict = {}
    with Served(args.model, args.logs / "serve-nocanary-1.log", ["--no-canary"]) as s:
        out["ready_s_no_canary_first"] = s.ready_s
        summary["device"] = device_line(s)
        target = canary.target_of(s.url, s.argv)
        plan = canary.plan(model, target)
        out["target"] = {"parallel": target.parallel, "ctx_per_slot": target.ctx_per_slot}
        out["plan"] = {"requests": len(plan.texts) + bool(plan.long_tokens), "long_tokens": plan.long_tokens,
                       "n_predict": plan.n_predict, "n_probs": plan.n_probs, "notes": list(plan.notes)}
        t0 = time.monotonic()
        ref = canary.reference(plan, LlamaBuild.open(args.cpu), model, timeout=300)
        out["reference_s"] = time.monotonic() - t0
        say(f"reference (CPU build's llama-server, -np 1): {out['reference_s']:.2f} s")
        for label in ("check_first_s", "check_again_s"):
            v = canary.check(plan, target, ref, timeout=300)
            out[label] = v.seconds
            out[label.replace("_s", "_verdict")] = v.to_json()
            say(f"{label}: {v.seconds:.2f} s, passed {v.passed} {list(v.failures)}")
        t0 = time.monotonic()
        short = canary.plan(model, target, short=True)
        short_ref = canary.reference(short, LlamaBuild.open(args.cpu), model, timeout=120)
        out["short_reference_s"] = time.monotonic() - t0
        vs = [canary.check(short, target, short_ref, timeout=60) for _ in range(5)]
        out["short_check_s"] = [round(v.seconds, 4) for v in vs]
        out["short_check_passed"] = all(v.passed for v in vs)
        say(f"short canary (what --canary-every repeats): {out['short_check_s']} s")
    # the reference is cached now (same plan: same slots and context): serve pays the check only
    with Served(args.model, args.logs / "serve-canary-cached.log", ["--reference", args.cpu]) as s:
        out["ready_s_canary_reference_cached"] = s.ready_s
        out["serve_canary_s_reference_cached"] = canary_seconds(s)
    shutil.rmtree(refdir, ignore_errors=True)
    with Served(args.model, args.logs / "serve-canary-cold.log", ["--reference", args.cpu]) as s:
        out["ready_s_canary_reference_cold"] = s.ready_s
        out["serve_canary_s_reference_cold"] = canary_seconds(s)
        out["serve_canary_lines"] = [ln.strip()[:400] for ln in s.lines(r"rocforge: serve: canary")]
    with Served(args.model, args.logs / "serve-nocanary-2.log", ["--no-canary"]) as s:
        out["ready_s_no_canary_last"] = s.ready_s
    summary["start"] = out


def ask_openai(base: str) -> dict:
    """The official client's chat and text completions (and a streamed chat) against `base`/v1."""
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed", timeout=120, max_retries=0)
    out: dict = {"openai_version": openai.__version__}
    t0 = time.monotonic()
    chat = client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=24,
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
    out["chat"] = {"content": chat.choices[0].message.content, "finish_reason": chat.choices[0].finish_reason,
                   "usage": chat.usage.model_dump() if chat.usage else None, "s": time.monotonic() - t0}
    t0 = time.monotonic()
    text = client.completions.create(model="smollm2", prompt="The three primary colours are", max_tokens=16,
                                     temperature=0)
    out["completion"] = {"text": text.choices[0].text, "finish_reason": text.choices[0].finish_reason,
                         "usage": text.usage.model_dump() if text.usage else None, "s": time.monotonic() - t0}
    t0 = time.monotonic()
    parts = []
    for chunk in client.chat.completions.create(model="smollm2", temperature=0, max_tokens=16, stream=True,
                                                messages=[{"role": "user", "content": "Say hello."}]):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    out["chat_stream"] = {"chunks": len(parts), "content": "".join(parts), "s": time.monotonic() - t0}
    try:
        lp = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=4, logprobs=True,
                                            top_logprobs=3, messages=[{"role": "user", "content": "Count: one, two,"}])
        content = lp.choices[0].logprobs.content if lp.choices[0].logprobs else None
        out["chat_logprobs"] = [{"token": c.token, "logprob": round(c.logprob, 4),
                                 "top": [t.token for t in c.top_logprobs]} for c in (content or [])]
    except openai.OpenAIError as exc:
        out["chat_logprobs"] = f"{type(exc).__name__}: {exc}"[:300]
    with contextlib.suppress(openai.OpenAIError):
        out["models"] = [m.id for m in client.models.list().data]
    say(f"openai: chat {out['chat']['content']!r}; completion {out['completion']['text']!r}; "
        f"stream {out['chat_stream']['chunks']} chunks")
    return out


def part_openai(args, summary: dict) -> None:
    """`rocforge serve --canary-every 10s` (the canary at start, then the front): the `openai` client
    through the front, a pause long enough for a canary between requests, the client again."""
    extra = ["--reference", args.cpu, "--canary-every", "10s"]
    with Served(args.model, args.logs / "serve-openai.log", extra) as s:
        out = {"argv": s.argv[3:], "ready_s": s.ready_s, "serve_canary_s": canary_seconds(s),
               "first": ask_openai(s.url)}
        time.sleep(12)  # idle: the front's short canary is due after 10 s
        out["again"] = ask_openai(s.url)
        out["while_serving_lines"] = [ln.strip()[:300] for ln in s.lines(r"rocforge: serve: (the short canary|canary)")]
    summary["openai"] = out


def load_round(url: str, threads: int, seconds: float, max_tokens: int) -> dict:
    """One round of the load generator (`--load`, a separate process)."""
    r = subprocess.run([sys.executable, __file__, "--load", url, "--threads", str(threads), "--seconds", str(seconds),
                        "--max-tokens", str(max_tokens)], capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode != 0:
        raise RuntimeError(f"load generator failed: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


CONFIGS = ("direct", "front", "canary-60s", "canary-10s")


def part_front(args, summary: dict) -> None:
    """Throughput straight to llama-server (`rocforge serve --no-canary`), through the front with
    no canary, and through the front with the short canary every 60 s and every 10 s: the same
    Front class and checker `rocforge serve --canary-every` builds (serve_front.Front,
    short_checker with the CPU build as reference), one fresh front per window (an idle front's
    canary would land in another's window), the order rotated each round, ratios per round against
    that round's direct figure.  The 60 s canary is phased to fall once inside each window, so it
    runs more often than it would (an upper bound); the 10 s one keeps its own schedule (clients back
    to back are never idle: it runs once overdue, 20 s after the front started)."""
    from rocforge_build.measure import gguf
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.serve import canary
    from rocforge_build.serve import front as serve_front

    model = gguf.check(args.model)
    rows = []
    with Served(args.model, args.logs / "serve-front.log", ["--no-canary"]) as s:
        target = canary.target_of(s.url, s.argv)
        t0 = time.monotonic()
        checker = serve_front.short_checker(model, LlamaBuild.open(args.cpu), target)
        summary["front_checker_setup_s"] = time.monotonic() - t0
        load_round(s.url, args.threads, 3, args.max_tokens)  # the request shapes' first compiles, not measured
        for rnd in range(args.rounds):
            order = CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)]
            row = {}
            for name in order:
                every = {"direct": None, "front": None, "canary-60s": 60.0, "canary-10s": 10.0}[name]
                front = None
                if name != "direct":
                    front = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", s.port), every=every,
                                              checker=checker if every else None).start()
                    if every == 60.0:  # due in the middle of this window (as benchmarks/bench_canary.py does)
                        front._last_canary = time.monotonic() - (60.0 - args.seconds / 2)
                url = s.url if front is None else f"http://127.0.0.1:{front.port}"
                got = load_round(url, args.threads, args.seconds, args.max_tokens)
                if front:
                    front.stop()
                    got.update(canaries=front.stats.canaries, canaries_passed=front.stats.passed,
                               overdue=front.stats.overdue_runs)
                row[name] = got
                say(f"round {rnd + 1} {name:>11}: {got['tok_s']:.1f} tok/s ({got['requests']} requests, "
                    f"{got['errors']} errors, {got.get('canaries', 0)} canaries)")
            for name in CONFIGS[1:]:
                row[name]["ratio"] = row[name]["tok_s"] / row["direct"]["tok_s"]
            rows.append(row)
        t0 = time.monotonic()
        alone = [checker() for _ in range(5)]
        summary["short_canary_alone_s"] = [round(v.seconds, 4) for v in alone]
        summary["short_canary_alone_passed"] = all(v.passed for v in alone)
    out = {"rounds": rows, "threads": args.threads, "seconds": args.seconds, "max_tokens": args.max_tokens}
    for name in CONFIGS:
        out[f"median_tok_s_{name}"] = statistics.median(r[name]["tok_s"] for r in rows)
    for name in CONFIGS[1:]:
        out[f"median_ratio_{name}"] = statistics.median(r[name]["ratio"] for r in rows)
        ratios = ", ".join(f"{r[name]['ratio']:.4f}" for r in rows)
        say(f"{name:>11} / direct: median {out['median_ratio_' + name]:.4f} ({ratios})")
    summary["front"] = out


# --------------------------------------------------------------------------------- load generator

def load(url: str, threads: int, seconds: float, max_tokens: int) -> dict:
    """`threads` clients, each sending /v1/completions (`max_tokens` tokens, ignore_eos, a different
    ~150-token slice of the shipped text each time, so no prompt is served from a slot's cache) back
    to back until `seconds` have passed; requests in flight then are finished and counted.  Tokens
    per second = completion tokens / the time until the last one finished."""
    from rocforge_build.measure import verify

    text = verify.read_chars(verify.text_file(), 200_000)
    parts = urlsplit(url)
    counts = [[0, 0, 0] for _ in range(threads)]  # requests, tokens, errors
    latencies: list[float] = []
    start = time.monotonic()
    deadline = start + seconds

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        n = 0
        while time.monotonic() < deadline:
            at = ((n * threads + i) * 613) % (len(text) - 700)
            n += 1
            body = json.dumps({"model": "m", "prompt": text[at:at + 600], "max_tokens": max_tokens,
                               "temperature": 0, "ignore_eos": True}).encode()
            t0 = time.monotonic()
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                reply = r.read()
                if r.status != 200:
                    counts[i][2] += 1
                    continue
                counts[i][0] += 1
                counts[i][1] += int(json.loads(reply)["usage"]["completion_tokens"])
                latencies.append(time.monotonic() - t0)
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
                counts[i][2] += 1
                conn.close()
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        conn.close()

    pool = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - start
    tokens = sum(c[1] for c in counts)
    return {"threads": threads, "seconds": round(elapsed, 3), "requests": sum(c[0] for c in counts),
            "errors": sum(c[2] for c in counts), "tokens": tokens, "tok_s": tokens / elapsed,
            "latency_p50_s": statistics.median(latencies) if latencies else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", metavar="URL", help="run the load generator against URL, print its JSON")
    ap.add_argument("--cpu", help="the CPU build's prefix (the canary's reference)")
    ap.add_argument("--vulkan", help="the GPU build's prefix (served)")
    ap.add_argument("--model")
    ap.add_argument("--ctx", type=int, default=8192, help="each slot's context (SmolLM2's training context)")
    ap.add_argument("--parts", default="start,openai,front", help="any of start, openai, front")
    ap.add_argument("--slots", type=int, default=SLOTS, help="-np (the CPU-only logic check of a May 2025 "
                    "tree: 1, whose llama-perplexity has no --kv-unified to verify more)")
    ap.add_argument("--threads", type=int, default=2 * SLOTS)
    ap.add_argument("--seconds", type=float, default=30.0, help="each throughput window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--server-arg", action="append", default=[], metavar="WORD",
                    help="one more word of the preset's llama-server command (repeatable: --server-arg=--cache-ram "
                         "--server-arg=0)")
    ap.add_argument("--use-stored-preset", action="store_true",
                    help="serve the preset tune stored (with --server-arg words added) instead of verifying one here")
    ap.add_argument("--json", type=Path, help="where the summary goes (also printed)")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/serve-canary-logs"),
                    help="where each serve's stderr goes (the script packs them into one file)")
    args = ap.parse_args()
    if args.load:
        print(json.dumps(load(args.load, args.threads, args.seconds, args.max_tokens)))
        return 0
    # `timeout` ends the driver with SIGTERM: exit through the `with Served` blocks, so no server (each in
    # its own session) outlives it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.logs.mkdir(parents=True, exist_ok=True)
    summary: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "slots": args.slots,
                     "ctx_per_slot": args.ctx, "parts": args.parts}
    parts = {"start": part_start, "openai": part_openai, "front": part_front}
    for name in ["preset", *args.parts.split(",")]:
        try:
            if name != "preset":
                parts[name](args, summary)
            elif args.use_stored_preset:
                use_stored_preset(args, summary)
            else:
                make_preset(args, summary)
        except Exception as exc:  # one part's failure is written down; the others still run
            summary.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:600]
            say(f"part {name} failed: {summary['errors'][name]}")
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))
    return 1 if summary.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
