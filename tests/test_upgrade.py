"""`rocforge upgrade` and `rocforge rollback` on the fixture project's git history: real git,
cmake, ninja and the C compiler; the gate is a real checker program run by `--run`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from upgrade_history import history, output_checker, tree_hashes

from rocforge_build import cli


def hello(prefix: Path) -> list[str]:
    return subprocess.run([prefix / "bin" / "fixture-hello"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def built(tmp_path, capsys):
    h = history(tmp_path)
    prefix = tmp_path / "prefix"
    assert cli.main(["build", str(h.recipe), "--target", "gfx1151", "--prefix", str(prefix),
                     "--no-recheck"]) == 0
    capsys.readouterr()
    return h, prefix


def test_upgrade_refuses_a_bad_commit_then_accepts_a_good_one_and_rollback_restores(
        tmp_path, capsys):
    h, prefix = built(tmp_path, capsys)
    check = output_checker(tmp_path)
    assert "HELLO" in hello(prefix)
    original = tree_hashes(prefix)
    # the breaking commit builds and passes the smoke test; the user's checker fails it
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["break"], "--run", str(check),
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["status"] == "refused" and not report["upgraded"]
    assert [(g["gate"], g["verdict"]) for g in report["gates"]] == [
        ("build", "pass"), ("smoke", "pass"), ("run", "fail")]
    assert report["gates"][-1]["figures"] == {"exit_code": 1}  # the checker ran and said bad
    assert tree_hashes(prefix) == original  # byte for byte, modes and links too
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("prefix")) == ["prefix"]
    # a good commit passes every gate and is swapped in; the replaced build is kept
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["docs1"], "--run", str(check)])
    out = capsys.readouterr().out
    assert rc == 0 and "UPGRADED" in out
    assert "HELLO" in hello(prefix)
    assert tree_hashes(prefix) != original  # the new build (its manifest names the new commit)
    kept = Path(f"{prefix}.rocforge-previous")
    assert tree_hashes(kept) == original
    # rollback puts the original back, byte for byte; a second one goes forward again
    upgraded = tree_hashes(prefix)
    assert cli.main(["rollback", str(prefix)]) == 0
    assert tree_hashes(prefix) == original and tree_hashes(kept) == upgraded
    assert cli.main(["rollback", str(prefix)]) == 0
    assert tree_hashes(prefix) == upgraded and tree_hashes(kept) == original
    # every upgrade left a row of kind "upgrade" in the results store
    from rocforge_build.measure.store import Store

    with Store() as store:
        rows = list(store.rows(kind="upgrade"))
    assert [r.status for r in rows] == ["failed", "ok"]
    assert [r.data["status"] for r in rows] == ["refused", "upgraded"]


def test_upgrade_exit_125_is_cannot_test_and_refuses(tmp_path, capsys):
    h, prefix = built(tmp_path, capsys)
    original = tree_hashes(prefix)
    skip = tmp_path / "skip.sh"
    skip.write_text("#!/bin/sh\nexit 125\n")
    skip.chmod(0o755)
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["docs1"], "--run", str(skip),
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["gates"][-1]["verdict"] == "cannot test"
    assert report["gates"][-1]["figures"] == {"exit_code": 125}
    assert tree_hashes(prefix) == original


def test_bench_gate_pairs_rows_by_shape_and_fails_beyond_the_threshold():
    # rows as `rocforge bench --json` prints them (prefix, test, tokens, depth, ubatch, fa, t_s)
    from rocforge_build.build.upgrade import compare_rows

    cur, cand = Path("/b/cur"), Path("/b/cand")

    def row(prefix, test, t_s, status="ok"):
        return {"prefix": str(prefix), "test": test, "n_prompt": 512 if test == "pp" else 0,
                "n_gen": 128 if test == "tg" else 0, "depth": 0, "ubatch": None, "fa": True,
                "t_s": t_s, "status": status}

    rows = [row(cur, "pp", 1000.0), row(cur, "tg", 50.0), row(cand, "pp", 970.0),
            row(cand, "tg", 44.0)]
    gate = compare_rows(rows, cur, cand, 5.0)
    assert gate.verdict == "fail" and "tg128@d0" in gate.detail and "pp512" not in gate.detail
    assert gate.figures["pp512@d0 fa1"]["change_pct"] == -3.0
    assert compare_rows(rows, cur, cand, 15.0).verdict == "pass"
    # a failed row of the candidate is no figure: nothing to compare is a failure, not a pass
    failed = [row(cur, "pp", 1000.0), row(cand, "pp", 0.0, status="failed")]
    assert compare_rows(failed, cur, cand, 5.0).verdict == "fail"
