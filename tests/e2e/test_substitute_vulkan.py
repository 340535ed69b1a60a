"""A GPU build from a store (slow; CI runs it): the May 2025 tree's Vulkan backend (lavapipe, from
Debian's mesa-vulkan-drivers, is a real Vulkan device on a machine without a GPU), built from its
PyPI sdist with the programs verify runs, published by machine A, pulled by machine B with
--substitute-only and verified here against B's own CPU reference with the trained SmolLM2-135M.

A GPU build records its verify here as `rocforge verify` does — a results row carrying the
build's provenance, and the verdict `rocforge env` reads — and both open the prefix: they must
run after the pulled tree is swapped in (before, the pull stopped with "build prefix … does not
exist" on a fresh prefix, and on an existing one would have recorded the old build).  Shown on a
fresh prefix and on one holding an older Vulkan build; the evidence A published names its Vulkan
device, driver and ICDs.

Cost: 2,444 s on the 2-core machine (2026-11-29, shared with other runs): setup 133 s, the pull onto
a fresh prefix 1,009 s, over an older build 1,300 s -- nearly all of it the quick verify's
llama-perplexity runs on lavapipe (6-8 min each at 512 tokens).  Over CI's budget: it runs where
asked (ROCFORGE_TEST_LAVAPIPE=1); tests/e2e/test_substitute_install_order.py shows the same order
of swap and record in CI with the fixture recipe's non-CPU backend."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from llama_builds import shared_ccache
from llama_trees import sdist
from needs import lavapipe_budget, needs_pkg_config, require
from trained_model import smollm2_trained_at
from trust_helpers import machine, rocforge

from rocforge_build.measure.llama_tools import MEASURE_TARGETS

pytestmark = [lavapipe_budget(), needs_pkg_config("vulkan")]  # vulkan.pc: libvulkan-dev
TARGETS = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]


def _machine(base: Path) -> dict:
    return machine(base, CCACHE_DIR=shared_ccache())


def _ok(res):
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    require("glslc", "patchelf")
    base = tmp_path_factory.mktemp("substitute-vulkan")
    build = ["build", "llama-cpp", "--backend", "vulkan", "--source", str(sdist("0.3.9")), *TARGETS,
             "-j", "2", "--no-recheck"]
    a = _machine(base / "a")
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    prefix = _ok(rocforge(*build, env=a, timeout=3600)).stdout.strip().splitlines()[-1]
    store = (base / "store").as_uri()
    tag = _ok(rocforge("publish", prefix, "--to", store, "--unverified", env=a, timeout=900)).stdout.strip()
    return {"base": base, "build": build, "public": public, "store": store, "tag": tag, "a": a}


def _configured(published, name: str) -> dict:
    env = _machine(published["base"] / name)
    model = smollm2_trained_at(512, published["base"] / "smollm2-at-512.gguf")
    for key, value in (("substitute.stores", json.dumps([published["store"]])),
                       ("substitute.trusted_keys", json.dumps([published["public"]])),
                       ("substitute.verify_model", str(model)), ("substitute.verify", "quick")):
        _ok(rocforge("config", "set", key, value, env=env))
    return env


def _pulled_and_recorded(published, env: dict, prefix: Path) -> dict:
    """Pull onto `prefix`; what the manifest, the results row and `env`'s verdict say of it."""
    _ok(rocforge(*published["build"], "--prefix", str(prefix), "--substitute-only", env=env, timeout=1800))
    assert not Path(str(prefix) + ".rocforge-new").exists()
    manifest = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    rows = json.loads(_ok(rocforge("results", "export", "--json", "--prefix", str(prefix), env=env)).stdout)
    verdict = tomllib.loads((Path(env["ROCFORGE_DATA_DIR"]) / "verified" / f"{prefix.name}.toml").read_text())
    return {"manifest": manifest, "rows": rows, "verdict": verdict}


@pytest.mark.slow
def test_a_vulkan_build_pulled_onto_a_fresh_prefix_is_verified_and_recorded_as_itself(published):
    b = _configured(published, "b")
    prefix = Path(b["ROCFORGE_DATA_DIR"]) / "builds" / "llama-cpp-vulkan"
    got = _pulled_and_recorded(published, b, prefix)
    m = got["manifest"]
    assert m["backend"] == "vulkan" and m["substituted"]["verified_here"] == "passed", m["substituted"]
    [row] = [r for r in got["rows"] if r.get("kind", "verify") == "verify"] or got["rows"]
    assert row["build"]["stamp"] == m["stamp"] and row["build"]["backend"] == "vulkan"
    assert got["verdict"]["stamp"] == m["stamp"] and got["verdict"]["passed"] is True


@pytest.mark.slow
def test_a_vulkan_build_pulled_over_an_older_one_records_the_new_build(published):
    c = _configured(published, "c")
    prefix = Path(c["ROCFORGE_DATA_DIR"]) / "builds" / "llama-cpp-vulkan"
    older = ["build", "llama-cpp", "--backend", "vulkan", "--source", str(sdist("0.3.9")),
             "--cmake-target", "llama-bench", "-j", "2", "--no-recheck", "--no-substitutes", "--prefix", str(prefix)]
    _ok(rocforge(*older, env=c, timeout=3600))
    old_stamp = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["stamp"]
    got = _pulled_and_recorded(published, c, prefix)
    m = got["manifest"]
    assert m["stamp"] != old_stamp and m["substituted"]["verified_here"] == "passed", m["substituted"]
    assert (prefix / "bin" / "llama-perplexity").is_file()  # the old build had llama-bench only
    stamps = {r["build"]["stamp"] for r in got["rows"]}
    assert stamps == {m["stamp"]}, stamps
    assert got["verdict"]["stamp"] == m["stamp"]


@pytest.mark.slow
def test_the_published_evidence_names_the_vulkan_device_driver_and_icd(published):
    reader = _configured(published, "reader")
    shown = json.loads(_ok(rocforge("store", "show", published["store"], published["tag"], "--json",
                                    env=reader)).stdout)
    [attestation] = shown["attestations"]
    vk = attestation["host"]["vulkan"]
    # lavapipe: llama.cpp prints it as `ggml_vulkan: 0 = llvmpipe (LLVM N, 256 bits) (llvmpipe) | ...`
    assert any(d["driver"] == "llvmpipe" and d["name"].startswith("llvmpipe") for d in vk["devices"]), vk
    assert any(Path(i["file"]).name.startswith("lvp_icd") for i in vk["icds"]), vk
    text = _ok(rocforge("store", "show", published["store"], published["tag"], env=reader)).stdout
    assert "vulkan: llvmpipe" in text and "(driver llvmpipe)" in text and "lvp_icd" in text, text
