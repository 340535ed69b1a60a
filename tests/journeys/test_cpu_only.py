"""The CPU-only user's journey (slow; CI runs it), end to end through the CLI as a user types it,
in a fresh HOME and data dir: build the May 2025 tree (the session's `llama_tree`) with rocforge's
default plan for the CPU backend -> verify says it is the reference (exit 0, no PASSED) -> tune
--backends cpu with no GPU target -> serve, whose canary compares it with rocforge's own reference
build of the same plan in its own prefix (never with itself) -> an OpenAI-style client gets the
right answer from the trained SmolLM2-135M-Instruct -> Ctrl-C leaves no process.

`--cmake-target` limits the builds to the programs rocforge measures and serves; it picks which
programs are linked, not how any file is compiled, so the build stays the default plan.
Measured 2026-11-29 on the shared 2-core machine (load average 8): 513 s in all -- build 9 s and
the reference's build from the shared ccache, verify 1 s, tune 296 s, serve with its canary ~200 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from llama_builds import JOBS, shared_ccache
from trained_model import smollm2_trained_at

from rocforge_build.measure.llama_tools import MEASURE_TARGETS

pytestmark = [pytest.mark.slow]


def say(text: str) -> None:
    """A step's cost, printed past pytest's capture (CI's log keeps it)."""
    sys.__stderr__.write(f"\n[cpu journey] {text}\n")


def rocforge(env: dict, *args: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rocforge_build", *args], env=env, text=True,
                         capture_output=True, timeout=1800)
    say(f"rocforge {args[0]}: exit {out.returncode} in {time.monotonic() - start:.0f} s")
    return out


def running_from(prefix: Path) -> list[int]:
    """The processes whose program lies in `prefix` (a llama-server left running, say)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "exe").startswith(str(prefix) + "/"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def capital(port: int) -> str:
    """An OpenAI-style client's question, one a 135M instruct model answers right."""
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
            "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def serve(env: dict, model: Path, answers: list) -> tuple[int, str, str]:
    """`rocforge serve MODEL` (no --reference): when it announces its URL the client asks, then
    Ctrl-C; (exit code, stdout's first line, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", str(model), "--port", str(port),
                             "--wait", "1500"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        line = proc.stdout.readline()
        if line:
            answers.append(capital(port))
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    return code, line, "".join(err)


def test_build_prove_tune_serve_answers(tmp_path, llama_tree):
    start = time.monotonic()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CCACHE_DIR": shared_ccache(),
           **{f"ROCFORGE_{v.upper()}_DIR": str(tmp_path / v) for v in ("config", "cache", "data")}}
    for v in ("home", "config", "cache", "data"):
        (tmp_path / v).mkdir()
    model = smollm2_trained_at(1024, tmp_path / "smollm2-at-1024.gguf")  # tune's range and serve's slot: 1024
    targets = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]
    out = rocforge(env, "build", "llama-cpp", "--backend", "cpu", "--source", str(llama_tree), *targets,
                        "-j", str(JOBS))
    assert out.returncode == 0, out.stderr[-3000:]
    prefix = Path(out.stdout.strip().splitlines()[-1])
    out = rocforge(env, "verify", str(prefix), "--model", str(model), "--quick")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.strip() == (f"{prefix} is rocforge's reference (a CPU build of the default plan): nothing "
                                  "to compare it with; other builds of this source are verified against it")
    assert "PASSED" not in out.stdout + out.stderr
    out = rocforge(env, "tune", "llama-cpp", "--backends", "cpu", "--source", str(llama_tree), "--model",
                        str(model), "--contexts", "short", "--ctx", "256", "--ubatch", "256", "--fa", "on",
                        "--kv", "f16", "--reps", "1", "-p", "32", "-n", "8", "-j", str(JOBS))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "GPU target" not in out.stderr
    answers = []
    code, line, err = serve(env, model, answers)
    assert line and "canary passed" in err, err[-3000:]
    reference = tmp_path / "data" / "builds" / "reference"  # rocforge's own, never the served prefix
    assert reference.is_dir() and any(reference.iterdir()), err[-3000:]
    assert code == 130, err[-3000:]  # Ctrl-C
    assert "Paris" in answers[0], answers
    assert "Traceback" not in err
    assert running_from(prefix) == [] and running_from(reference) == []
    say(f"cpu journey: {time.monotonic() - start:.0f} s")
