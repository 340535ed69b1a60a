"""`rocforge bisect --run` (and `--bench`, with a llama-bench the tree compiles) on the fixture
project's git history: real git, cmake, ninja, the C compiler and a real checker program; each
finds the commit the history says it should."""

from __future__ import annotations

import json
from pathlib import Path

from upgrade_history import history, output_checker, timing_checker

from rocforge_build import cli
from rocforge_build.workflows.bisect import max_builds


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


# a llama-bench as `rocforge bench` reads it (`-o jsonl` result lines for the -p and -n it is
# given; its --help lists -d), compiled from the fixture tree: its pp figure is PP_TS t/s
FAKE_LLAMA_BENCH = r"""#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    long p = 512, n = 128;
    if (argc > 1 && strcmp(argv[1], "--help") == 0) {
        printf("usage: llama-bench [options]\n  -d, --n-depth <n>   depths\n");
        return 0;
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "-p") == 0) p = atol(argv[++i]);
        else if (strcmp(argv[i], "-n") == 0) n = atol(argv[++i]);
    }
    if (p > 0)
        printf("{\"n_prompt\": %ld, \"n_gen\": 0, \"n_depth\": 0, \"avg_ts\": PP_TS, \"stddev_ts\": 1.0}\n", p);
    if (n > 0)
        printf("{\"n_prompt\": 0, \"n_gen\": %ld, \"n_depth\": 0, \"avg_ts\": 50.0, \"stddev_ts\": 0.1}\n", n);
    return 0;
}
"""


def test_bisect_bench_finds_the_commit_that_slows_llama_bench(tmp_path, capsys):
    # the fixture history gains a llama-bench target (1000 t/s pp), a harmless commit, one that
    # makes it 20 % slower (800 t/s) and another harmless one; `bisect --bench GGUF --metric
    # pp512` builds the good ref (the baseline) and each step's llama-bench target only, runs
    # `rocforge bench` on each, and names the slow commit
    from buildfixtures import git
    from tiny_gguf import write as write_gguf

    h = history(tmp_path)
    repo = h.repo

    def commit(message: str) -> str:
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", message, cwd=repo)
        return git("rev-parse", "HEAD", cwd=repo)

    (repo / "llama-bench.c").write_text(FAKE_LLAMA_BENCH.replace("PP_TS", "1000.0"))
    with open(repo / "CMakeLists.txt", "a") as f:
        f.write("\nadd_executable(llama-bench llama-bench.c)\ninstall(TARGETS llama-bench)\n")
    good = commit("a llama-bench")
    (repo / "NOTES").write_text("bench notes\n")
    harmless = commit("docs 4")
    (repo / "llama-bench.c").write_text(FAKE_LLAMA_BENCH.replace("PP_TS", "800.0"))
    slow = commit("llama-bench: 20 % slower")
    (repo / "NOTES").write_text("bench notes\nmore\n")
    bad = commit("docs 5")
    model = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)

    rc = cli.main(["bisect", str(h.recipe), "--target", "gfx1151", "--backend", "cpu", "--good",
                   good, "--bad", bad, "--bench", str(model), "--metric", "pp512", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["first_bad"] == slow and doc["first_bad_subject"] == "llama-bench: 20 % slower"
    assert doc["candidates"] == 3 and doc["builds"] <= max_builds(3) == 3
    steps = {s["ref"]: s for s in doc["steps"]}
    assert steps[bad]["verdict"] == "bad" and steps[slow]["verdict"] == "bad"
    assert steps[slow]["figures"] == {"pp512": 800.0, "change_pct": -20.0}
    assert "against the good ref's 1000.00" in steps[slow]["detail"]
    assert harmless not in steps or steps[harmless]["verdict"] == "good"
    assert doc["test"] == f"--bench {model} --metric pp512"
    # each step built llama-bench alone (the recipe's smoke program is not among the targets)
    for s in doc["steps"]:
        assert sorted(p.name for p in (Path(s["prefix"]) / "bin").iterdir()) == ["llama-bench"]


def test_bisect_follows_the_first_parent_past_a_merge(tmp_path, capsys):
    """A side branch that breaks the output, merged: the candidates are the first-parent commits
    (git bisect --first-parent), so the merge is the first bad one and no step builds a commit of
    the side branch."""
    from buildfixtures import git
    from upgrade_history import _commit

    h = history(tmp_path)
    c, repo = h.commits, h.repo
    git("checkout", "-q", "-b", "side", c["docs2"], cwd=repo)
    greet = repo / "greet.c"
    greet.write_text(greet.read_text().replace("toupper", "tolower"))
    side_break = _commit(repo, "side: lower case")
    (repo / "SIDE").write_text("side\n")
    side_docs = _commit(repo, "side: docs")
    git("checkout", "-q", "-B", "trunk", c["docs2"], cwd=repo)
    (repo / "TRUNK").write_text("trunk\n")
    trunk_docs = _commit(repo, "trunk: docs")
    git("merge", "-q", "--no-ff", "-m", "merge side", "side", cwd=repo)
    merge = git("rev-parse", "HEAD", cwd=repo)
    (repo / "TRUNK").write_text("trunk\nafter\n")
    after = _commit(repo, "trunk: after the merge")
    rc, doc = bisect(h, c["docs2"], after, output_checker(tmp_path), capsys)
    assert rc == 0 and doc["first_bad"] == merge
    assert doc["candidates"] == 3  # trunk docs, the merge, after: not the side's two commits
    assert not {s["ref"] for s in doc["steps"]} & {side_break, side_docs}
    assert doc["builds"] <= max_builds(3)
    assert {s["ref"] for s in doc["steps"]} <= {trunk_docs, merge, after}
