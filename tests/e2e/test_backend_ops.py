"""verify's backend-ops stage on a real build (slow; CI runs it): the May 2025 tree (llama-cpp-python
0.3.9 sdist) built for the CPU backend with `--cmake-target test-backend-ops --cmake-target
llama-perplexity`, from the session's shared ccache.

- The recipe's verify tool lands in PREFIX/libexec/ (not bin/), the manifest lists it, and the
  configure turned LLAMA_BUILD_TESTS on for this build only.
- The real program runs (`test -b CPU -o ADD`) and rocforge's reading of its output counts the
  ADD cases it printed, none failed.
- A CPU-only build of this tree has nothing to compare: its test-backend-ops compares the CPU
  backend only with itself (0.3.36's compares it with the CPU reference kernels; 0.3.9's has none),
  so `rocforge verify --quick` says "not run: the CPU backend is the reference" in its JSON and text,
  and passes on its perplexity check against the session's CPU reference build.
- Asked to run it as a GPU build's stage (no device but the CPU), the stage fails, "nothing was
  compared" — never a pass that tested nothing.

Cost, measured 2026-11-27 on 2 shared cores: the tools build 14 s (idle) to 107 s (load ~12) from a warm ccache
(ggml, libllama and common are the measure builds' objects; test-backend-ops.cpp is the one new
compile; 6 min 19 s of CPU cold); the verify --quick against the session's reference ~6 min there
(the measure builds are the session's, paid once for every slow test that verifies); the ADD run
~2 s.  The whole module: 15 min 15 s there, with verify run twice (now once).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from llama_builds import JOBS, shared_ccache
from llama_trees import tree
from trained_model import smollm2

from rocforge_build import cli
from rocforge_build.discover.builds import read_manifest
from rocforge_build.measure import backend_ops

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tools_build(tmp_path_factory):
    where = tmp_path_factory.mktemp("backend-ops")
    src = tree("0.3.9", where / "src", full=True)
    prefix = where / "cpu-tools"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CCACHE_DIR", shared_ccache())
        code = cli.main(["build", "llama-cpp", "--target", "gfx1151", "--backend", "cpu", "--source", str(src),
                         "--cmake-target", "test-backend-ops", "--cmake-target", "llama-perplexity",
                         "-j", str(JOBS), "--prefix", str(prefix)])
    assert code == 0
    return prefix


def test_the_verify_tool_is_installed_off_path_and_recorded(tools_build):
    assert (tools_build / "libexec" / "test-backend-ops").is_file()
    assert not (tools_build / "bin" / "test-backend-ops").exists()
    manifest = read_manifest(tools_build)
    assert manifest["verify_tools"] == ["libexec/test-backend-ops"]
    assert "-DLLAMA_BUILD_TESTS=ON" in manifest["flags"]["configure"]


def test_the_real_program_runs_and_its_output_is_read(tools_build):
    program = backend_ops.find_program(tools_build)
    out = subprocess.run([str(program), "test", "-b", "CPU", "-o", "ADD"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    parsed = backend_ops.parse([backend_ops._clean(line) for line in out.stdout.splitlines()])
    assert parsed.summary == "1/1 backends passed" and parsed.backends == ["CPU"]
    # 0.3.9 counts the cases -o leaves out as passed: its N/N is every case of the tree (5519,
    # tests/data/backend_ops/README.md), the ADD cases are the lines it printed
    assert parsed.tests_passed == ["5519/5519"]
    printed = [line for line in out.stdout.splitlines() if line.startswith("  ADD(")]
    assert parsed.ok + parsed.not_supported == len(printed) and parsed.ok > 10
    assert parsed.ops == {"ADD"} and not parsed.failed


def test_verify_says_the_cpu_backend_is_the_reference(tools_build, measure_builds, capsys):
    reference, _ = measure_builds
    model = smollm2()
    assert cli.main(["verify", str(tools_build), "--model", str(model), "--reference", str(reference),
                     "--quick", "--backend-ops", "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["backend_ops"]
    assert stage["ran"] is False and stage["passed"] is None
    assert stage["why_not_run"].startswith("the CPU backend is the reference")
    # what the text output prints of it (commands/verify.py report: these lines, indented)
    assert backend_ops.lines_of(stage)[0].startswith("backend ops: not run: the CPU backend is the reference")


def test_a_gpu_stage_with_no_device_but_the_cpu_compares_nothing_and_fails(tools_build):
    res = backend_ops.run(tools_build, gpu=True, backend="vulkan", ops=("ADD",), timeout=300)
    assert res.ran and res.passed is False
    assert res.problem.startswith("nothing was compared")
    assert res.backends == ["CPU"] and res.seconds < 300
    assert os.path.basename(res.commands[0][0]) == "test-backend-ops"
