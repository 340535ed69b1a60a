"""discover/findings.py: what doctor finds on a host, gathered once, on fixture roots made from
real trees' layouts (fixtures_roots)."""

from __future__ import annotations

import fixtures_roots as fr

from rocforge_build.discover import findings, resolver
from rocforge_build.records import replace
from rocforge_build.rootfs import Root


def _resolved(tmp_path, **kw):
    root = Root(tmp_path)
    return root, resolver.resolve(root, **kw)


def _never(report):
    raise AssertionError("no store may be asked without a current nightly")


def test_a_usable_strix_halo_has_no_blockers_and_asks_no_store(tmp_path):
    fr.make_strix_halo(tmp_path)
    root, res = _resolved(tmp_path)
    found = findings.gather(root, res, _never)
    assert found.usable and found.blockers == ()
    # the fixture tree's one wrinkle: the broken amdclang++ link TheRock trees shipped
    assert found.warnings == ("/opt/rocm: /opt/rocm/bin/amdclang++ is a broken link (TheRock "
                              "trees before Mar 2026); using /opt/rocm/lib/llvm/bin",)


def test_a_missing_kfd_blocks_where_a_gpu_is_detected_and_only_warns_where_none_is(tmp_path):
    fr.make_strix_halo(tmp_path / "gpu")
    (tmp_path / "gpu/dev/kfd").unlink()
    found = findings.gather(*_resolved(tmp_path / "gpu"))
    assert not found.usable and found.blockers[0].startswith("/dev/kfd is missing")
    fr.make_debian_usr(tmp_path / "build-host")
    found = findings.gather(*_resolved(tmp_path / "build-host"))
    assert found.usable and found.warnings == (
        "/dev/kfd is missing: the amdgpu kernel driver is not loaded, or the container was started "
        "without --device=/dev/kfd --device=/dev/dri",)


def test_an_install_without_the_targets_kernels_is_one_blocker(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path)
    fr.make_therock_tree(tmp_path, targets=("gfx1201",))
    root, res = _resolved(tmp_path, target="gfx1151")
    found = findings.gather(root, res)
    assert len(found.blockers) == 1 and found.blockers[0].startswith("ROCm /opt/rocm has no kernels for gfx1151 (")
    rows = {r["target"]: r for r in findings.coverage_rows(res)}
    assert rows["gfx1151"]["kernels"] is False and rows["gfx1151"]["rocblas"] is False


def test_the_advisories_judge_a_current_nightly_and_a_stores_problem_is_a_warning(tmp_path):
    """A current nightly of the range the packaged table marks bad (ROCm/TheRock #5763): the
    finder the advisories give is the one asked, and what the store reported is a warning line."""
    fr.make_strix_halo(tmp_path, version="7.14.0a20260610")
    root, res = _resolved(tmp_path)
    current = replace(res, installs=tuple(replace(i, nightly_current=True) for i in res.installs))
    asked = []

    def advisories(report):
        report("https://store.example/v2: unreachable")

        def finder(version, gfx, family):
            asked.append((version, gfx))
            return None  # the stores know nothing against it

        return finder

    found = findings.gather(root, current, advisories)
    assert asked and asked[0][0] == "7.14.0a20260610"
    assert "nightly advisories: https://store.example/v2: unreachable" in found.warnings
    assert not any("known-bad" in w or "#5763" in w for w in found.warnings)  # this finder said nothing
    packaged = findings.gather(root, current)  # the packaged table alone knows the range
    assert any("GpuAgent::InitDma" in w for w in packaged.warnings)
