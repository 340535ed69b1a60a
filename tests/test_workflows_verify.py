"""workflows/verify.py: the verify session on real prefixes with real manifests
(tests/stackfixtures.make_build) and a real llama-perplexity program (a shell script speaking
llama.cpp's KL-divergence output): a build compared with the reference given, its verdict
recorded; a CPU build of the default plan is its own reference, nothing run, recorded as proven;
a build given as its own reference is refused.  The command's output is in
tests/attack/test_trust_verify_reference.py and tests/test_measure_verify.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import tomlkit
from stackfixtures import make_build
from test_commands_env_path import BAD, GOOD, perplexity_program
from tiny_gguf import write as write_gguf

from rocforge_build.discover import choices
from rocforge_build.errors import UsageError
from rocforge_build.forge import recipes
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.rootfs import Root
from rocforge_build.workflows.verify import VerifyAsked, verify_build


@pytest.fixture
def model(tmp_path):
    return str(write_gguf(tmp_path / "tiny.gguf", byte_tokens=True))


def build(backend: str, line: str = GOOD, *, packaged: bool = False) -> LlamaBuild:
    """A llama.cpp build whose llama-perplexity prints `line`; `packaged`: its manifest names the
    packaged recipe (a CPU one is then rocforge's default plan: the reference)."""
    prefix = make_build(Path("/"), "llama-cpp", "gfx1151", backend, files=("bin/llama-cli",))
    if packaged:
        path = prefix / "rocforge-manifest.toml"
        doc = tomlkit.parse(path.read_text())
        doc["recipe"]["sha256"] = hashlib.sha256(recipes.load("llama-cpp").text.encode()).hexdigest()
        doc["source"]["identity"] = doc["source"]["commit"] = "1" * 40
        path.write_text(tomlkit.dumps(doc))
    perplexity_program(prefix, line)
    return LlamaBuild.open(prefix)


def asked(b: LlamaBuild, model: str, reference: LlamaBuild | None = None) -> VerifyAsked:
    return VerifyAsked(build=b, model=model, reference=reference, quick=True, rootfs=Root("/"),
                       argv=("verify", str(b.prefix), "--quick"), quiet=True)


def test_a_build_is_compared_with_the_reference_given_and_its_verdict_recorded(model):
    ref, vk = build("cpu"), build("vulkan")
    done = verify_build(asked(vk, model, ref), None)
    assert done.passed and not done.is_reference and done.reference.prefix == ref.prefix
    assert done.result["reference"] == str(ref.prefix) and done.result["checks"]
    assert all(c["ctx"] == done.result["checks"][0]["ctx"] for c in done.result["checks"])  # --quick
    assert choices.verdict(Root("/"), vk.prefix.name, vk.stamp) is not None
    assert "backend_ops" not in done.result  # the build has no test-backend-ops: no stage


def test_a_build_whose_logits_differ_fails(model):
    ref, vk = build("cpu"), build("vulkan", BAD)
    said = []
    done = verify_build(asked(vk, model, ref), said.append)
    assert not done.passed and not all(c["passed"] for c in done.result["checks"])
    assert choices.verdict(Root("/"), vk.prefix.name, vk.stamp) is None
    assert said  # progress went to `say`


def test_a_default_plan_cpu_build_is_its_own_reference_and_recorded_as_proven(model):
    cpu = build("cpu", BAD, packaged=True)  # BAD: a comparison would fail; none is made
    done = verify_build(asked(cpu, model), None)
    assert done.is_reference and done.passed and done.reference is cpu
    assert done.result["checks"] == [] and done.result["reference"] == str(cpu.prefix)
    assert done.result["note"] == (f"{cpu.prefix} is rocforge's reference (a CPU build of the default "
                                   "plan): nothing to compare it with; other builds of this source "
                                   "are verified against it")
    assert choices.verdict(Root("/"), cpu.prefix.name, cpu.stamp) == (
        choices.verified(Root("/"), cpu.prefix.name, cpu.stamp), True)


def test_a_build_given_as_its_own_reference_is_refused(model):
    vk = build("vulkan")
    with pytest.raises(UsageError) as got:
        verify_build(asked(vk, model, LlamaBuild.open(vk.prefix)), None)
    assert got.value.message == f"nothing was compared: {vk.prefix} is its own reference (the same prefix)"
    assert choices.verdict(Root("/"), vk.prefix.name, vk.stamp) is None
