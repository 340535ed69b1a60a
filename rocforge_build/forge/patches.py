"""Apply a recipe's patches idempotently, each with a status:

    applied           the patch applied (or, in a plan, "would apply")
    already upstream  the reverse applies: the source already has the change
    not needed        its `when` is false (the reason says which fact)
    decided after the fetch   a dry run did not download the source: whether the `when` holds
                      (the reason says the condition) or the patch applies is known only then
    fails             neither applies: the build stops with the patch name and the rejected
                      hunk, and every patch applied so far is reversed (the tree is left clean)

`git apply --check` / `--reverse --check` decide (the method of kyuz0/amd-strix-halo-toolboxes);
when applying, `git apply` itself is the forward check: it is atomic ("git apply by default
fails the whole patch and does not touch the working tree when some of the hunks do
not apply": git-apply(1), --reject), so one git call per patch that applies;
GIT_CEILING_DIRECTORIES keeps git from mistaking an enclosing repository for the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.download import sha256_file
from rocforge_build.errors import PatchError
from rocforge_build.proc import run

APPLIED = "applied"
WOULD_APPLY = "would apply"
UPSTREAM = "already upstream"
NOT_NEEDED = "not needed"
FAILS = "fails"
AFTER_FETCH = "decided after the fetch"  # a dry run's plan of a source it did not download


@dataclass(frozen=True)
class PatchPlan:
    name: str
    path: Path
    needed: bool
    reason: str
    evidence: tuple[str, ...] = ()  # the rule's, printed under its reason


@dataclass(frozen=True)
class PatchResult:
    name: str
    status: str
    reason: str
    sha256: str = ""
    detail: str = ""
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict:
        d = {"name": self.name, "status": self.status, "reason": self.reason}
        if self.evidence:
            d["evidence"] = list(self.evidence)
        if self.sha256:
            d["sha256"] = self.sha256
        if self.detail:
            d["detail"] = self.detail
        return d


def _git_apply(tree: Path, patch: Path, *flags: str):
    env = {"GIT_CEILING_DIRECTORIES": str(tree.parent), "GIT_DIR": None, "GIT_WORK_TREE": None}
    if (tree / ".git").is_file():
        # a submodule's gitlink copied with the tree (llama-cpp-python sdists carry
        # vendor/llama.cpp/.git -> ../../.git/modules/...): git would stop at the broken link, so
        # apply from the parent (no repository) into the tree with --directory
        env["GIT_CEILING_DIRECTORIES"] = str(tree.parent.parent)
        return run(["git", "apply", "--verbose", f"--directory={tree.name}", *flags, str(patch)], cwd=tree.parent,
                   env=env, check=False, hint="install git (Debian: apt-get install git)")
    return run(["git", "apply", "--verbose", *flags, str(patch)], cwd=tree, env=env, check=False,
               hint="install git (Debian: apt-get install git)")


def _rejected_hunk(patch: Path, output: str) -> str:
    """The hunk git could not place, with git's own complaint."""
    m = re.search(r"patch failed: (.+?):(\d+)", output)
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    if not m:
        return "\n".join(lines) or output.strip()
    file, line = m.group(1), int(m.group(2))
    current: str | None = None
    hunk: list[str] = []
    found: list[str] = []
    for text in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if text.startswith("+++ "):
            current = text[4:].split("\t")[0].removeprefix("b/")
            continue
        if text.startswith("@@"):
            if found:
                break
            hunk = [text]
            h = re.match(r"@@ -(\d+)", text)
            if current == file and h and int(h.group(1)) == line:
                found = hunk
            continue
        if hunk is found and found:
            if text.startswith(("diff ", "--- ")):
                break
            found.append(text)
    body = "\n".join(found) if found else ""
    return "\n".join(lines) + (f"\nrejected hunk ({file}):\n{body}" if body else "")


def check(plans: list[PatchPlan], tree: Path) -> list[PatchResult]:
    """Statuses without touching the tree (a plan's view; patches checked independently)."""
    results = []
    for p in plans:
        if not p.needed:
            results.append(PatchResult(p.name, NOT_NEEDED, p.reason, sha256_file(p.path),
                                       evidence=p.evidence))
            continue
        fwd = _git_apply(tree, p.path, "--check")
        if fwd.returncode == 0:
            results.append(PatchResult(p.name, WOULD_APPLY, p.reason, sha256_file(p.path),
                                       evidence=p.evidence))
        elif _git_apply(tree, p.path, "--check", "--reverse").returncode == 0:
            results.append(PatchResult(p.name, UPSTREAM, "the reverse applies: the source has it",
                                       sha256_file(p.path)))
        else:
            results.append(PatchResult(p.name, FAILS, p.reason, sha256_file(p.path),
                                       _rejected_hunk(p.path, fwd.stdout), evidence=p.evidence))
    return results


def unread(plans: list[PatchPlan], open_: set[str]) -> list[PatchResult]:
    """Statuses in a plan whose source was not read (a dry run downloads nothing): a patch whose
    `when` only the source decides (`open_`), or that is needed (applies? already upstream?), is
    decided after the fetch."""
    results = []
    for p in plans:
        if p.name in open_ or p.needed:
            why = p.reason if p.name in open_ else (
                f"{p.reason}; whether it applies or is already upstream is checked on the source")
            results.append(PatchResult(p.name, AFTER_FETCH, why, sha256_file(p.path),
                                       evidence=p.evidence))
        else:
            results.append(PatchResult(p.name, NOT_NEEDED, p.reason, sha256_file(p.path),
                                       evidence=p.evidence))
    return results


def apply(plans: list[PatchPlan], tree: Path) -> list[PatchResult]:
    """Apply in order; on a failure reverse what was applied and raise PatchError."""
    results: list[PatchResult] = []
    applied: list[PatchPlan] = []
    for p in plans:
        if not p.needed:
            results.append(PatchResult(p.name, NOT_NEEDED, p.reason, sha256_file(p.path),
                                       evidence=p.evidence))
            continue
        fwd = _git_apply(tree, p.path)  # atomic: a patch that does not apply touches nothing
        if fwd.returncode == 0:
            applied.append(p)
            results.append(PatchResult(p.name, APPLIED, p.reason, sha256_file(p.path),
                                       evidence=p.evidence))
            continue
        if _git_apply(tree, p.path, "--check", "--reverse").returncode == 0:
            results.append(PatchResult(p.name, UPSTREAM, "the reverse applies: the source has it",
                                       sha256_file(p.path)))
            continue
        for q in reversed(applied):
            _git_apply(tree, q.path, "--reverse")
        raise PatchError(
            f"patch {p.name} does not apply to {tree}\n{_rejected_hunk(p.path, fwd.stdout)}",
            "the source moved on: refresh the patch, or narrow its `when` in the recipe "
            "(the source tree was left unpatched)",
        )
    return results
