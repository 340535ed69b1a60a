"""The numerics canary on a real llama-server (slow; CI runs it): the May 2025 tree's CPU backend
built twice (the session's `measure_builds`: the reference and the wrong-on-demand build,
tests/data/patches/llama-cpp-wrong/), the trained SmolLM2-135M-Instruct (trained context 8192,
tests/trained_model.py), served on 127.0.0.1 with 4 parallel slots.

- `rocforge serve` of the wrong-on-demand build with no fault asked for passes the canary over its
  4 slots of 2048 tokens, with a long prompt of 2032 tokens, and prints its URL; the verdict is in
  the results store with the host.
- A proxy written here (a Python HTTP relay, the one fake: a real llama-server cannot be told to
  mix up its answers) swaps the bodies of two concurrent responses: the canary names the request
  that got the answer meant for another.
- With the patch's "mmap" fault (SiLU scaled only when libllama mapped the weights), served
  through mmap fails; --no-mmap passes.
- With the patch's "stretch-past-1024" fault (RoPE positions past 1024 stretched by 1.5, a rope
  scaling gone wrong: right up to token 1024, drifting more the further past it), the short
  requests pass and the long prompt fails, named.

Not here, because it does not hold: ROCFORGE_TEST_WRONG=past-5000 (RoPE positions past 5000
shifted by 1000) served with slots of 5632 tokens PASSED the canary twice (2026-11-27: a 5616-token
prompt, 16 generated tokens compared), while verify's 8192-token check fails it.  Probing the
prompt itself one position at a time (2026-11-27, 34 positions 4096-8320 against the reference) shows
why: past 5000 its mean KLD is 0.005 (the Q4_1 limit is 0.0112, a right GPU build reaches 0.004)
and the PPL ratio of the text's tokens 1.024 with a spread of 0.12 nats a token: only thousands of
positions, which verify scores and llama-server cannot return (no prompt log-probabilities:
llama.cpp #27174), tell it from noise; docs/guides/measuring.md says so.

The reference's answers are cached (verify.cache_dir()/canary, shared by this module's tests like
test_verify_shapes.py shares verify's), so the reference's llama-server runs once per plan.
Cost on the 2-core machine under load (2026-11-27): the swap test 19-40 s, the mmap test 66 s,
the parallel-slots test 267 s with 5632-token slots (2048 now: about a third of that).
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from journey_user import free_port, serve_until_url
from trained_model import smollm2

from rocforge_build.measure import gguf
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.serve import canary

# 4 slots of 2048 tokens: the long prompt fills one (2032 tokens) at a cost CI's 2 cores bear
PARALLEL, SLOT_CTX = 4, 2048


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("canary-cache")


@pytest.fixture(autouse=True)
def _shared_cache(_isolated, shared_cache, monkeypatch):
    """One rocforge cache for the module (the rest of `_isolated` stays), here and in the `rocforge
    serve` children: the reference's cached answers (verify.cache_dir()/canary) are found again."""
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(shared_cache))


def store_preset(prefix: Path, model: Path, env: dict, extra: list[str], slot_ctx: int = SLOT_CTX) -> None:
    """The preset tune would store for this build, with 4 slots of `slot_ctx` tokens (-c is the
    slots' total in this tree), put in the store directly: this module is about the canary."""
    from rocforge_build.measure import preset, provenance
    from rocforge_build.measure.store import Store

    build = LlamaBuild.open(prefix)
    variant = {"ubatch": 512, "fa": True, "parallel": PARALLEL}
    penv, argv, notes = preset.command(build, str(model), variant, slot_ctx, False)  # -c 4 x slot_ctx, -np 4
    argv += extra
    sha = provenance.model_sha256(model)
    entry = {"prefix": str(prefix), "backend": "cpu", "stamp": build.stamp, "depth": 0, "ctx": slot_ctx,
             "variant": {**variant, "env": env}, "variant_label": "ub=512 fa=1", "score": 1.0,
             "figures": [], "runner_up": None, "env": {**penv, **env}, "argv": argv, "notes": notes,
             # what tune stores of the shape it verified (the serving dimensions included): the
             # build is served as proven, and the canary is what is tested
             "verified": {"shape": {"ctx": slot_ctx, "ubatch": 512, "fa": True, "ngl": None, "kv": "f16",
                                    "load": "read" if "--no-mmap" in extra else "mmap", "parallel": PARALLEL}}}
    with Store() as s:
        s.add_preset("smollm2", sha, None, {"model": {"name": "smollm2", "sha256": sha, "path": str(model)},
                                            "created": "test", "ranges": {"long": entry}})


def serve(model: Path, ref: Path, *extra: str) -> tuple[int | None, str, str, int]:
    """`rocforge serve` until it prints its URL (then Ctrl-C) or exits: (exit code or None when it
    served, stdout's first line, stderr, port)."""
    port = free_port()
    code, line, err = serve_until_url([sys.executable, "-m", "rocforge_build", "serve", str(model), "--port",
                                       str(port), "--reference", str(ref), "--wait", "1500", *extra], None)
    time.sleep(0.2)
    return (None if line else code), line, err, port


def canary_rows() -> list[dict]:
    from rocforge_build.measure.store import Store

    with Store() as s:
        return [r.data for r in s.rows(kind="canary")]


@pytest.mark.slow
def test_the_wrong_build_with_no_fault_passes_with_parallel_slots(measure_builds):
    cpu, wrong = measure_builds
    model = smollm2()
    store_preset(wrong, model, {}, [])
    code, line, err, port = serve(model, cpu)
    assert code is None and f"http://127.0.0.1:{port}" in line, err[-3000:]
    assert "canary passed" in err
    (row,) = canary_rows()
    assert row["passed"] and row["host"]["cpus"] and row["target"] == {
        "url": f"http://127.0.0.1:{port}", "parallel": PARALLEL, "ctx_per_slot": SLOT_CTX}
    labels = [r["label"] for r in row["rows"]]
    # the slot's context bounds the long prompt: 2048 less the 16 tokens it generates
    assert labels == ["long prompt (2032 tokens)", "request 1", "request 2", "request 3", "request 4"]
    # every request passed; a near-tie may end a comparison before the 16th token (the module's rule)
    assert all(r["passed"] and 1 <= r["compared"] <= 16 for r in row["rows"])


def wait_healthy(url: str, server: subprocess.Popen, seconds: float) -> None:
    """Until the llama-server started here answers /health with 200 (it loads the model first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, f"llama-server exited with {server.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"{url}/health did not answer 200 within {seconds} s")


class SwappingProxy(http.server.ThreadingHTTPServer):
    """A relay to a real llama-server that gives two concurrent /completion requests each other's
    answers (llama.cpp #25992's failure, made on purpose)."""

    daemon_threads = True

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.waiting: list = []
        self.lock = threading.Lock()
        self.swapped = 0
        super().__init__(("127.0.0.1", 0), _Relay)


class _Relay(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _forward(self, method: str, body: bytes | None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.server.upstream + self.path, data=body, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def do_GET(self):
        self._answer(*self._forward("GET", None))

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, answer = self._forward("POST", body)
        if self.path == "/completion" and self.server.swapped == 0:
            mine = {"answer": answer, "theirs": None, "done": threading.Event()}
            with self.server.lock:
                self.server.waiting.append(mine)
                if len(self.server.waiting) == 2:
                    a, b = self.server.waiting
                    a["theirs"], b["theirs"] = b["answer"], a["answer"]
                    self.server.swapped += 1
                    a["done"].set()
                    b["done"].set()
            if mine["done"].wait(60):
                answer = mine["theirs"]
        self._answer(status, answer)

    def _answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.slow
def test_a_proxy_that_swaps_two_concurrent_answers_is_named(measure_builds):
    cpu, wrong = measure_builds
    model = gguf.check(smollm2())
    port = free_port()
    server = subprocess.Popen([str(wrong / "bin" / "llama-server"), "-m", str(model.path), "--host", "127.0.0.1",
                               "--port", str(port), "-c", "2048", "-np", str(PARALLEL)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    proxy = SwappingProxy(f"http://127.0.0.1:{port}")
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, 120)
        # slots of 64 tokens: no room for a long prompt, the short requests alone (sent at once)
        target = canary.Target(f"http://127.0.0.1:{proxy.server_address[1]}", {}, 64, PARALLEL)
        plan = canary.plan(model, target)
        assert plan.long_tokens == 0 and len(plan.texts) == PARALLEL
        ref = canary.reference(plan, LlamaBuild.open(cpu), model)
        verdict = canary.check(plan, target, ref, timeout=300)
    finally:
        proxy.shutdown()
        server.terminate()
        server.wait(30)
    assert proxy.swapped == 1 and not verdict.passed
    failed = [r for r in verdict.rows if r.failed]
    # exactly the two requests whose answers were swapped fail, and the canary names the swap: each
    # answer is judged against the other request's reference too, and at least one matches it
    # within verify's limits (both, usually; a parting at a token where the other reference's
    # choice was clear can keep one from matching)
    assert len(failed) == 2 and {failed[0].answer_of, failed[1].answer_of} - {None} <= {failed[0].label, failed[1].label}
    named = [r for r in failed if r.answer_of]
    assert named and all(f"{r.label} got the answer meant for {r.answer_of}" in " ".join(verdict.failures)
                         for r in named), verdict.failures


@pytest.mark.slow
def test_wrong_only_through_mmap_fails_and_no_mmap_passes(measure_builds):
    cpu, wrong = measure_builds
    model = smollm2()
    # slots of 1024 tokens: the fault is in every position, a long prompt would only cost time
    store_preset(wrong, model, {"ROCFORGE_TEST_WRONG": "mmap"}, [], slot_ctx=1024)
    code, _, err, _ = serve(model, cpu)
    assert code == 1 and "canary: long prompt (1008 tokens):" in err, err[-3000:]
    store_preset(wrong, model, {"ROCFORGE_TEST_WRONG": "mmap"}, ["--no-mmap"], slot_ctx=1024)
    code, line, err, _ = serve(model, cpu)
    assert code is None and "canary passed" in err, err[-3000:]


@pytest.mark.slow
def test_a_server_wrong_only_past_1024_tokens_fails_at_its_long_prompt(measure_builds):
    cpu, wrong = measure_builds
    model = smollm2()
    # RoPE positions past 1024 stretched by 1.5: the four short requests (~150 tokens each) never
    # reach position 1024 and pass; the long prompt's 16 generated positions are 1000 past it
    store_preset(wrong, model, {"ROCFORGE_TEST_WRONG": "stretch-past-1024"}, [])
    code, _, err, _ = serve(model, cpu)
    assert code == 1 and "canary: long prompt (2032 tokens):" in err, err[-3000:]
    (row,) = canary_rows()
    assert [(r["label"], r["passed"]) for r in row["rows"]] == [
        ("long prompt (2032 tokens)", False), ("request 1", True), ("request 2", True), ("request 3", True),
        ("request 4", True)]
