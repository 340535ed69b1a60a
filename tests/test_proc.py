"""proc.py, the one subprocess wrapper: a run stops its whole tree at its deadline (an orphan
holding the output pipe too), `stop_group` ends a spawned child's daemonized grandchild (found by
the spawn's mark), every run without a deadline says why, and no other module starts a program.
Who holds a port (`port_holder`) is tested with serve's attacks (attack/test_trust_serve_proc.py),
where the programs that take a port are."""

from __future__ import annotations

import ast
import os
import signal
import sys
import time
from pathlib import Path

import needs
import pytest

from rocforge_build import proc

REPO = Path(__file__).resolve().parent.parent
# the bound an ended run must meet: the deadline, the stop's SIGTERM grace, a loaded 2-core
# CI machine's scheduling
MARGIN = 4.0
# a tool that hangs with a child of its own (the whole tree must be stopped), its pids in {pids}
HANGS = '#!/bin/sh\necho $$ >> "{pids}"\nsleep 3600 &\necho $! >> "{pids}"\nwait\n'


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_over(pids: Path) -> list[int]:
    return [int(p) for p in pids.read_text().split() if alive(int(p))]


def wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_run_stops_the_whole_tree_at_its_deadline(tmp_path):
    pids = tmp_path / "pids"
    script = tmp_path / "slow-tool"
    script.write_text(HANGS.format(pids=pids))
    script.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(proc.ToolTimedOut) as exc:
        proc.run([str(script), "--version"], timeout=1.0)
    assert time.monotonic() - start < 1.0 + MARGIN
    assert str(exc.value).startswith(f"slow-tool did not finish within 1 s and was stopped: {script} --version")
    assert exc.value.exit_code == 5
    assert left_over(pids) == []


@needs.needs("git")
def test_an_orphan_holding_the_output_is_stopped_at_the_deadline(tmp_path):
    """The tool exits but leaves a background process holding its output pipe open (reparented:
    no longer its descendant): the read ends at the deadline, and that process is stopped too."""
    pids = tmp_path / "pids"
    script = tmp_path / "leaves-a-child"
    script.write_text(f'#!/bin/sh\nsleep 3600 &\necho $! > "{pids}"\nexit 0\n')
    script.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(proc.ToolTimedOut):
        proc.run([str(script)], timeout=1.0)
    assert time.monotonic() - start < 1.0 + MARGIN
    assert pids.read_text().split() and left_over(pids) == []


def test_every_run_without_a_deadline_says_why():
    """`timeout=None` (no deadline) is for work whose length is the work itself; each such call
    carries its reason as a comment on its line."""
    bare = []
    for path in sorted((REPO / "rocforge_build").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "timeout=None" in line and "#" not in line.split("timeout=None", 1)[1]:
                bare.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert bare == []


def test_stop_group_stops_a_daemonized_grandchild(tmp_path):
    """proc.spawn + stop_group directly: a child that double-forks into a new session and exits
    leaves a grandchild that only the spawn mark ties to it; stop_group ends it."""
    pidfile = tmp_path / "pid"
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        open({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
            f"        os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n        time.sleep(3600)\n"
            f"    os._exit(0)\nos.wait()\n")
    child = proc.spawn([sys.executable, "-c", code])
    wait_for(pidfile)
    grandchild = int(pidfile.read_text())
    try:
        child.wait(timeout=30)  # the child is gone, the daemon is init's
        assert alive(grandchild)
        proc.stop_group(child, grace=2.0)
        assert not alive(grandchild)
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_runs_environment_adds_to_the_callers_and_none_unsets_a_variable(monkeypatch):
    """`env` values are laid over the caller's environment and `None` removes one: the child does
    not inherit it, and the caller's own mapping is left as it was."""
    base = {"KEEP": "1", "DROP": "2"}
    assert proc.merged_env({"DROP": None, "NEW": "3"}, base) == {"KEEP": "1", "NEW": "3"}
    assert base == {"KEEP": "1", "DROP": "2"}
    monkeypatch.setenv("ROCFORGE_T_DROP", "inherited")
    monkeypatch.setenv("ROCFORGE_T_KEEP", "inherited")
    code = "import os; print(os.environ.get('ROCFORGE_T_DROP'), os.environ.get('ROCFORGE_T_KEEP'))"
    out = proc.run([sys.executable, "-c", code], env={"ROCFORGE_T_DROP": None}, timeout=30)
    assert out.stdout.split() == ["None", "inherited"]


@needs.needs("git")
def test_git_refuses_an_ext_url_even_where_its_config_allows_it(tmp_path):
    """git(1) runs the command of an `ext::CMD` URL when `protocol.ext.allow=always`; every git
    rocforge runs gets GIT_ALLOW_PROTOCOL (https, http, ssh, git, file: git-config(1) says it
    overrides the config), so the command never runs and the run fails in one CommandFailed."""
    touched = tmp_path / "ran"
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.ext.allow",
           "GIT_CONFIG_VALUE_0": "always"}
    assert proc.git_env(env)["GIT_ALLOW_PROTOCOL"] == "https:http:ssh:git:file"
    with pytest.raises(proc.CommandFailed) as exc:
        proc.run(["git", "ls-remote", f"ext::touch {touched}"], env=env, timeout=30)
    assert "transport 'ext' not allowed" in exc.value.output
    assert not touched.exists()
    # the control: with ext allowed for this one call, git does run it (so the check above can fail)
    with pytest.raises(proc.CommandFailed):
        proc.run(["git", "ls-remote", f"ext::touch {touched}"],
                 env={**env, "GIT_ALLOW_PROTOCOL": "ext"}, timeout=30)
    assert touched.exists()


def test_a_missing_program_and_a_failing_one_are_each_one_error_with_an_exit_code(tmp_path):
    with pytest.raises(proc.ToolchainError) as missing:
        proc.run(["rocforge-no-such-program-here"], timeout=30)
    assert str(missing.value).startswith("required program 'rocforge-no-such-program-here' was not found")
    with pytest.raises(proc.CommandFailed) as failed:
        proc.run([sys.executable, "-c", "import sys; print('why'); sys.exit(3)"], timeout=30)
    assert failed.value.returncode == 3 and failed.value.output.strip() == "why"
    assert str(failed.value).splitlines() == [
        f"command failed with exit code 3: {sys.executable} -c 'import sys; print('\"'\"'why'\"'\"'); "
        "sys.exit(3)'", "why"]


# -- the structure: proc.py is the only place a program is started --------------------------------
STARTERS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output",
                                        "getoutput", "getstatusoutput")} | \
           {("os", n) for n in ("system", "popen", "execv", "execve", "execvp", "execvpe", "execl",
                                "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp",
                                "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn",
                                "posix_spawnp", "fork", "forkpty")} | \
           {("asyncio", "create_subprocess_exec"), ("asyncio", "create_subprocess_shell"),
            ("pty", "spawn"), ("pty", "fork")}
# files allowed to start programs themselves, each with its reason (none: proc.py is the one)
ALLOWED: dict[str, str] = {}


def starters_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in STARTERS:
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom) and node.module in {m for m, _ in STARTERS}:
            found += [f"from {node.module} import {a.name} (line {node.lineno})" for a in node.names
                      if (node.module, a.name) in STARTERS]
    return found


def test_only_proc_starts_programs():
    """Every program rocforge runs goes through rocforge_build/proc.py (deadlines, process
    groups, one-line errors); a direct subprocess.run/Popen/os.system elsewhere fails here."""
    package = REPO / "rocforge_build"
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "rocforge_build/proc.py" or rel in ALLOWED:
            continue
        found = starters_in(path)
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_the_structural_check_sees_a_direct_start(tmp_path):
    """The check above is not vacuous: each way of starting a program is found."""
    sample = tmp_path / "sample.py"
    sample.write_text("import subprocess, os\nfrom subprocess import check_output\n"
                      "subprocess.run(['x'])\nsubprocess.Popen(['x'])\nos.system('x')\n")
    assert {f.split(" (")[0] for f in starters_in(sample)} == {
        "from subprocess import check_output", "subprocess.run", "subprocess.Popen", "os.system"}


def test_which_names_a_program_found_through_a_relative_path_entry_absolutely(tmp_path, monkeypatch):
    """A PATH entry such as `.venv/bin` names a program from the directory rocforge started in; a
    compiler launcher found there and run by ninja from the build dir was "not found" (seen with
    the README's `PATH=.venv/bin:...`)."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "some-launcher"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert proc.which("some-launcher", "bin") == str(tool)
    assert proc.which("no-such-program-here", "bin") is None
