"""Attack tests for replacing a build (`rocforge rollback`, `rocforge upgrade`) and a nightly's
`current` link: the real command is killed by strace's fault injection at each of its rename(2)
calls in turn (`-e inject=SYSCALL:signal=KILL:when=N`: killed as it enters the N-th call, for
N = 1, 2, ... until a run is not cut off), and after each kill one whole build (manifest and
program) is at the prefix, and the next command repairs what was left and succeeds, losing
neither build.  The same with SIGINT and SIGTERM (held back while the trees change places: the
swap completes, exit 130), and with the exchange made to fail with ENOSYS
(`inject=renameat2:error=ENOSYS`, as on a file system without it), which takes the journalled
two-rename fallback: its one gap (no prefix between its two renames) is repaired by the next
command from the journal.

strace traces rocforge's own process only (no `-f`): the swap is done there, and git, cmake and
the compiler, which rename files of their own, are not the subject (a kill of one of them is a
failed build, not a cut-off swap).  strace counts each system call separately, so each of
rename, renameat and renameat2 is swept on its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from needs import needs
from upgrade_history import built

pytestmark = needs("strace")

SYSCALLS = ("rename", "renameat", "renameat2")
MANIFEST = "rocforge-manifest.toml"
ENOUGH = 12  # more kill points than any of these commands has renames: a sweep that gets here is wrong


def rocforge(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", *args], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=timeout)


def traced(args: list[str], syscall: str, n: int, sig: str = "KILL",
           fallback: bool = False) -> subprocess.CompletedProcess:
    """`rocforge ARGS` with signal `sig` delivered at the n-th call of `syscall`; `fallback`: every
    renameat2 (the exchange) fails with ENOSYS, as on a kernel or file system without it."""
    inject = ["-e", f"inject={syscall}:signal={sig}:when={n}"]
    if fallback:
        inject += ["-e", "inject=renameat2:error=ENOSYS"]
    return subprocess.run(["strace", "-qq", "-o", "/dev/null", "-e", f"trace={','.join(SYSCALLS)},unlink",
                           *inject, sys.executable, "-m", "rocforge_build", *args],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=120)


def whole(tree: Path) -> str:
    """The commit of the complete build at `tree` (its manifest read, its program run)."""
    manifest = tomllib.loads((tree / MANIFEST).read_text())
    out = subprocess.run([tree / "bin" / "fixture-hello"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip(), (tree, out)
    return manifest["source"]["commit"]


def leftovers(prefix: Path) -> list[str]:
    """rocforge's names beside `prefix` other than the build kept for rollback."""
    return sorted(p.name for p in prefix.parent.iterdir()
                  if p.name.startswith(f"{prefix.name}.rocforge-")
                  and p.name != f"{prefix.name}.rocforge-previous")


def in_place(prefix: Path, fallback: bool) -> str | None:
    """The commit of the whole build at `prefix`; with the fallback, None for the one gap it
    has (cut between its two renames: no prefix, both trees whole beside it, the journal there)."""
    if fallback and not os.path.lexists(prefix):
        assert os.path.isfile(f"{prefix}.rocforge-swap")
        assert whole(Path(f"{prefix}.rocforge-old"))
        return None
    return whole(prefix)


def discovered(prefix: Path) -> list[str]:
    """The builds discovery (`rocforge env`, `rocforge use`) finds beside `prefix` in the builds
    directory: the prefix alone, whatever a kill left next to it (the fallback's gap: none)."""
    from rocforge_build.discover.builds import find_builds
    from rocforge_build.rootfs import Root

    found = [b.prefix for b in find_builds(Root("/"))]
    assert found == ([str(prefix)] if os.path.lexists(prefix) else []), found
    return found


def killed(res: subprocess.CompletedProcess) -> bool:
    if res.returncode == 0:
        return False
    assert res.returncode == -signal.SIGKILL, res.stderr
    return True


# -- two builds of the fixture project, made once: docs1 at the prefix, docs2 kept for rollback --

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    h, prefix = built(tmp_path_factory.mktemp("swap"))
    for commit in ("docs2", "docs1"):  # both sources fetched: the sweeps meet only the swap's renames
        res = rocforge("upgrade", str(prefix), "--ref", h.commits[commit])
        assert res.returncode == 0, res.stderr
    return h, prefix


@pytest.fixture
def builds(made):
    """A copy of the two builds in the builds directory (where discovery looks): (prefix, its
    commit, the kept build's commit)."""
    from rocforge_build import paths

    h, source = made
    prefix = Path(paths.builds_prefix_str()) / "prefix"
    for suffix in ("", ".rocforge-previous"):
        shutil.copytree(f"{source}{suffix}", f"{prefix}{suffix}", symlinks=True)
        manifest = Path(f"{prefix}{suffix}") / "rocforge-manifest.toml"  # the copy names its place
        manifest.write_text(manifest.read_text().replace(str(source), str(prefix)))
    keep = Path(f"{prefix}.rocforge-previous")
    return prefix, whole(prefix), whole(keep)


def sweep(run, check, first: int = 1, last: int = ENOUGH) -> int:
    """`run(n)` for n = first, first + 1, ... until it is not cut off (or n is `last`);
    `check(n)` after each cut; how many runs were cut."""
    for n in range(first, last + 1):
        if not run(n):
            return n - first
        check(n)
    if last == ENOUGH:
        raise AssertionError(f"still cut off after {ENOUGH} kill points")
    return last - first + 1


# -- rollback --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
def test_rollback_killed_at_every_rename_keeps_a_whole_build_and_the_next_one_repairs(
        builds, fallback):
    prefix, a, b = builds
    keep = Path(f"{prefix}.rocforge-previous")
    cuts = 0
    for syscall in (*SYSCALLS, "unlink"):  # unlink: the journal's removal, after the renames
        if fallback and syscall == "renameat2":
            continue  # every renameat2 fails with ENOSYS: the fallback is what is swept

        def run(n: int, syscall: str = syscall) -> bool:
            before = whole(prefix)
            res = traced(["rollback", str(prefix)], syscall, n, fallback=fallback)
            if not killed(res):
                assert whole(prefix) != before and {whole(prefix), whole(keep)} == {a, b}
                return False
            assert in_place(prefix, fallback) in (a, b, None)  # one whole build is in place
            discovered(prefix)
            return True

        def check(n: int) -> None:
            now = in_place(prefix, fallback)
            res = rocforge("rollback", str(prefix))  # the next command repairs, then rolls back
            assert res.returncode == 0, res.stderr
            assert {whole(prefix), whole(keep)} == {a, b}  # neither build lost
            assert whole(prefix) != now and leftovers(prefix) == []

        cuts += sweep(run, check)
    assert cuts >= (5 if fallback else 3)  # journal, exchange or three renames, journal gone


@pytest.mark.parametrize("sig, fallback", [
    ("INT", False), ("TERM", True),
    pytest.param("TERM", False, marks=pytest.mark.slow),  # ~10 s each, the same code as above
    pytest.param("INT", True, marks=pytest.mark.slow)], ids=["INT", "TERM-fallback", "TERM",
                                                             "INT-fallback"])
def test_rollback_interrupted_at_every_rename_completes_then_exits_130(builds, sig, fallback):
    prefix, a, b = builds
    keep = Path(f"{prefix}.rocforge-previous")
    for syscall in ("rename", "renameat2", "unlink"):
        if fallback and syscall == "renameat2":
            continue
        for n in range(1, ENOUGH):
            before = whole(prefix)
            res = traced(["rollback", str(prefix)], syscall, n, sig=sig, fallback=fallback)
            assert whole(prefix) != before and {whole(prefix), whole(keep)} == {a, b}
            assert leftovers(prefix) == []  # held back until the swap was whole
            if res.returncode == 0:
                break
            assert res.returncode == 130, res.stderr
            assert res.stderr.strip().splitlines()[-1] == f"rocforge: interrupted (SIG{sig})"
            assert "Traceback" not in res.stderr
        else:
            raise AssertionError("interrupted at every kill point")


def test_a_directory_the_user_made_at_the_staging_name_is_refused_and_kept(made, builds):
    h, _ = made
    prefix, a, _b = builds
    staging = Path(f"{prefix}.rocforge-new")
    staging.mkdir()
    (staging / "notes.txt").write_text("mine\n")
    for args in (["upgrade", str(prefix), "--ref", h.commits["docs2"]],
                 ["build", str(h.recipe), "--target", "gfx1151", "--prefix", str(prefix),
                  "--ref", h.commits["docs2"], "--no-recheck"]):
        res = rocforge(*args)
        lines = [line for line in res.stderr.splitlines() if line.startswith("rocforge: error:")]
        assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert "refusing to remove" in lines[0] and str(staging) in lines[0]
    assert (staging / "notes.txt").read_text() == "mine\n" and os.listdir(staging) == ["notes.txt"]
    assert whole(prefix) == a


def test_a_file_at_the_journals_name_that_rocforge_did_not_write_is_refused_and_kept(builds):
    prefix, a, b = builds
    journal = Path(f"{prefix}.rocforge-swap")
    journal.write_text("my notes\n")
    res = rocforge("rollback", str(prefix))
    lines = [line for line in res.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(journal) in lines[0] and journal.read_text() == "my notes\n"
    assert whole(prefix) == a and whole(Path(f"{prefix}.rocforge-previous")) == b


def test_a_staged_tree_rocforge_left_is_cleared_by_the_next_upgrade(made, builds):
    h, _ = made
    prefix, a, b = builds
    staging = Path(f"{prefix}.rocforge-new")  # as a build killed before its manifest leaves it
    (staging / "bin").mkdir(parents=True)
    (staging / "bin" / "half-installed").write_text("")
    (staging / ".rocforge-scratch").write_text("rocforge scratch tree: rocforge deletes it when "
                                               "it is done\n")  # as rocforge writes it
    res = rocforge("upgrade", str(prefix), "--ref", h.commits["docs2"])
    assert res.returncode == 0, res.stderr
    assert whole(prefix) == h.commits["docs2"] and not os.path.lexists(staging)


# -- upgrade ---------------------------------------------------------------------------------------

def _upgrade_sweep(h, prefix: Path, syscalls, fallback: bool, first: int = 1,
                   last: int = ENOUGH) -> list[str | None]:
    """Upgrades between docs1 and docs2 cut at each rename; the build in place at each cut."""
    keep = Path(f"{prefix}.rocforge-previous")
    states: list[str | None] = []

    def other(commit: str) -> str:
        return h.commits["docs2"] if commit == h.commits["docs1"] else h.commits["docs1"]

    for syscall in syscalls:
        def run(n: int, syscall: str = syscall) -> bool:
            before, kept = whole(prefix), whole(keep)
            res = traced(["upgrade", str(prefix), "--ref", other(before)], syscall, n,
                         fallback=fallback)
            if not killed(res):
                assert whole(prefix) == other(before) and whole(keep) == before
                return False
            states.append(in_place(prefix, fallback))
            assert states[-1] in (before, other(before), None)
            discovered(prefix)
            if states[-1] != other(before):  # cut before the new build went in
                assert whole(keep) == kept  # the build kept for rollback is still there
            return True

        def check(n: int) -> None:
            was = in_place(prefix, fallback) or whole(Path(f"{prefix}.rocforge-old"))
            want = other(was)  # the gap is undone: the build that was in place is put back
            res = rocforge("upgrade", str(prefix), "--ref", want)
            assert res.returncode == 0, res.stderr  # the next command repairs, then upgrades
            assert whole(prefix) == want and whole(keep) == was  # neither build lost
            assert leftovers(prefix) == []

        sweep(run, check, first, last)
    return states


@pytest.mark.slow  # ~20 s each: every cut is two upgrades (the cut one, the repair) of ~2 s
@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
def test_upgrade_killed_at_every_rename_keeps_a_whole_build_and_the_next_one_repairs(
        made, builds, fallback):
    h, _ = made
    prefix, _a, _b = builds
    syscalls = ("rename", "renameat") if fallback else SYSCALLS
    states = _upgrade_sweep(h, prefix, syscalls, fallback)
    assert len(states) >= (5 if fallback else 4) and (None in states) == fallback


def test_upgrade_killed_at_its_first_renames_keeps_a_whole_build_and_the_next_one_repairs(
        made, builds):
    """The fast share of the sweep above: the exchange, and the fallback's 3rd and 4th renames
    (after the journal's and the first of its two: the gap between them, and right after them)."""
    h, _ = made
    prefix, _a, _b = builds
    assert len(_upgrade_sweep(h, prefix, ("renameat2",), False)) == 1
    gap, after = _upgrade_sweep(h, prefix, ("rename",), True, first=3, last=4)
    assert gap is None and after is not None


# -- a nightly's `current` link ------------------------------------------------------------------

def test_nightly_use_killed_at_every_rename_leaves_current_whole(tmp_path):
    prefix = tmp_path / "nightlies"
    names = ["therock-7.9.0rc20251001-gfx1151", "therock-7.9.0rc20251101-gfx1151"]
    for i, name in enumerate(names):
        (prefix / name / "bin").mkdir(parents=True)
        (prefix / name / "bin" / "hipcc").write_text(f"{name}\n")
        (prefix / name / "rocforge-install.toml").write_text(
            f'version = "7.9.0rc2025{i + 10}01"\nfamily = "gfx1151"\ndate = "2025-{i + 10}-01"\n')
    (prefix / "current").symlink_to(names[0])
    for n in range(1, ENOUGH):
        want = names[1] if os.readlink(prefix / "current") == names[0] else names[0]
        res = traced(["nightly", "use", want, "--prefix", str(prefix)], "rename", n)
        target = os.readlink(prefix / "current")
        assert target in names and (prefix / "current" / "bin" / "hipcc").read_text() == f"{target}\n"
        if not killed(res):
            assert target == want
            break
        res = rocforge("nightly", "use", want, "--prefix", str(prefix))  # the next one repairs
        assert res.returncode == 0, res.stderr
        assert os.readlink(prefix / "current") == want
        assert sorted(p.name for p in prefix.iterdir()) == sorted([".lock", "current", *names])
    else:
        raise AssertionError("killed at every rename")
    assert n >= 2
