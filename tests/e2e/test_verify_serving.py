"""verify's serving dimensions, for real (slow; CI runs it): the May 2025 tree's CPU backend (the
session's reference and wrong-on-demand builds, tests/llama_builds.py `measure_builds`) and the
trained SmolLM2-135M-Instruct (tests/trained_model.py).

The wrong-on-demand build's "mmap" fault (tests/data/patches/llama-cpp-wrong/wrong-on-demand.patch:
libllama's loader marks the process when it maps the weights, and the CPU backend's SiLU scales its
output by 1.25 only when both that mark and ROCFORGE_TEST_WRONG=mmap are there) is wrong only when
the weights are loaded through mmap, llama.cpp's default, as the weights mmap'd on gfx1151 were
(llama.cpp PR #26543).  A verify with mmap on and off in its coverage fails it and names exactly
the mmap-on check; the same verify of the same build with the fault off passes.

Cost: the builds are the session's (shared with tests/e2e/test_verify_shapes.py: ~1 min from a warm
ccache); each verify here is one 256-token context (one chunk), one micro-batch, flash attention
on: two checks (weights mapped, weights read) and one reference run shared by both verifies
(verify's cache is shared in the module).  Measured 2026-11-27 on the 2-core CI container while
other sessions loaded it (load average ~9): the faulty verify 77 s wall / 29 s CPU of
llama-perplexity (it computes the reference too), the fault-off one 42 s / 16 s; the module 184 s
with the builds' set-up.  At 512 tokens (4 chunks) the same verifies cost 135 s and 94 s CPU.
"""

from __future__ import annotations

import json
import resource
import time

import pytest
from trained_model import smollm2

from rocforge_build import cli

pytestmark = pytest.mark.usefixtures("shared_verify_cache")


SHAPE = ["--ctx", "256", "--ubatch", "256", "--fa", "on", "--kv", "f16", "--parallel", "1", "--load", "mmap,read"]


def verify(capsys, build, ref, *extra) -> tuple[int, dict]:
    """`rocforge verify --json` at SHAPE; its wall time and its programs' CPU time are printed (-s)."""
    cpu0, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    code = cli.main(["verify", str(build), "--model", str(smollm2()), "--reference", str(ref), "--json",
                     *SHAPE, *extra])
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print(f"\nverify {' '.join(extra) or '(no fault)'}: {time.monotonic() - start:.1f} s wall, "
              f"{cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime:.1f} s CPU of llama-perplexity")
    return code, out


@pytest.mark.slow
def test_the_mmap_fault_fails_the_mmap_on_check_only(measure_builds, capsys):
    cpu, wrong = measure_builds
    code, v = verify(capsys, wrong, cpu, "--env", "ROCFORGE_TEST_WRONG=mmap")
    assert code == 1 and v["passed"] is False, v
    # both mmap settings ran; the mmap-on check alone failed (the fault needs the mapped weights)
    by_load = {c["load"]: c for c in v["checks"]}
    assert set(by_load) == {"mmap", "read"}, v["checks"]
    assert by_load["mmap"]["passed"] is False and by_load["read"]["passed"] is True, v["checks"]
    assert v["failed_checks"] == [{"ctx": 256, "ubatch": 256, "fa": True, "ngl": None, "kv": "f16",
                                   "load": "mmap", "parallel": 1}]


@pytest.mark.slow
def test_the_same_build_passes_with_the_fault_off(measure_builds, capsys):
    cpu, wrong = measure_builds
    code, v = verify(capsys, wrong, cpu)
    assert code == 0 and v["passed"] is True, v
    assert {c["load"] for c in v["checks"]} == {"mmap", "read"}
