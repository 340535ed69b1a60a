"""workflows/bisect_report.py for a given result, with no build: the `--json` document, the report's
text line by line, and the rule that a report is written only over a file rocforge wrote."""

from __future__ import annotations

import platform

import pytest
from stackfixtures import make_build

from rocforge_build.errors import UsageError
from rocforge_build.rootfs import Root
from rocforge_build.workflows import bisect_report
from rocforge_build.workflows.bisect import Asked, Result, Step, StepTest

A, B, C = "a" * 40, "b" * 40, "c" * 40


def git_bisect(**kw) -> Asked:
    return Asked(**{"recipe": "llama-cpp", "target": "gfx1151", "backend": "hip", "axis": "git",
                    "source": "https://example.org/repo.git", "good": "v1.0", "bad": "main", "listed": None,
                    "test": StepTest(run="./check.sh --fast"), **kw})


def git_result() -> Result:
    # three commits after v1.0; the last (C) tested bad first, then B good: C is the first bad
    steps = [Step(C, "bad", "exit 1 | wrong", built=True), Step(B, "good", "exit 0", built=True)]
    return Result([A, B, C], {A: "docs", B: "refactor", C: "break | the output"}, steps, C, [C])


def test_the_json_document_names_the_bisect_as_asked_and_its_steps():
    doc = bisect_report.to_json(git_bisect(), "https://example.org/repo.git", "f" * 40, git_result())
    assert doc == {"recipe": "llama-cpp", "target": "gfx1151", "backend": "hip", "axis": "git",
                   "source": "https://example.org/repo.git", "good": "v1.0", "bad": "main", "candidates": 3,
                   "first_bad": C, "first_bad_subject": "break | the output", "suspects": [C], "builds": 2,
                   "steps": [{"ref": C, "verdict": "bad", "detail": "exit 1 | wrong", "figures": {},
                              "built": True, "prefix": ""},
                             {"ref": B, "verdict": "good", "detail": "exit 0", "figures": {}, "built": True,
                              "prefix": ""}],
                   "test": "--run './check.sh --fast'"}


def test_on_a_version_axis_good_and_bad_are_the_versions_the_list_gave():
    # --versions given without --good/--bad: the first version is good, the last bad
    asked = git_bisect(axis="versions", good=None, bad=None, listed="0.1,0.2,0.3",
                       source="https://e.org/p-{version}.tar.gz", test=StepTest(verify="/m.gguf"))
    r = Result(["0.2", "0.3"], {}, [Step("0.3", "bad"), Step("0.2", "skip")], None, ["0.2", "0.3"])
    doc = bisect_report.to_json(asked, "https://e.org/p-{version}.tar.gz", "0.1", r)
    assert (doc["good"], doc["bad"], doc["first_bad"], doc["suspects"]) == ("0.1", "0.3", None, ["0.2", "0.3"])
    assert bisect_report.axis_words(asked, "0.1", r) == (
        "--versions 0.1,0.2,0.3 --good 0.1 --bad 0.3 --source 'https://e.org/p-{version}.tar.gz'")


def test_the_report_says_what_regressed_where_on_what_and_how_to_find_it_again():
    host = {"kernel": "6.14.0", "gpus": [{"kind": "igpu"}]}
    manifest = {"backend": "hip", "toolchain": {"kind": "hip", "rocm_path": "/opt/rocm", "clang": {"v": 1}},
                "flags": {"configure": ["cmake", "-DX=a b"]}}
    text = bisect_report.report_text(git_bisect(), "https://example.org/repo.git", "f" * 40, git_result(),
                                     host, manifest)
    assert text == "\n".join([
        "<!-- written by rocforge bisect; edit freely, rocforge may overwrite this file -->", "",
        "# Regression in cccccccccccc: break | the output", "",
        f"First bad commit: `{C}`  ",
        "Good: `v1.0`, bad: `main` (3 first-parent commits, 2 builds)  ",
        "Repository: https://example.org/repo.git", "",
        "## Hardware and host", "", "- target: gfx1151", f"- platform: {platform.platform()}",
        '- gpus: [{"kind": "igpu"}]', '- kernel: "6.14.0"', "",
        "## ROCm and toolchain", "",
        "- kind: hip", "- rocm_path: /opt/rocm",  # a nested table (clang) is left out
        "- backend: hip", "",
        "## How it was found", "", "```sh",
        "rocforge bisect llama-cpp --target gfx1151 --good v1.0 --bad main --source "
        "https://example.org/repo.git --backend hip --run './check.sh --fast'",
        "```", "",
        "| commit | verdict | detail | subject |", "|---|---|---|---|",
        # a | inside a cell would end it: written as /
        "| `cccccccccccc` | bad | exit 1 / wrong | break / the output |",
        "| `bbbbbbbbbbbb` | good | exit 0 | refactor |", "",
        "Configure line of the builds:", "", "```sh", "cmake '-DX=a b'", "```", ""])


def test_skips_that_leave_suspects_title_the_range_and_name_them():
    asked = git_bisect(axis="nightlies", good=None, bad=None, listed="7.10.0a1,7.10.0a2,7.10.0a3",
                       source=None, backend=None)
    r = Result(["7.10.0a2", "7.10.0a3"], {}, [Step("7.10.0a3", "bad"), Step("7.10.0a2", "skip")], None,
               ["7.10.0a2", "7.10.0a3"])
    lines = bisect_report.report_text(asked, "llama-cpp", "7.10.0a1", r, {}, {}).splitlines()
    assert lines[2] == "# Regression between 7.10.0a1 and 7.10.0a3"
    assert lines[4] == "First bad nightly: `one of 7.10.0a2, 7.10.0a3`  "
    assert lines[5] == "Good: `7.10.0a1`, bad: `7.10.0a3` (2 TheRock nightlies, 0 builds)  "
    assert lines[6] == "Source: llama-cpp"
    assert "- backend: default" in lines  # no --backend and no manifest: the recipe's choice
    assert "| nightly | verdict | detail | what |" in lines


def test_the_report_is_written_only_over_a_file_rocforge_wrote(tmp_path):
    # the manifest shown is the latest step's that has one (the last step has no build)
    older = make_build(tmp_path / "one", "llama-cpp", "gfx1151", "hip")
    newer = make_build(tmp_path / "two", "llama-cpp", "gfx1151", "cpu")
    r = Result([A, B, C], {}, [Step(C, "bad", prefix=str(older)), Step(B, "good", prefix=str(newer)),
                               Step(A, "skip", "build failed")], C, [C])
    assert bisect_report.step_manifest(r)["backend"] == "cpu"
    mine = tmp_path / "notes.md"
    mine.write_text("# my notes\n")
    with pytest.raises(UsageError):
        bisect_report.write_report(mine, git_bisect(), "loc", "f" * 40, r, Root(tmp_path))
    assert mine.read_text() == "# my notes\n"  # the user's file is untouched
    ours = tmp_path / "report.md"
    ours.write_text(bisect_report.REPORT_MARK + " an older report -->\n")
    bisect_report.write_report(ours, git_bisect(), "loc", "f" * 40, r, Root(tmp_path))
    text = ours.read_text()
    assert text.startswith(bisect_report.REPORT_MARK) and "an older report" not in text
    assert "- backend: cpu" in text.splitlines() and "- kind: host" in text.splitlines()
