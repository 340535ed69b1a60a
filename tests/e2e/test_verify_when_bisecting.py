"""`rocforge bisect --verify` on a real llama.cpp history (slow; CI runs it): the May 2025 tree made
into a local git repository of four first-parent commits, the third of which makes the CPU backend
wrong (tests/data/patches/llama-cpp-wrong/wrong-on-demand.patch, its flash-attention fault: the
attention output scaled by 1.25 when ROCFORGE_TEST_WRONG=flash-attn).  The right answer is that
third commit, by construction; the oracle is verify against the good commit's build, and the CPU
backend is bisected — the case where verify's own default reference (the CPU build of the step's
own commit) would be the step itself and pass every commit.

Named to run after test_verify_shapes.py: every step builds llama-perplexity only, with the flags
those builds used, so the session's ccache already holds every object but the patched ops.cpp.
CI cost (2 cores): 4 llama-perplexity builds (the good reference, then bad, harmless, wrong:
ceil(log2 3) + 1 steps, ccache warm) and 3 verify checks of 512 tokens per step: 242 s here.
With the model said to be trained at 2048 tokens, each step's checks took 2 min (flash attention
at 2048 tokens on this tree's CPU backend: 54 s a pass) and the test 9 min.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from llama_builds import shared_ccache
from llama_trees import tree
from trained_model import smollm2_trained_at

from rocforge_build import cli

JOBS = os.environ.get("ROCFORGE_TEST_JOBS", "2")
WRONG = Path(__file__).resolve().parents[1] / "data" / "patches" / "llama-cpp-wrong" / "wrong-on-demand.patch"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
           "GIT_AUTHOR_DATE": "2025-05-01T00:00:00Z", "GIT_COMMITTER_DATE": "2025-05-01T00:00:00Z"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def history(where: Path) -> tuple[Path, list[str]]:
    """good (the tree as released), harmless, WRONG, harmless: the commits, oldest first."""
    repo = tree("0.3.9", where / "sdist", full=True) / "vendor" / "llama.cpp"
    # the sdist carries llama.cpp's submodule gitlink (.git: "gitdir: ../../.git/modules/...",
    # a detached HEAD): a history of our own instead, on a branch a clone sees
    (repo / ".git").unlink(missing_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A", "--force")  # every file the sdist has (llama.cpp's .gitignore drops common/cmake/)
    git(repo, "commit", "-qm", "the May 2025 tree (llama-cpp-python 0.3.9)")
    commits = [git(repo, "rev-parse", "HEAD")]
    for subject, change in (("docs: a harmless change", "README.md"),
                            ("ggml-cpu: attention output scaled (wrong on demand)", None),
                            ("docs: another harmless change", "README.md")):
        if change:
            with open(repo / change, "a") as f:
                f.write(f"\n{subject}\n")
        else:
            git(repo, "apply", str(WRONG))
        git(repo, "commit", "-qam", subject)
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


def trained_at_512(out: Path) -> Path:
    """SmolLM2-135M-Instruct (tests/trained_model.py) whose metadata says it was trained at 512
    tokens (8192 really): the same weights, so verify's default coverage stops at 512 tokens, where
    the fault already shows (KL divergence 0.30 with flash attention on, 0 for the right steps).
    A random model would not do: near chance, a wrong attention output hardly moves its KL
    divergence."""
    return smollm2_trained_at(512, out)


@pytest.mark.slow
def test_bisect_with_verify_names_the_commit_that_makes_the_cpu_backend_wrong(tmp_path_factory, capsys,
                                                                            monkeypatch):
    where = tmp_path_factory.mktemp("bisect-llama")
    repo, (good, harmless, wrong, bad) = history(where)
    model = trained_at_512(where / "smollm2-ctx512.gguf")
    monkeypatch.setenv("CCACHE_DIR", shared_ccache())
    monkeypatch.setenv("ROCFORGE_TEST_WRONG", "flash-attn")
    code = cli.main(["bisect", "llama-cpp", "--target", "gfx1151", "--backend", "cpu", "--source", str(repo),
                     "--good", good, "--bad", bad, "--verify", str(model), "-j", JOBS, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["first_bad"] == wrong
    verdicts = {s["ref"]: s["verdict"] for s in doc["steps"]}
    # bad first (a bisect whose bad ref tests good names nothing), then the middle: 3 candidates
    assert verdicts == {bad: "bad", wrong: "bad", harmless: "good"}
    # every step a llama-perplexity-only build of its own, the reference (the good commit) apart
    prefixes = {s["prefix"] for s in doc["steps"]}
    assert len(prefixes) == 3 and all((Path(p) / "bin" / "llama-perplexity").is_file() for p in prefixes)
    assert not any((Path(p) / "bin" / "llama-server").exists() for p in prefixes)
