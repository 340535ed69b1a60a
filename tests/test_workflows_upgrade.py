"""workflows/upgrade.py's pieces around the gated rebuild (the rebuild itself and its gates are
walked in tests/e2e/test_upgrade.py): the environment `--rocm` and `--nightly` build with, and the
results-store run that records an upgrade."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocforge_build.errors import UsageError
from rocforge_build.measure.store import Store
from rocforge_build.workflows import upgrade


def test_rocm_environ_points_rocm_path_at_the_resolved_root_and_keeps_the_rest(tmp_path, monkeypatch):
    real = tmp_path / "rocm-7.10"
    real.mkdir()
    (tmp_path / "rocm").symlink_to(real)
    monkeypatch.setenv("ROCM_PATH", "/opt/rocm-old")
    monkeypatch.setenv("ROCFORGE_KEPT", "yes")
    env = upgrade.rocm_environ(str(tmp_path / "rocm"))
    assert env["ROCM_PATH"] == str(real) and env["ROCFORGE_KEPT"] == "yes"
    assert os.environ["ROCM_PATH"] == "/opt/rocm-old"  # this process's own is left as it is
    assert upgrade.rocm_environ() is None
    with pytest.raises(UsageError, match=r"--rocm .*/nowhere is not a directory"):
        upgrade.rocm_environ(str(tmp_path / "nowhere"))


def test_a_nightly_not_installed_is_refused_before_anything_is_built():
    with pytest.raises(UsageError, match="7.14.0a20260612 is not installed in "):
        upgrade.rocm_environ(nightly="7.14.0a20260612")


def _outcome(status: str) -> upgrade.Outcome:
    gates = [upgrade.Gate("build", "pass"), upgrade.Gate("run", "fail" if status == "refused" else "pass", "exit 1")]
    return upgrade.Outcome(Path("/builds/llama"), status, gates, {"stamp": "old"},
                           {"stamp": "new"} if status == "upgraded" else {})


@pytest.mark.parametrize("status, row_status", [("upgraded", "ok"), ("refused", "failed")])
def test_recorded_stores_one_run_with_the_outcome_as_its_row(tmp_path, monkeypatch, status, row_status):
    monkeypatch.setattr(upgrade, "upgrade", lambda *a, **k: _outcome(status))
    run_id, out = upgrade.recorded(Path("/builds/llama"), None, None, argv=["rocforge", "upgrade", "/builds/llama"])
    assert out.status == status
    with Store() as store:
        info = store.run_info(run_id)
        assert info["kind"] == "upgrade" and info["status"] == status
        assert info["argv"] == ["rocforge", "upgrade", "/builds/llama"]
        (row,) = store.rows(run_id=run_id)
        assert row.status == row_status and row.data["gates"][1]["verdict"] == ("fail" if status == "refused" else "pass")
        assert row.data["stamp"] == ("new" if status == "upgraded" else None)


def test_a_run_that_raises_is_recorded_as_failed(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(upgrade, "upgrade", interrupted)
    with pytest.raises(KeyboardInterrupt):
        upgrade.recorded(Path("/builds/llama"), None, None, argv=None)
    with Store() as store:
        assert [r["status"] for r in store.runs()] == ["failed"]
