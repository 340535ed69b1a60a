"""Dry-run plans of the stack recipes against the real upstream trees (tests/upstream_trees.py:
git directories named by ROCFORGE_TEST_GIT_*, exported at test time; `nox -s integration` sets
them when it finds them, the tests skip otherwise).  Every option a plan passes that CMake does
not define itself must be declared by the real tree (option(), cmake_dependent_option() or
set(... CACHE ...)), found here by reading the tree's CMake files, not through rocforge.

What the snapshots declare (read from their CMakeLists.txt; commit dates in the test ids):
- ROCm/rocWMMA 2024-10-22: AMDGPU_TARGETS (set CACHE, l.116/118), no GPU_TARGETS; no ROCWMMA_ARCH_GFX1151;
- ROCm/hipBLASLt 2024-10-25: AMDGPU_TARGETS (l.176-181), no GPU_TARGETS, no HIPBLASLT_ENABLE_CLIENT;
- ROCm/rocBLAS 2024-10-23: GPU_TARGETS (l.169), BUILD_WITH_HIPBLASLT (l.172), Tensile_TEST_LOCAL_PATH;
- ROCm/aotriton 2026-08-19: AOTRITON_TARGET_ARCH, AOTRITON_GPU_BUILD_TIMEOUT, AOTRITON_NO_PYTHON, VENV_DIR.
"""

from __future__ import annotations

import fixtures_roots as fr
import pytest
import upstream_trees as up

from rocforge_build.forge import recipes
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.rootfs import Root

pytestmark = pytest.mark.slow
ENVIRON = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}

# recipe, target, the options the plan must pass (name -> value) for this era of the tree
CASES = {
    "rocwmma": ("gfx1100", {"AMDGPU_TARGETS": "gfx1100", "ROCWMMA_BUILD_TESTS": "OFF",
                            "ROCWMMA_BUILD_SAMPLES": "OFF"}),
    "hipblaslt": ("gfx1151", {"AMDGPU_TARGETS": "gfx1151", "HIPBLASLT_ENABLE_MARKER": "OFF"}),
    "rocblas": ("gfx1151", {"GPU_TARGETS": "gfx1151", "BUILD_WITH_HIPBLASLT": "ON"}),
    "aotriton": ("gfx1151", {"AOTRITON_TARGET_ARCH": "gfx1151", "AOTRITON_GPU_BUILD_TIMEOUT": "0",
                             "AOTRITON_NO_PYTHON": "ON"}),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("roots")
    (base / "empty" / "usr" / "include").mkdir(parents=True)
    # rocBLAS plans a hipBLASLt build first unless the ROCm has gfx1151 hipBLASLt kernels
    fr.make_therock_tree(base / "with-hipblaslt", "7.10.0a20251021", ("gfx1151",))
    return {"empty": Root(base / "empty"), "with-hipblaslt": Root(base / "with-hipblaslt")}


@pytest.mark.parametrize("name", list(CASES))
def test_every_passed_option_is_declared_by_the_real_tree(name, roots, tmp_path):
    target, expected = CASES[name]
    tree, missing = up.export(name, tmp_path / name)
    root = roots["with-hipblaslt" if name == "rocblas" else "empty"]
    plan = plan_for(Request(recipe=name, target=target, source=str(tree), environ=ENVIRON), root)
    passed = {o["name"]: o["value"] for o in plan.to_json()["options"]}
    assert {k: passed.get(k) for k in expected} == expected
    cmake_own = {r.get("name") for r in recipes.load(name).of("option") if r.get("declared") is False}
    checked = [n for n in passed if n not in cmake_own and not n.endswith("_COMPILER_LAUNCHER")]
    undeclared = {n: up.declarations(tree, n) for n in checked}
    assert all(undeclared.values()), {n: w for n, w in undeclared.items() if not w}
    assert not any(p.endswith(("CMakeLists.txt", ".cmake")) for p in missing), missing


def test_rocwmma_of_oct_2024_installs_for_gfx1151_only_with_a_loud_note(roots, tmp_path):
    """That rocWMMA has no ROCWMMA_ARCH_GFX1151: code instantiating it for gfx1151 stops with
    'Unsupported architecture'. rocforge still installs the headers (header-only: llama.cpp falls
    back to its gfx1151 stub, tests/e2e/test_rocwmma_stub_build.py) and says so loudly."""
    tree, _ = up.export("rocwmma", tmp_path / "rocwmma")
    config = (tree / "library/include/rocwmma/internal/config.hpp").read_text()
    assert "ROCWMMA_ARCH_GFX1100" in config and "ROCWMMA_ARCH_GFX1151" not in config
    plan = plan_for(Request(recipe="rocwmma", target="gfx1151", source=str(tree), environ=ENVIRON), roots["empty"])
    assert [n.split(":")[0] for n in plan.notes] == ["THIS rocWMMA DOES NOT KNOW THE TARGET"]
    # its CMakeLists.txt l.47 adds -parallel-jobs=4 and -Xclang -fallow-half-arguments-and-returns,
    # which upstream clang rejects: the patch must apply to the real file
    assert [(p.name, p.status) for p in plan.patch_status] == [
        ("upstream-clang-cxx-flags.patch", "would apply")]
    # a target it knows: no note
    plan = plan_for(Request(recipe="rocwmma", target="gfx1100", source=str(tree), environ=ENVIRON), roots["empty"])
    assert plan.notes == ()
