"""workflows/bisect.py's pieces that need no build: the test each step gets (`oracle`), a nightly
step's check that it was built with that nightly's ROCm, and the test's command-line words.
The search and the axes, with real builds, are in test_bisect.py, test_bisect_versions.py and
test_bisect_nightlies.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomlkit
from stackfixtures import make_build

from rocforge_build.errors import UsageError
from rocforge_build.workflows import bisect
from rocforge_build.workflows.bisect import StepTest

# --run's program: exit 0 for a prefix ending in /ok, 125 (skip) for /skip, 1 otherwise
CHECK = ["/bin/sh", "-c", 'case "$ROCFORGE_PREFIX" in */ok) exit 0;; */skip) exit 125;; *) exit 1;; esac']


class Builds:
    """The oracle's `build`: records each candidate asked for; fails those in `failing`."""

    def __init__(self, failing: dict[str, str] | None = None):
        self.asked = []
        self.failing = failing or {}

    def __call__(self, key: str) -> tuple[bool, str | None]:
        self.asked.append(key)
        return True, self.failing.get(key)


def prefix_of(key: str) -> Path:
    return Path("/bisect/steps") / f"step-{key}"


def oracle(test: StepTest, builds: Builds, *, argv=None, good="0.1", good_given=None, model=None):
    return bisect.oracle(test, argv, good, good_given, model, 5.0, None, builds, prefix_of)


def test_run_tests_each_step_with_the_program_and_builds_nothing_first():
    builds = Builds()
    check = oracle(StepTest(run="check"), builds, argv=CHECK)
    assert builds.asked == []  # --run needs no reference: the good ref is not built first
    # git bisect run's exit codes: 0 good, 125 skip, anything else bad
    assert [check(Path(f"/steps/{p}")).verdict for p in ("ok", "skip", "other")] == ["good", "skip", "bad"]
    step = check(Path("/steps/other"))
    assert step.detail.endswith("exited 1") and step.figures == {"exit_code": 1}


def test_a_good_ref_that_does_not_build_is_one_line_naming_it_as_given():
    # with --bench (and --verify without --reference) the good ref is built first; its failure
    # ends the bisect, naming --good as the user typed it, else the resolved good candidate
    builds = Builds({"a" * 40: "cmake failed"})
    with pytest.raises(UsageError) as got:
        oracle(StepTest(bench="m.gguf", metric="pp512"), builds, good="a" * 40, good_given="v1.0")
    assert got.value.message == "--good v1.0 does not build: cmake failed"
    assert builds.asked == ["a" * 40]
    with pytest.raises(UsageError) as got:
        oracle(StepTest(verify="m.gguf"), Builds({"0.1": "no compiler"}), good="0.1")
    assert got.value.message == "--good 0.1 does not build: no compiler"


def test_verify_compares_with_reference_when_given_else_with_the_good_build(tmp_path):
    # the detail of a step names the reference it was compared with; a step prefix that does not
    # exist makes `rocforge verify` refuse (exit 2), which is a skip, not a verdict
    model = str(tmp_path / "m.gguf")
    given = Builds()
    check = oracle(StepTest(verify=model, reference=str(tmp_path / "ref-build")), given, model=model)
    assert given.asked == []  # --reference: nothing built first
    step = check(tmp_path / "no-such-step")
    assert (step.verdict, step.detail) == ("skip", "`rocforge verify` against ref-build exited 2")
    good_first = Builds()
    check = oracle(StepTest(verify=model), good_first, model=model)
    assert good_first.asked == ["0.1"]
    assert check(tmp_path / "no-such-step").detail == "`rocforge verify` against step-0.1 exited 2"


def test_bench_without_a_figure_from_the_good_build_is_refused(tmp_path):
    # the good ref's build (here a prefix that does not exist) gives no pp512 figure: there is
    # no baseline to compare the steps with, so the bisect stops before the search
    builds = Builds()
    with pytest.raises(UsageError) as got:
        oracle(StepTest(bench="m.gguf", metric="tg128"), builds, good_given="v1", model=str(tmp_path / "m"))
    assert got.value.message == "--good v1 gave no tg128 figure"
    assert builds.asked == ["0.1"]


def with_toolchain(prefix: Path, toolchain: dict) -> Path:
    doc = tomlkit.parse((prefix / "rocforge-manifest.toml").read_text())
    doc["toolchain"] = toolchain
    (prefix / "rocforge-manifest.toml").write_text(tomlkit.dumps(doc))
    return prefix


def test_a_nightly_step_must_be_built_with_that_nightlys_rocm(tmp_path):
    nightly = tmp_path / "nightlies" / "7.10.0a20251101"
    nightly.mkdir(parents=True)
    (tmp_path / "current").symlink_to(nightly)  # the same tree by another name is the same ROCm
    built = with_toolchain(make_build(tmp_path / "a", "llama-cpp", "gfx1151", "hip"),
                           {"kind": "hip", "rocm_path": str(tmp_path / "current")})
    bisect.check_uses_rocm(built, str(nightly))
    other = with_toolchain(make_build(tmp_path / "b", "llama-cpp", "gfx1151", "hip"),
                           {"kind": "hip", "rocm_path": "/opt/rocm"})
    host = make_build(tmp_path / "c", "llama-cpp", "gfx1151", "cpu")  # the host toolchain: no ROCm
    for prefix, kind in ((other, "hip"), (host, "host")):
        with pytest.raises(UsageError) as got:
            bisect.check_uses_rocm(prefix, str(nightly))
        assert got.value.message == (f"--nightlies: the build at {prefix} does not use the nightly's ROCm "
                                     f"(its toolchain is {kind}), so every step would be the same build")


@pytest.mark.parametrize("test, words", [
    (StepTest(run="./check.sh --fast"), "--run './check.sh --fast'"),
    (StepTest(verify="/m/a b.gguf"), "--verify '/m/a b.gguf'"),
    (StepTest(verify="/m/a.gguf", reference="/builds/ref"), "--verify /m/a.gguf --reference /builds/ref"),
    (StepTest(bench="/m/a.gguf", metric="pp512"), "--bench /m/a.gguf --metric pp512"),
    (StepTest(bench="/m/a.gguf", metric="tg128", threshold=7.5), "--bench /m/a.gguf --metric tg128 --threshold 7.5"),
])
def test_the_step_test_in_command_line_words(test, words):
    # quoted for a POSIX shell: the report's reproduction line is pasted into one
    assert test.words() == words


def test_a_steps_run_test_sees_the_steps_environment_not_this_processs(tmp_path, monkeypatch):
    # a nightly step is built with ROCM_PATH set to that nightly's tree in its request only; its
    # --run check runs under that request's environment, not under this process's ROCM_PATH
    monkeypatch.setenv("ROCM_PATH", "/opt/old-rocm")
    probe = ["/bin/sh", "-c", 'test "$ROCM_PATH" = /opt/nightly-rocm && test -z "$ONLY_HERE"']
    monkeypatch.setenv("ONLY_HERE", "1")
    check = oracle(StepTest(run="probe"), Builds(), argv=probe)
    step_env = {"PATH": "/usr/bin:/bin", "ROCM_PATH": "/opt/nightly-rocm"}
    assert check(tmp_path, step_env).verdict == "good"
    assert check(tmp_path).verdict == "bad"  # no request environment: this process's (the old tree)


def nightly_axis(tmp_path: Path) -> bisect.Axis:
    """Two nightlies already installed (nothing to download), the fixture recipe's fixed source."""
    from rocforge_build.nightly.axis import Nightlies

    trees = {v: tmp_path / "nightlies" / f"therock-{v}-gfx1151" for v in ("7.10.0a1", "7.10.0a2")}
    nightlies = Nightlies(tmp_path / "nightlies", "gfx1151", {}, installed=dict(trees))
    return bisect.Axis("src", "7.10.0a1", ["7.10.0a2"], {}, {v: f"nightly-{v}" for v in trees},
                       {v: ("/src/fixture", None) for v in trees}, "nightlies", nightlies)


def bisection(axis: str, test: StepTest) -> bisect.Bisection:
    from rocforge_build.rootfs import Root

    asked = bisect.Asked(recipe="fixture", target="gfx1151", backend="hip", axis=axis, source=None,
                         good=None, bad=None, listed=None, test=test)
    return bisect.Bisection(asked=asked, good=None, listed=None, rootfs=Root("/"), root_arg=None,
                            jobs=3, run_argv=None, model=None, pct=5.0)


def test_a_nightly_candidate_builds_with_its_own_nightlys_rocm_not_this_processs(tmp_path, monkeypatch):
    # each nightly step's request carries that nightly's tree as ROCM_PATH (the build and its
    # test run with it), whatever this process's ROCM_PATH is; the rest of the environment is kept
    monkeypatch.setenv("ROCM_PATH", "/opt/old-rocm")
    monkeypatch.setenv("ROCFORGE_KEPT", "1")
    ax = nightly_axis(tmp_path)
    b = bisection("nightlies", StepTest(verify="m.gguf"))
    for version in ("7.10.0a1", "7.10.0a2"):
        c = bisect.candidate(b, "fixture", ax, version)
        tree = str(tmp_path / "nightlies" / f"therock-{version}-gfx1151")
        assert c.rocm == tree and c.request.environ["ROCM_PATH"] == tree
        assert c.request.environ["ROCFORGE_KEPT"] == "1"
        assert c.prefix == bisect.step_prefix("fixture", "gfx1151", "hip", f"nightly-{version}")
        assert (c.request.source, c.request.ref, c.request.jobs) == ("/src/fixture", None, 3)
        assert c.request.made_for == "bisect"
        assert c.request.build_targets == ("llama-perplexity",)  # verify's program, no other


def test_a_git_candidate_builds_with_this_processs_environment_at_its_commit(tmp_path, monkeypatch):
    # no nightly: no ROCm of its own to check, the process's ROCM_PATH as it is, its commit as ref
    monkeypatch.setenv("ROCM_PATH", "/opt/rocm-7")
    sha = "b" * 40
    ax = bisect.Axis("/src/repo", "a" * 40, [sha], {sha: "subject"}, {sha: sha[:12]},
                     {sha: ("/src/repo", sha)}, "commits")
    c = bisect.candidate(bisection("git", StepTest(bench="m.gguf", metric="pp512")), "fixture", ax, sha)
    assert c.rocm is None and c.request.environ["ROCM_PATH"] == "/opt/rocm-7"
    assert (c.request.source, c.request.ref) == ("/src/repo", sha)
    assert c.prefix.name == sha[:12] and c.request.build_targets == ("llama-bench",)


@pytest.mark.parametrize("test, programs", [
    (StepTest(run="./check.sh"), ()),  # the user's program may run anything the build installs
    (StepTest(verify="m.gguf"), ("llama-perplexity",)),
    (StepTest(bench="m.gguf", metric="tg128"), ("llama-bench",)),
])
def test_each_step_builds_what_its_test_runs(test, programs):
    assert test.programs == programs
