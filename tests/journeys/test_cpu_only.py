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

import time
from pathlib import Path

import pytest
from journey_user import User, capital, running_from
from llama_builds import JOBS
from trained_model import smollm2_trained_at

from rocforge_build.measure.llama_tools import MEASURE_TARGETS

pytestmark = [pytest.mark.slow]


def test_build_prove_tune_serve_answers(tmp_path, llama_tree):
    start = time.monotonic()
    user = User(tmp_path, "cpu journey")
    model = smollm2_trained_at(1024, tmp_path / "smollm2-at-1024.gguf")  # tune's range and serve's slot: 1024
    targets = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]
    out = user.rocforge("build", "llama-cpp", "--backend", "cpu", "--source", str(llama_tree), *targets,
                        "-j", str(JOBS))
    assert out.returncode == 0, out.stderr[-3000:]
    prefix = Path(out.stdout.strip().splitlines()[-1])
    out = user.rocforge("verify", str(prefix), "--model", str(model), "--quick")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.strip() == (f"{prefix} is rocforge's reference (a CPU build of the default plan): nothing "
                                  "to compare it with; other builds of this source are verified against it")
    assert "PASSED" not in out.stdout + out.stderr
    out = user.rocforge("tune", "llama-cpp", "--backends", "cpu", "--source", str(llama_tree), "--model",
                        str(model), "--contexts", "short", "--ctx", "256", "--ubatch", "256", "--fa", "on",
                        "--kv", "f16", "--reps", "1", "-p", "32", "-n", "8", "-j", str(JOBS))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "GPU target" not in out.stderr
    answers = []
    code, line, err = user.serve(model, ask=lambda port: answers.append(capital(port)))
    assert line and "canary passed" in err, err[-3000:]
    reference = tmp_path / "data" / "builds" / "reference"  # rocforge's own, never the served prefix
    assert reference.is_dir() and any(reference.iterdir()), err[-3000:]
    assert code == 130, err[-3000:]  # Ctrl-C
    assert "Paris" in answers[0], answers
    assert "Traceback" not in err
    assert running_from(prefix) == [] and running_from(reference) == []
    user.say(f"cpu journey: {time.monotonic() - start:.0f} s")
