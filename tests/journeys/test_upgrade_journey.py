"""The upgrading user's journey (slow; CI runs it), end to end through the CLI as a user types it,
in a fresh HOME and data dir: a CPU build of a llama.cpp git checkout with the user's own copy of
the recipe is proven against rocforge's reference, tuned and served;
the checkout gains a commit that changes compiled code; `rocforge upgrade PREFIX --ref NEW --model`
builds the candidate, gates it (verify against the current build, bench side by side) and swaps it
in; `serve` then refuses the preset, whose build changed under it, with the one command that proves
it; that command passes (against rocforge's reference build of the new commit); `serve` answers
again.

The checkout is the May 2025 tree (the session's `llama_tree`) in a git repository of its own, so
the upgrade is a real new commit (one source file changed: ccache rebuilds it, relinks the rest).
Measured 2026-11-29 on the 2-core machine: 117 s in a whole `--run-slow` run with nothing else
running; 945 s beside the Vulkan journey (load average 4-6).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from journey_user import User, capital, running_from
from llama_builds import JOBS
from measure_fixtures import recipe_variant
from trained_model import smollm2_trained_at

from rocforge_build.measure.llama_tools import MEASURE_TARGETS

pytestmark = [pytest.mark.slow]

GIT = {"GIT_AUTHOR_NAME": "journey", "GIT_AUTHOR_EMAIL": "journey@example.org",
       "GIT_COMMITTER_NAME": "journey", "GIT_COMMITTER_EMAIL": "journey@example.org"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(repo.parent), **GIT}).stdout.strip()


def checkout(tree: Path, where: Path) -> tuple[Path, str]:
    """A git repository holding `tree` as its first commit; (its path, that commit).  The session's
    tree is a checkout with llama.cpp as a submodule: its git data is left behind, one repository."""
    repo = where / "llama.cpp"
    shutil.copytree(tree, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A", "--force")  # as upstream tracks them: build-info-gen-cpp.cmake matches its .gitignore
    git(repo, "commit", "-q", "-m", "the tree as released")
    return repo, git(repo, "rev-parse", "HEAD")


def next_commit(repo: Path) -> str:
    """A commit that changes compiled code without changing what it computes."""
    src = repo / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml.c"  # the sdist vendors llama.cpp
    src.write_text(src.read_text() + "\nint ggml_journey_upgrade_marker(void) { return 2; }\n")
    git(repo, "commit", "-q", "-am", "the next commit")
    return git(repo, "rev-parse", "HEAD")


def verify_command(err: str) -> list[str]:
    """The command serve's refusal names, as argv (its hint line: `verify it at that shape: CMD`)."""
    (line,) = [x for x in err.splitlines() if "verify it at that shape: " in x]
    argv = shlex.split(line.split("verify it at that shape: ", 1)[1])
    assert argv[:2] == ["rocforge", "verify"], line
    return argv[1:]


def own_recipe(where: Path) -> Path:
    """The user's own copy of the llama-cpp recipe (and its patches), with a line of their own: the
    same flags, so the same compiles (ccache hits), but not rocforge's default plan, so its builds
    are verified against rocforge's reference (a CPU build of the default plan is the reference
    itself and serve takes it as proven: tests/test_measure_proof.py)."""
    recipe = recipe_variant(where)
    recipe.write_text(recipe.read_text() + "\n# my copy: pinned for the lab's machines\n")
    return recipe


def test_served_build_upgraded_gated_refused_proven_served(tmp_path, llama_tree):
    start = time.monotonic()
    user = User(tmp_path, "upgrade journey")
    model = smollm2_trained_at(1024, tmp_path / "smollm2-at-1024.gguf")
    repo, first = checkout(llama_tree, tmp_path)
    recipe = str(own_recipe(tmp_path / "mine"))
    targets = [a for t in MEASURE_TARGETS for a in ("--cmake-target", t)]
    out = user.rocforge("build", recipe, "--backend", "cpu", "--source", str(repo), *targets, "-j", str(JOBS))
    assert out.returncode == 0, out.stderr[-3000:]
    prefix = Path(out.stdout.strip().splitlines()[-1])
    programs = sorted(p.name for p in (prefix / "bin").iterdir())
    assert programs == sorted(MEASURE_TARGETS), programs
    out = user.rocforge("tune", recipe, "--backends", "cpu", "--source", str(repo), "--model", str(model),
                        "--contexts", "short", "--ctx", "256", "--ubatch", "256", "--fa", "on", "--kv", "f16",
                        "--reps", "1", "-p", "32", "-n", "8", "-j", str(JOBS))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    code, line, err = user.serve(model)
    assert line and "canary passed" in err and code == 130, err[-3000:]

    second = next_commit(repo)
    # --threshold 60: the two builds compute alike at the same speed, but on a shared 2-core machine
    # one side-by-side bench measured the same code 11-31 % apart under load; speed is what
    # benchmarks/ measures, the journey is the path (the gate still runs and must pass)
    out = user.rocforge("upgrade", str(prefix), "--ref", second, "--model", str(model), "--threshold", "60",
                        "-j", str(JOBS))
    assert out.returncode == 0 and "UPGRADED" in out.stdout, out.stdout + out.stderr[-3000:]
    manifest = (prefix / "rocforge-manifest.toml").read_text()
    assert second in manifest and first not in manifest.split("[source]", 1)[1].split("[", 1)[0]
    # the upgrade changed the source only: the same programs, the user's build otherwise as asked
    assert sorted(p.name for p in (prefix / "bin").iterdir()) == programs

    code, line, err = user.serve(model)
    assert code == 2 and line == "", line + err[-3000:]
    assert "rebuilt since the preset was verified" in err, err[-3000:]
    argv = verify_command(err)
    out = user.rocforge(*argv)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]

    answers = []
    code, line, err = user.serve(model, ask=lambda port: answers.append(capital(port)))
    assert line and "canary passed" in err, err[-3000:]
    assert code == 130, err[-3000:]
    assert "Paris" in answers[0], answers
    assert "Traceback" not in err
    assert running_from(prefix) == []
    user.say(f"upgrade journey: {time.monotonic() - start:.0f} s")
