"""`rocforge build --dry-run` plans, byte for byte, against plans recorded before the package
was re-laid into subpackages (tests/data/plans/recorded.json, written by this module with
`ROCFORGE_RECORD_PLANS=1` from the code of commit 2d52181, the last flat layout).

A move must not change what a build does: every case here is a real plan (real llama.cpp trees of
three eras, the rocBLAS stack recipe over a monorepo stand-in with its hipBLASLt dependency, the
fixture recipe), and the JSON plan and the printed plan must be what they were.  Only what differs
between machines or runs is masked: temporary paths, the checkout's location, this Python, git
commit ids of the stand-ins made at test time, and the stamps and tree identities built from them.
A change that means to change plans re-records them; the diff of recorded.json is then the review.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path

import fixtures_roots as fr
import pytest
from buildfixtures import RECIPE, project_copy
from llama_trees import tree
from stackfixtures import REPO, monorepo, stack_recipes
from toolchain_fixtures import fake_vulkan_sdk, therock_root

from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.forge.plan_text import print_plan
from rocforge_build.rootfs import Root

RECORDED = Path(__file__).resolve().parent / "data" / "plans" / "recorded.json"
_MASKED_KEYS = ("stamp", "identity", "commit")
_SHA1 = re.compile(r"\b[0-9a-f]{40}\b")
_WORK = re.compile(r"(/work/)[0-9a-f]{12}\b")
_TREE = re.compile(r"\btree:[0-9a-f]{64}\b")
_HOME = re.compile(r"<tmp>/rocforge-home\d+")
_PRINTED_KEY = re.compile(r"(key +sha256:)[0-9a-f]{64}")  # the substitute key: see _mask
_CACHED_TREE = re.compile(r"(/sources/trees/)[0-9a-f]+-[0-9a-f]+\b")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Everything the cases need, made once: trees, roots, recipes, a PATH with a compiler cache."""
    base = tmp_path_factory.mktemp("plans")
    trees_base = Path(os.environ.get("ROCFORGE_TEST_SDISTS_TREES", base / "llama"))
    trees = {v: tree(v, trees_base) for v in ("0.2.70", "0.3.9", "0.3.36")}
    empty = base / "empty-root"
    (empty / "usr" / "include").mkdir(parents=True)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    ccache = bin_dir / "ccache"  # found on PATH first: the launcher the plans name (never run)
    ccache.write_text("#!/bin/sh\nexit 0\n")
    ccache.chmod(0o755)
    with_lt, without_lt = base / "with-hipblaslt", base / "without-hipblaslt"
    fr.make_therock_tree(with_lt, "7.10.0a20251021", ("gfx1151",))
    fr.make_therock_tree(without_lt, "7.10.0a20251021", ("gfx1151",), hipblaslt=())
    return {
        "base": base, "trees_base": trees_base, "trees": trees, "empty": Root(empty),
        "therock": therock_root(base), "with_lt": Root(with_lt), "without_lt": Root(without_lt),
        "stack": stack_recipes(base / "stack", monorepo(base / "rocm-libraries")),
        "fixture_src": project_copy(base / "fixture-src"),
        "vulkan_sdk": fake_vulkan_sdk(base / "vulkan-sdk", layer_settings=False),
        "environ": {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(base)},
    }


def _llama(version, root, backend=None, target="gfx1151", vulkan=False):
    def make(w):
        env = dict(w["environ"], **({"VULKAN_SDK": str(w["vulkan_sdk"])} if vulkan else {}))
        return Request(recipe="llama-cpp", target=target, backend=backend,
                                source=str(w["trees"][version]), environ=env), w[root]
    return make


def _rocblas(root, target="gfx1151"):
    def make(w):
        return Request(recipe=str(w["stack"] / "rocblas.toml"), target=target,
                                environ=w["environ"]), w[root]
    return make


def _fixture(target, backend=None, root="empty", **kw):
    def make(w):
        return Request(recipe=str(RECIPE), target=target, backend=backend, source=str(w["fixture_src"]),
                                environ=w["environ"], **kw), w[root]
    return make


CASES = {
    "llama-0.2.70-hip-no-rocm": _llama("0.2.70", "empty", "hip"),
    "llama-0.3.9-default-therock": _llama("0.3.9", "therock"),
    "llama-0.3.9-vulkan-sdk": _llama("0.3.9", "empty", "vulkan", vulkan=True),
    "llama-0.3.9-cpu-gfx1030": _llama("0.3.9", "empty", "cpu", target="gfx1030"),
    "llama-0.3.36-hip-therock": _llama("0.3.36", "therock", "hip"),
    "llama-0.3.36-hip-gfx1030-no-rocm": _llama("0.3.36", "empty", "hip", target="gfx1030"),
    "rocblas-gfx1151-no-rocm": _rocblas("empty"),
    "rocblas-gfx1151-rocm-without-hipblaslt": _rocblas("without_lt"),
    "rocblas-gfx1151-rocm-with-hipblaslt": _rocblas("with_lt"),
    "rocblas-gfx90a-no-rocm": _rocblas("empty", "gfx90a"),
    "fixture-gfx1151-default": _fixture("gfx1151"),
    "fixture-gfx1030-default": _fixture("gfx1030"),
    "fixture-gfx1151-hip-no-rocm": _fixture("gfx1151", "hip"),
    "fixture-gfx1100-build-target": _fixture("gfx1100", build_targets=("fixture-hello",), jobs=3,
                                             no_cache=True),
}


def _mask(value, key=None):
    if key == "substitute_key" and isinstance(value, dict) and "fields" in value:
        # its values are hashes of test-time trees and this machine's compilers (its own tests
        # are tests/test_forge_substitute_key.py): the plan is held to which fields it has
        return {"fields": sorted(value["fields"])}
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    if key in _MASKED_KEYS and value:
        return f"<{key}>"
    return value


def _normalize(text: str, w) -> str:
    for path, name in sorted(((str(w["trees_base"]), "<trees>"), (str(w["base"]), "<world>"),
                              (str(w["base"].parent), "<tmp>"),
                              (str(REPO), "<repo>"), (sys.executable, "<python>")),
                             key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    text = _TREE.sub("tree:<hash>", _SHA1.sub("<sha1>", text))
    text = _HOME.sub("<home>", text)  # the per-test home of conftest's isolation, numbered by order
    text = _PRINTED_KEY.sub(r"\1<key>", text)
    return _CACHED_TREE.sub(r"\1<hash>", _WORK.sub(r"\1<hash>", text))


def recorded_form(case: str, w) -> dict:
    req, root = CASES[case](w)
    plan = plan_for(req, root)
    printed = io.StringIO()
    print_plan(plan, printed)
    data = {"json": _mask(plan.to_json()), "printed": printed.getvalue()}
    return json.loads(_normalize(json.dumps(data, indent=1, sort_keys=True, default=str), w))


def test_record_or_compare_every_plan(world):
    now = {case: recorded_form(case, world) for case in CASES}
    if os.environ.get("ROCFORGE_RECORD_PLANS") == "1":  # re-record: nothing is compared
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"recorded {len(now)} plans into {RECORDED}; review its diff")
    before = json.loads(RECORDED.read_text())
    assert sorted(now) == sorted(before)
    for case in CASES:
        assert now[case]["printed"] == before[case]["printed"], case
        assert now[case]["json"] == before[case]["json"], case
