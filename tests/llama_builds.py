"""Session fixtures for the slow tests that need a real llama.cpp CPU build (registered in
conftest.py): the May 2025 tree is built once per test session (CPU backend, `llama-bench` only)
and shared by tests/e2e/test_llama_build.py and tests/e2e/test_bundle.py; a tiny random GGUF model to run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from llama_trees import tree
from tiny_gguf import write as write_gguf

FULL = os.environ.get("ROCFORGE_INTEGRATION_FULL") == "1"
VERSION = os.environ.get("ROCFORGE_LLAMA_VERSION", "0.3.9")
TARGETS = () if FULL else ("llama-bench",)
JOBS = int(os.environ.get("ROCFORGE_TEST_JOBS", "2"))


def shared_ccache() -> str:
    """One compiler cache for all llama builds, kept between sessions (tests/session_home.py); a
    fresh machine starts cold."""
    return (os.environ.get("CCACHE_DIR") or os.environ.get("ROCFORGE_TEST_CCACHE")
            or str(Path.home() / ".cache" / "ccache"))


@pytest.fixture(scope="session")
def llama_tree(tmp_path_factory):
    return tree(VERSION, tmp_path_factory.mktemp("llama-full"), full=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama-f16.gguf")


def build_llama(llama_tree: Path, backend: str, where: Path):
    from rocforge_build.forge import pipeline
    from rocforge_build.forge.plan import Request
    from rocforge_build.rootfs import Root

    req = Request(recipe="llama-cpp", target="gfx1151", backend=backend, source=str(llama_tree),
                  prefix=str(where / f"llama-{backend}"), jobs=JOBS, build_targets=TARGETS,
                  environ={**os.environ, "CCACHE_DIR": shared_ccache()})
    return pipeline.build(req, Root("/"))


@pytest.fixture(scope="session")
def llama_cpu_build(llama_tree, tmp_path_factory):
    """The pipeline's BuildResult of the session's one CPU build (status "built")."""
    return build_llama(llama_tree, "cpu", tmp_path_factory.mktemp("llama-cpu"))


WRONG_ON_DEMAND = Path(__file__).resolve().parent / "data" / "patches" / "llama-cpp-wrong" / "wrong-on-demand.patch"


@pytest.fixture(scope="session")
def measure_builds(tmp_path_factory):
    """(reference CPU prefix, wrong-on-demand prefix): the May 2025 tree's CPU backend built twice
    with the programs rocforge measures and serves (llama_tools.MEASURE_TARGETS: llama-bench,
    -perplexity, -cli, -server), the second with tests/data/patches/llama-cpp-wrong/ applied
    (ROCFORGE_TEST_WRONG picks a real fault at run time, none by default).  Built once per session
    and shared by every slow test that verifies, canaries or serves (each build is ~4 min cold on
    2 cores, ~1 min from the shared ccache)."""
    from measure_fixtures import recipe_variant

    from rocforge_build import cli
    from rocforge_build.measure.llama_tools import MEASURE_TARGETS

    where = tmp_path_factory.mktemp("measure-builds")
    src = tree("0.3.9", where / "src", full=True)
    targets = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CCACHE_DIR", shared_ccache())
        for name, recipe in (("cpu", "llama-cpp"), ("wrong", str(recipe_variant(where / "rw", patch=WRONG_ON_DEMAND)))):
            prefix = where / name
            code = cli.main(["build", recipe, "--target", "gfx1151", "--backend", "cpu", "--source", str(src),
                             *targets, "-j", str(JOBS), "--prefix", str(prefix)])
            assert code == 0
            out[name] = prefix
    return out["cpu"], out["wrong"]


@pytest.fixture(scope="module")
def verify_cache(tmp_path_factory) -> Path:
    """verify's own cache (the unpacked text and the reference's bases) for one test module."""
    return tmp_path_factory.mktemp("verify-cache")


@pytest.fixture
def shared_verify_cache(_isolated, verify_cache, monkeypatch):
    """conftest's autouse `_isolated` gives every test a fresh ROCFORGE_CACHE_DIR, which alone would
    make each test compute the CPU reference's runs again (minutes each): verify's cache
    (`verify.cache_dir()`) points at the module's one directory instead, the rest of the isolation
    kept.  It replaces a function, not an environment variable, so it does not depend on running
    after `_isolated` (it asks for it all the same)."""
    from rocforge_build.measure import verify

    monkeypatch.setattr(verify, "cache_dir", lambda: verify_cache)
