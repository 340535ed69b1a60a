"""`rocforge bisect --run` on the fixture project's git history: real git, cmake, ninja, the C
compiler and a real checker program; each finds the commit the history says it should."""

from __future__ import annotations

import json

from upgrade_history import history, output_checker, timing_checker

from rocforge_build import cli
from rocforge_build.build.bisect import max_builds


def bisect(h, good, bad, check, capsys, *extra):
    rc = cli.main(["bisect", str(h.recipe), "--target", "gfx1151", "--good", good, "--bad", bad,
                   "--run", str(check), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_bisect_finds_the_commit_that_breaks_the_output(tmp_path, capsys):
    h = history(tmp_path)
    c = h.commits
    rc, doc = bisect(h, c["docs1"], c["docs3"], output_checker(tmp_path), capsys)
    assert rc == 0 and doc["first_bad"] == c["break"]
    assert doc["candidates"] == 4 and doc["builds"] <= max_builds(4) == 3
    assert doc["steps"][0]["ref"] == c["docs3"] and doc["steps"][0]["verdict"] == "bad"
    verdicts = {s["ref"]: s["verdict"] for s in doc["steps"]}
    assert all(v == ("bad" if ref in (c["break"], c["docs3"]) else "good")
               for ref, v in verdicts.items())


def test_bisect_finds_the_commit_that_slows_it_down_and_writes_the_report(tmp_path, capsys):
    h = history(tmp_path)
    c = h.commits
    report = tmp_path / "issue.md"
    rc, doc = bisect(h, "v1.2.0", c["docs2"], timing_checker(tmp_path), capsys,
                     "--report", str(report))
    assert rc == 0 and doc["first_bad"] == c["slow"]
    assert doc["first_bad_subject"] == "slow: sleeps before greeting"
    assert doc["builds"] <= max_builds(3)
    text = report.read_text()
    assert f"First bad commit: `{c['slow']}`" in text and "## Hardware and host" in text
    assert "--good v1.2.0" in text and "gfx1151" in text
    # a second run finds every step's build up to date (the stamp) and may rewrite its report
    rc, again = bisect(h, "v1.2.0", c["docs2"], timing_checker(tmp_path), capsys,
                       "--report", str(report))
    assert rc == 0 and again["first_bad"] == c["slow"] and again["builds"] == 0
