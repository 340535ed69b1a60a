"""A real llama.cpp CPU build shared through a real registry and verified where it lands (slow; CI
runs it): the May 2025 tree from its PyPI sdist (a tarball: a source another machine can name),
made wrong on demand (tests/data/patches/llama-cpp-wrong/: ROCFORGE_TEST_WRONG picks a fault at
run time), published as verify's reference with its own perplexity measured with the trained
SmolLM2-135M model; then pulled by a second machine that measures the same figures itself.

- Asked for no fault, the pulled build's figures match the published ones: it counts as a build,
  its manifest says "passed", and nothing was compiled.
- A third machine whose runtime makes the same bytes wrong (flash attention's output scaled, the
  way a broken runtime or driver would) fails the check here: nothing is installed, one line says
  "failed here", and the signed failure goes back to the store with this host's fingerprint.

CI cost (2 cores): one cold compile of llama-perplexity (the session's ccache is shared), a few
seconds of llama-perplexity per machine at 512 tokens."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from llama_builds import shared_ccache
from llama_trees import sdist
from measure_fixtures import recipe_variant
from needs import require
from registry_server import start_registry
from trained_model import smollm2
from trust_helpers import machine, one_error, rocforge

WRONG = Path(__file__).resolve().parents[1] / "data" / "patches" / "llama-cpp-wrong" / "wrong-on-demand.patch"


def _machine(base: Path, **extra: str) -> dict:
    return machine(base, CCACHE_DIR=shared_ccache(), **extra)


def _ok(res):
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    require("docker-registry", "patchelf")
    base = tmp_path_factory.mktemp("substitute-llama")
    recipe = recipe_variant(base / "rw", patch=WRONG)
    build = ["build", str(recipe), "--target", "gfx1151", "--backend", "cpu", "--source",
             str(sdist("0.3.9")), "--cmake-target", "llama-perplexity", "-j", "2", "--no-recheck"]
    a = _machine(base / "a")
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    prefix = _ok(rocforge(*build, env=a, timeout=3600)).stdout.strip().splitlines()[-1]
    with start_registry(base / "registry") as registry:
        store = registry.store_url("homelab/llama")
        out = json.loads(_ok(rocforge("publish", prefix, "--to", store, "--model", str(smollm2()),
                                      "--json", env=a, timeout=900)).stdout)
        yield {"base": base, "build": build, "public": public, "store": store, "published": out}


def _configured(shared, name: str, **extra: str) -> dict:
    env = _machine(shared["base"] / name, **extra)
    for key, value in (("substitute.stores", [shared["store"]]), ("substitute.trusted_keys", [shared["public"]]),
                       ("substitute.verify_model", str(smollm2()))):
        _ok(rocforge("config", "set", key, json.dumps(value) if isinstance(value, list) else value, env=env))
    return env


@pytest.mark.slow
def test_a_cpu_build_goes_out_as_the_reference_with_its_own_figures(shared):
    assert shared["published"]["kind"] == "reference"


@pytest.mark.slow
def test_the_pulled_build_is_verified_here_and_compiles_nothing(shared):
    b = _configured(shared, "b")
    res = _ok(rocforge(*shared["build"], "--substitute-only", env=b, timeout=900))
    prefix = Path(res.stdout.strip().splitlines()[-1])
    m = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    assert m["substituted"]["verified_here"] == "passed", m["substituted"]
    # its own perplexity at both flash-attention settings, within verify's limit of the publisher's
    lines = m["substituted"]["verify_lines"]
    assert len(lines) == 2 and all("where it was published" in line for line in lines), lines
    assert not list(Path(b["ROCFORGE_CACHE_DIR"]).rglob("CMakeCache.txt"))


@pytest.mark.slow
def test_a_build_wrong_on_this_runtime_fails_here_and_is_reported_back(shared):
    c = _configured(shared, "c", ROCFORGE_TEST_WRONG="flash-attn")
    own = _ok(rocforge("key", "generate", env=c)).stdout.strip()
    _ok(rocforge("config", "set", "substitute.report_failures", "true", env=c))
    _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([shared["public"], own]), env=c))
    res = rocforge(*shared["build"], "--substitute-only", env=c, timeout=900)
    line = one_error(res, code=9)
    assert "failed here" in line and "past the limit" in line, line
    assert not list(Path(c["ROCFORGE_DATA_DIR"]).rglob("rocforge-manifest.toml"))
    shown = json.loads(_ok(rocforge("store", "show", shared["store"], shared["published"]["key"], "--json",
                                    env=c)).stdout)
    kinds = sorted(a["kind"] for a in shown["attestations"])
    assert kinds == ["failed-here", "reference"], kinds
