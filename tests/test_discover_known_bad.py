"""Known-bad nightlies (data/known_bad.toml): `nightly install` skips them unless pinned, and
`doctor` warns when the current nightly is one.

The entry under test is stated here with its evidence: 7.14.0a20260609 to 7.14.0a20260612
segfault at start-up on gfx1151/gfx1150 in libhsa-runtime64 GpuAgent::InitDma (ROCm/TheRock
#5763).  7.14.0a20260608 and 7.14.0a20260613 are not affected."""

from __future__ import annotations

import json

import fixtures_roots as fr
import pytest
from therock_tarballs import Mirror, make_tarball

from rocforge_build import cli
from rocforge_build.discover import known_bad

GOOD, BAD = "7.14.0a20260608", "7.14.0a20260612"


def test_the_table_says_what_the_issue_says():
    for version in ("7.14.0a20260609", "7.14.0a20260610", "7.14.0a20260611", "7.14.0a20260612"):
        bad = known_bad.find(version, "gfx1151")
        assert bad is not None and "#5763" in bad.evidence and "InitDma" in bad.symptom
        assert known_bad.find(version, "gfx1150") is not None
        assert known_bad.find(version, None, "gfx115X-all") is not None
    for version in (GOOD, "7.14.0a20260613", "7.14.0", "10.1.0a20261020"):
        assert known_bad.find(version, "gfx1151") is None
    assert known_bad.find(BAD, "gfx1100") is None  # other GPUs are not affected


@pytest.fixture
def site(http_server, tmp_path_factory, capsys):
    work = tmp_path_factory.mktemp("kb-tarballs")
    mirror = Mirror(http_server, "/tarball/")
    for i, version in enumerate((GOOD, BAD)):
        mirror.add_file(make_tarball(work, "gfx1151", version, ["gfx1151"]), 1781000000.0 + i)
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    capsys.readouterr()
    return mirror


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_install_skips_the_bad_newest_nightly(site, capsys, tmp_path):
    rc, out, err = _run(capsys, "nightly", "install", "--target", "gfx1151", "--prefix",
                        str(tmp_path / "rocm"), "--dry-run", "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert [layer["version"] for layer in plan["layers"]] == [GOOD]
    assert f"skipped {BAD} is a known-bad nightly" in plan["reason"]
    assert "ROCm/TheRock #5763" in plan["reason"]


def test_a_pinned_bad_nightly_is_installed_with_a_warning(site, capsys, tmp_path):
    rc, out, err = _run(capsys, "nightly", "install", "--target", "gfx1151", "--version", BAD,
                        "--prefix", str(tmp_path / "rocm"), "--no-progress")
    assert rc == 0, err
    assert "warning: 7.14.0a20260612 is a known-bad nightly" in err and "--version pins" in err
    assert (tmp_path / f"rocm/therock-{BAD}-gfx1151").is_dir()


def test_doctor_warns_when_current_is_known_bad(site, capsys, tmp_path, monkeypatch):
    root = tmp_path / "machine"
    fr.make_gpus(root, fr.STRIX_HALO)
    fr.make_system(root)
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(root / "home/alice/.local/share/rocforge"))
    rc, _out, err = _run(capsys, "--root", str(root), "nightly", "install", "--target", "gfx1151",
                         "--version", BAD, "--no-progress")
    assert rc == 0, err
    rc, out, err = _run(capsys, "--root", str(root), "doctor", "--json")
    data = json.loads(out)
    assert data["rocm"]["version"] == BAD and data["rocm"]["nightly_current"]
    warning = next(w for w in data["warnings"] if "known-bad" in w)
    assert "GpuAgent::InitDma" in warning and "#5763" in warning
    rc, _out, err = _run(capsys, "--root", str(root), "nightly", "install", "--target", "gfx1151",
                         "--version", GOOD, "--no-progress")
    assert rc == 0, err
    rc, out, err = _run(capsys, "--root", str(root), "doctor", "--json")
    assert not [w for w in json.loads(out)["warnings"] if "known-bad" in w]


def test_only_bad_nightlies_left_is_one_clear_error(http_server, tmp_path_factory, capsys,
                                                     tmp_path):
    work = tmp_path_factory.mktemp("kb-only-bad")
    mirror = Mirror(http_server, "/only-bad/")
    mirror.add_file(make_tarball(work, "gfx1151", BAD, ["gfx1151"]), 1781000000.0)
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    capsys.readouterr()
    rc, _out, err = _run(capsys, "nightly", "install", "--target", "gfx1151", "--prefix",
                         str(tmp_path / "rocm"), "--dry-run")
    assert rc != 0 and "Traceback" not in err
    assert "known-bad" in err and "--version" in err
