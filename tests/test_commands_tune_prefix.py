"""tune never rebuilds the user's build at the default prefix with its own plan (issue 38 item 4):
a build of another plan there is left byte for byte, and tune's own candidate goes under
`<builds>/tune/`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from upgrade_history import history, rocforge

from rocforge_build import paths
from rocforge_build.commands import tune as tune_cmd
from rocforge_build.discover.builds import read_manifest
from rocforge_build.rootfs import Root


def hashes(top: Path) -> dict[str, str]:
    """Every file below `top` (links by their target) with its sha256: the bytes, not the names."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def users_build(tmp_path):
    """The fixture project built by `rocforge build` at its default prefix (all its programs):
    (the recipe, the prefix, the backend build chose)."""
    h = history(tmp_path)
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--no-recheck")
    assert res.returncode == 0, res.stderr
    users = [p for p in paths.builds_prefix().iterdir() if p.name != "tune"]
    assert len(users) == 1, users
    return h.recipe, users[0], read_manifest(users[0])["backend"]


def tune_args(recipe, backend):
    return SimpleNamespace(recipe=str(recipe), backends=backend, target="gfx1151", source=None,
                           ref=None, jobs=None, rootfs=Root("/"), json=True)


@pytest.mark.parametrize("has_them", [True, False])
def test_tune_never_rebuilds_the_users_build(tmp_path, monkeypatch, has_them):
    """tune's plan builds only the measuring programs (here the fixture's fixture-hello, standing
    for llama-bench and llama-perplexity).  When the user's build has every program tune runs it is
    the candidate as it is; when it lacks one, tune builds its own at `<builds>/tune/<name>`.
    Either way every byte of the user's prefix is as it was (tune once rebuilt it with its plan)."""
    recipe, prefix, backend = users_build(tmp_path)
    before = hashes(prefix)
    monkeypatch.setattr(tune_cmd, "MEASURE_TARGETS", ("fixture-hello",))
    monkeypatch.setattr(tune_cmd, "TUNE_NEEDS", ("fixture-hello",) if has_them else ("llama-bench",))
    said = []
    builds, skipped = tune_cmd.candidates(tune_args(recipe, backend), said.append, [])
    assert skipped == [] and len(builds) == 1
    assert hashes(prefix) == before
    own = paths.builds_prefix() / "tune" / prefix.name
    if has_them:
        assert builds[0].prefix == prefix.resolve() and not own.exists()
    else:
        assert builds[0].prefix == own.resolve()
        assert (own / "bin" / "fixture-hello").is_file() and not (own / "bin" / "fixture-extra").exists()
        assert any(str(own) in line for line in said), said


