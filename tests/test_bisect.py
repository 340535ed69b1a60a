"""`rocforge bisect --run` on the fixture project's git history: real git, cmake, ninja, the C
compiler and a real checker program; each finds the commit the history says it should."""

from __future__ import annotations

import json

from upgrade_history import history, output_checker, timing_checker

from rocforge_build import cli
from rocforge_build.forge.bisect import max_builds


def bisect(h, good, bad, check, capsys, *extra):
    rc = cli.main(["bisect", str(h.recipe), "--target", "gfx1151", "--good", good, "--bad", bad,
                   "--run", str(check), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_bisect_finds_the_commit_that_breaks_the_output(tmp_path, capsys):
    h = history(tmp_path)
    c = h.commits
    rc, doc = bisect(h, c["docs2"], c["docs3"], output_checker(tmp_path), capsys)
    assert rc == 0 and doc["first_bad"] == c["break"]
    assert doc["candidates"] == 2 and doc["builds"] <= max_builds(2) == 2
    assert [(s["ref"], s["verdict"]) for s in doc["steps"]] == [(c["docs3"], "bad"),
                                                                (c["break"], "bad")]


def test_bisect_skips_a_step_that_cannot_be_tested(tmp_path, capsys):
    # exit 125 at the first middle (the slow commit): the search tests its neighbour instead
    h = history(tmp_path)
    c = h.commits
    check = tmp_path / "check.sh"
    check.write_text(f'#!/bin/sh\ncase "$ROCFORGE_PREFIX" in *{c["slow"][:12]}) exit 125;; esac\n'
                     '"$ROCFORGE_PREFIX/bin/fixture-hello" | grep -qx HELLO\n')
    check.chmod(0o755)
    rc, doc = bisect(h, c["docs1"], c["break"], check, capsys)
    assert rc == 0 and doc["first_bad"] == c["break"] and doc["candidates"] == 3
    assert [(s["ref"], s["verdict"]) for s in doc["steps"]] == [
        (c["break"], "bad"), (c["slow"], "skip"), (c["docs2"], "good")]


def test_bisect_finds_the_commit_that_slows_it_down_and_writes_the_report(tmp_path, capsys):
    h = history(tmp_path)
    c = h.commits
    report = tmp_path / "issue.md"
    rc, doc = bisect(h, c["docs1"], c["docs2"], timing_checker(tmp_path), capsys,
                     "--report", str(report))
    assert rc == 0 and doc["first_bad"] == c["slow"]
    assert doc["first_bad_subject"] == "slow: sleeps before greeting"
    assert doc["candidates"] == 2 and doc["builds"] <= max_builds(2)
    text = report.read_text()
    assert f"First bad commit: `{c['slow']}`" in text and "## Hardware and host" in text
    assert f"--good {c['docs1']}" in text and "gfx1151" in text
    # a second run finds every step's build up to date (the stamp) and may rewrite its report
    rc, again = bisect(h, c["docs1"], c["docs2"], timing_checker(tmp_path), capsys,
                       "--report", str(report))
    assert rc == 0 and again["first_bad"] == c["slow"] and again["builds"] == 0
