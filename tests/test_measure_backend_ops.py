"""verify's backend-ops stage (rocforge_build/measure/backend_ops.py): the output of a real
test-backend-ops run parsed (tests/data/backend_ops/, each file says where it came from), and a
FAKE test-backend-ops (tests/data/backend_ops/fake-test-backend-ops, a Python script) for what the
real program cannot be made to do on demand: crash mid-op, crash after a finished case, hang,
exit without its summary.  Fast: seconds (the hang test waits its 2 s timeout)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from rocforge_build.measure import backend_ops

DATA = Path(__file__).resolve().parent / "data" / "backend_ops"
FAKE = DATA / "fake-test-backend-ops"


def _clean_lines(name: str) -> list[str]:
    return [backend_ops._clean(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


def _prefix(tmp_path: Path, extra: bytes = b"") -> Path:
    """A build prefix whose libexec/ holds the fake (with `extra` appended as a comment)."""
    prefix = tmp_path / "prefix"
    (prefix / "libexec").mkdir(parents=True)
    tool = prefix / "libexec" / "test-backend-ops"
    shutil.copy(FAKE, tool)
    if extra:
        with tool.open("ab") as fh:
            fh.write(b"\n# " + extra + b"\n")
    return prefix


def test_real_cpu_run_of_the_0_3_9_tree_parses_every_case():
    """A real 0.3.9 run on its CPU backend (-b CPU -o MUL_MAT): 533 cases OK and 180 not
    supported (the README's count of the file's lines), no failure."""
    parsed = backend_ops.parse(_clean_lines("real-0.3.9-cpu-MUL_MAT.txt"))
    assert parsed.backends == ["CPU"] and parsed.summary == "1/1 backends passed"
    assert (parsed.ok, parsed.not_supported, parsed.failed) == (533, 180, {})
    assert parsed.ops == {"MUL_MAT"} and parsed.running is None


def test_real_vulkan_run_counts_what_the_program_counts():
    """A real full run of a 0.3.9 Vulkan build on an H200: the program's own `5519/5519 tests
    passed` is every case (no -o), so OK + not supported must be 5519."""
    lines = gzip.open(DATA / "real-0.3.9-vulkan-h200-full.txt.gz", "rt", encoding="utf-8").read().splitlines()
    parsed = backend_ops.parse([backend_ops._clean(line) for line in lines])
    assert parsed.tests_passed == ["5519/5519"] and parsed.summary == "2/2 backends passed"
    assert parsed.ok + parsed.not_supported == 5519 and not parsed.failed
    assert parsed.backends == ["Vulkan0", "CPU"] and {"MUL_MAT", "SOFT_MAX", "ROPE"} <= parsed.ops
    # every FLASH_ATTN_EXT case of this build says "not supported [Vulkan0]" (no coopmat2 here):
    # an op none of whose cases ran is not an op tested
    assert "FLASH_ATTN_EXT" not in parsed.ops


def test_a_real_run_cut_short_is_named_by_its_unfinished_case(tmp_path):
    """The real output of a run stopped at 120 s (cold shader cache), replayed by the fake, which
    then never ends: the stage stops it at its timeout and names the case it was running."""
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="vulkan", timeout=2,
                          env={"FAKE_TBO": "replay-then-hang",
                               "FAKE_TBO_FILE": str(DATA / "real-0.3.9-vulkan-h200-MUL_MAT-cut-at-120s.txt")})
    assert res.passed is False and res.cases_passed == 195
    hung = {f.op: f for f in res.failed_ops}["MUL_MAT"]
    assert hung.crashed == "hung"
    assert hung.cases == ["MUL_MAT(type_a=iq4_xs,type_b=f32,m=16,n=7,k=256,bs=[1,1],nr=[1,1],per=[0,1,2,3],"
                          "v=0):  <- running when the program hung"]


def test_failing_lines_of_both_eras_name_op_and_case():
    """FAIL lines as llama.cpp's own issues quote them: an older tree prints the error after the
    case (#12032, MI100), a newer one before it (#24406, A770)."""
    parsed = backend_ops.parse(_clean_lines("issue-quoted-fail-lines.txt"))
    assert set(parsed.failed) == {"FLASH_ATTN_EXT"}
    assert parsed.failed["FLASH_ATTN_EXT"].failed_cases == 4
    assert parsed.not_supported == 1
    first = parsed.failed["FLASH_ATTN_EXT"].cases[0]
    assert first.startswith("FLASH_ATTN_EXT(hs=64,nh=4") and first.endswith("FAIL")


def test_fake_failure_lists_the_failing_op_and_fails(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="vulkan", env={"FAKE_TBO": "fail"})
    assert res.ran and res.passed is False
    assert [f.op for f in res.failed_ops] == ["MUL_MAT"]
    assert "NMSE = 1.234567890" in res.failed_ops[0].cases[0]
    assert res.cases_passed == 1 and res.cases_not_supported == 1
    assert res.backends == ["Vulkan0", "CPU"]
    d = res.to_json()
    assert d["failed_ops"][0]["op"] == "MUL_MAT" and d["command"].endswith("test-backend-ops test")


def test_fake_pass(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="vulkan", env={"FAKE_TBO": "pass"})
    assert res.passed is True and res.ops_tested == ["ADD"] and not res.problem
    assert "PASSED" in res.lines()[0] and "timeout 1800s" in res.lines()[0]


def test_crash_mid_op_is_a_failed_op_named_from_the_unfinished_line(tmp_path):
    """The fake aborts (SIGABRT) after printing `FLASH_ATTN_EXT(...): `, as a 0.3.9 tree does
    on the crash of llama.cpp #24521."""
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="hip", env={"FAKE_TBO": "crash-midop"})
    assert res.passed is False
    crashed = {f.op: f for f in res.failed_ops}["FLASH_ATTN_EXT"]
    assert crashed.crashed == "died (signal 6 (SIGABRT))"
    assert "hsk=192" in crashed.cases[-1] and "running when the program died" in crashed.cases[-1]
    assert "SIGABRT" in res.problem
    assert any("FLASH_ATTN_EXT" in line and "died" in line for line in res.lines())


def test_crash_after_a_finished_case_names_the_case_after_it(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="hip", env={"FAKE_TBO": "crash-after"})
    crashed = {f.op: f for f in res.failed_ops}["FLASH_ATTN_EXT"]
    assert crashed.crashed.startswith("died (signal 11")
    assert crashed.cases[-1].startswith("(the case after) FLASH_ATTN_EXT(hsk=128")


def test_nonzero_exit_without_summary_is_a_crash(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="hip", env={"FAKE_TBO": "exit-no-summary"})
    assert res.passed is False and "exit code 3 without its summary" in res.problem
    assert {f.op for f in res.failed_ops} >= {"MUL_MAT"}  # the failure it printed, plus the crash
    assert any(f.crashed for f in res.failed_ops)


def test_a_hang_is_stopped_at_the_timeout_and_named(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="hip", env={"FAKE_TBO": "hang"},
                          timeout=2)
    assert res.passed is False and res.seconds < 15
    hung = {f.op: f for f in res.failed_ops}["SOFT_MAX"]
    assert hung.crashed == "hung" and "ran over its 2s" in res.problem


def test_cpu_build_of_a_tree_without_cpu_reference_is_not_run(tmp_path):
    res = backend_ops.run(_prefix(tmp_path), gpu=False, backend="cpu")
    assert not res.ran and res.passed is None
    assert res.lines() == ["backend ops: not run: the CPU backend is the reference: this tree's "
                           "test-backend-ops compares the CPU backend only with itself"]


def test_cpu_build_of_a_tree_with_cpu_reference_runs_against_it(tmp_path):
    """Newer trees ask the CPU backend for its reference kernels (ggml_backend_cpu_set_use_ref):
    there a CPU build has something to compare, `-b CPU`."""
    prefix = _prefix(tmp_path, b"ggml_backend_cpu_set_use_ref")
    (prefix / "lib").mkdir()
    (prefix / "lib" / "libggml-cpu.so").write_bytes(b"\0ggml_backend_cpu_set_use_ref\0")
    args = tmp_path / "args"
    res = backend_ops.run(prefix, gpu=False, backend="cpu", env={"FAKE_TBO": "pass", "FAKE_TBO_ARGS": str(args)})
    assert res.ran and "reference kernels" in res.compares
    assert args.read_text().split() == ["test", "-b", "CPU"]


def test_ops_are_passed_one_run_each_to_an_older_tree(tmp_path):
    args = tmp_path / "args"
    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="vulkan", ops=("ADD", "MUL_MAT"),
                          env={"FAKE_TBO": "pass", "FAKE_TBO_ARGS": str(args)})
    assert args.read_text().splitlines() == ["test -o ADD", "test -o MUL_MAT"]
    assert res.ops_asked == ["ADD", "MUL_MAT"] and res.passed
    assert res.to_json()["command"].endswith("test -o ADD; " + str(res.commands[1][0]) + " test -o MUL_MAT")


def test_ops_go_in_one_list_to_a_newer_tree(tmp_path):
    args = tmp_path / "args"
    prefix = _prefix(tmp_path, b"comma separated list of exact op names")
    backend_ops.run(prefix, gpu=True, backend="vulkan", ops=("ADD", "MUL_MAT"),
                    env={"FAKE_TBO": "pass", "FAKE_TBO_ARGS": str(args)})
    assert args.read_text().splitlines() == ["test -o ADD,MUL_MAT"]


def test_parse_ops():
    assert backend_ops.parse_ops("MUL_MAT,FLASH_ATTN_EXT,MUL_MAT") == ("MUL_MAT", "FLASH_ATTN_EXT")
    with pytest.raises(backend_ops.BackendOpsError, match="not an op name"):
        backend_ops.parse_ops("MUL_MAT,.*")


def test_missing_program_when_asked_is_one_line_with_a_hint(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(backend_ops.BackendOpsError) as err:
        backend_ops.run(tmp_path, gpu=True, backend="vulkan")
    assert "--cmake-target test-backend-ops" in err.value.hint


def _plan_options(capsys, tree: Path, *targets: str) -> dict:
    import json

    from rocforge_build import cli

    args = [a for t in targets for a in ("--cmake-target", t)]
    assert cli.main(["build", "llama-cpp", "--backend", "cpu", "--source", str(tree), *args,
                     "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    return {o["name"]: o for o in plan["options"]} | {"(build)": plan["build"], "(install)": plan["install"]}


def test_the_verify_tool_is_configured_only_when_a_build_names_it(tmp_path, capsys):
    """LLAMA_BUILD_TESTS (OFF in every recorded plan, tests/data/plans/recorded.json: no test is
    compiled for users) turns on only with --cmake-target test-backend-ops, which then builds the
    named targets alone."""
    from llama_trees import tree

    src = tree("0.3.9", tmp_path / "src")
    asked = _plan_options(capsys, src, "test-backend-ops", "llama-perplexity")
    assert asked["LLAMA_BUILD_TESTS"]["value"] == "ON"
    assert asked["LLAMA_BUILD_TESTS"]["because"] == "--cmake-target test-backend-ops (a verify tool)"
    assert asked["(build)"][-2:] == ["test-backend-ops", "llama-perplexity"]
    assert "test-backend-ops" in asked["(install)"]


def test_the_stage_json_keys_and_verify_tools_are_in_the_glossary(tmp_path):
    """verify's `backend_ops` object (a run with a crash, so `crashed` is there too) and the
    manifest's `verify_tools` are documented in docs/reference/glossary.md."""
    from test_docs_glossary import documented, keys_of

    res = backend_ops.run(_prefix(tmp_path), gpu=True, backend="hip", env={"FAKE_TBO": "crash-midop"})
    stage = {"backend_ops": res.to_json(), "verify_tools": ["libexec/test-backend-ops"]}
    assert any("crashed" in f for f in stage["backend_ops"]["failed_ops"])
    assert sorted(keys_of(stage) - documented()) == []


@pytest.mark.parametrize("tools, ok", [
    (["libexec/test-backend-ops"], True), (None, True),
    (["libexec/test-backend-ops\nrm -rf ~"], False), ("libexec/test-backend-ops", False), ([3], False),
])
def test_the_manifest_verify_tools_key_is_checked(tools, ok):
    """The key a build writes for its verify tools is held to the manifest schema: a list of
    one-line paths (a hand-edited manifest with a line break or a bare string is refused)."""
    from rocforge_build.errors import ConfigError
    from rocforge_build.manifest_schema import checked_manifest

    doc = {"recipe": {"name": "llama-cpp"}, "target": "", "backend": "cpu"}
    doc |= {} if tools is None else {"verify_tools": tools}
    if ok:
        assert checked_manifest(doc, "m.toml")["verify_tools"] == (tools or [])
    else:
        with pytest.raises(ConfigError, match="verify_tools"):
            checked_manifest(doc, "m.toml")


# -- the stage as verify asks for it -----------------------------------------------------------

def _build(*, tool: bool = True):
    """A vulkan llama.cpp build in the builds directory (its verdict is recorded), with the fake
    test-backend-ops in libexec/ or without it."""
    from stackfixtures import make_build

    from rocforge_build.measure.llama_tools import LlamaBuild

    prefix = make_build(Path("/"), "llama-cpp", "gfx1151", "vulkan", files=("bin/llama-cli",))
    if tool:
        (prefix / "libexec").mkdir()
        shutil.copy(FAKE, prefix / "libexec" / "test-backend-ops")
    return LlamaBuild.open(prefix)


def test_the_stage_runs_when_the_build_has_it_unless_turned_off_or_quick():
    build, env = _build(), {"FAKE_TBO": "pass"}
    assert backend_ops.stage_for(build, backend_ops.StageAsked(), quick=False, env=env).passed is True
    assert backend_ops.stage_for(build, backend_ops.StageAsked(), quick=True, env=env) is None
    assert backend_ops.stage_for(build, backend_ops.StageAsked(on=False), quick=False, env=env) is None
    # asked for (or narrowed with --ops), --quick does not turn it off
    assert backend_ops.stage_for(build, backend_ops.StageAsked(on=True), quick=True, env=env).ran
    narrowed = backend_ops.stage_for(build, backend_ops.StageAsked(ops=("ADD",), timeout=30.0),
                                     quick=True, env=env)
    assert narrowed.ops_asked == ["ADD"] and narrowed.timeout_s == 30.0


def test_a_build_without_the_program_runs_no_stage_unless_asked():
    build = _build(tool=False)
    assert backend_ops.stage_for(build, backend_ops.StageAsked(), quick=False, env={}) is None
    with pytest.raises(backend_ops.BackendOpsError) as got:  # asked for: one line saying how to get it
        backend_ops.stage_for(build, backend_ops.StageAsked(on=True), quick=False, env={})
    assert got.value.message == f"{build.prefix} has no test-backend-ops (a verify tool built only on request)"


def test_ops_with_the_stage_turned_off_is_one_line():
    with pytest.raises(backend_ops.BackendOpsError) as got:
        backend_ops.stage_for(_build(), backend_ops.StageAsked(on=False, ops=("ADD",)), quick=False, env={})
    assert got.value.message == "--ops needs the backend-ops stage, which --no-backend-ops turns off"


def test_a_failing_stage_fails_a_passed_verify_and_its_recorded_verdict():
    from rocforge_build.discover import choices
    from rocforge_build.rootfs import Root

    build = _build()
    passed = {"passed": True, "checks": []}
    assert backend_ops.with_stage(build, passed, None, "m.gguf", "/ref") is passed  # not run
    ok = backend_ops.stage_for(build, backend_ops.StageAsked(), quick=False, env={"FAKE_TBO": "pass"})
    assert backend_ops.with_stage(build, passed, ok, "m.gguf", "/ref")["passed"] is True
    choices.record_verify(build.prefix, build.stamp, True, model="m.gguf", reference="/ref")
    assert choices.verdict(Root("/"), build.prefix.name, build.stamp) is not None  # the checks passed
    failing = backend_ops.stage_for(build, backend_ops.StageAsked(), quick=False, env={"FAKE_TBO": "fail"})
    result = backend_ops.with_stage(build, passed, failing, "m.gguf", "/ref")
    assert result["passed"] is False and result["backend_ops"]["failed_ops"][0]["op"] == "MUL_MAT"
    assert passed["passed"] is True  # the verify's own result is not changed in place
    assert choices.verdict(Root("/"), build.prefix.name, build.stamp) is None  # recorded as failed
