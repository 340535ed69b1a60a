"""`rocforge bisect`: find the first bad first-parent commit between a good and a bad ref.

The candidates are `git rev-list --first-parent GOOD..BAD` (oldest first; BAD is the last).  BAD is
built and tested first (a bisect whose bad ref tests good would name a wrong commit), then a binary
search over the rest: with no skips at most ceil(log2 n) + 1 builds for n candidates (`--bench`
also measures GOOD, its baseline).  Each step is an ordinary pipeline build into its own prefix
under the cache dir, named by commit: a second bisect over the same range finds those builds up to
date (the plan's stamp), and the compiler cache makes the new ones cheap; the step's work dir is
removed after the build (the install is what the test needs).  A step whose test exits 125, or
whose build fails, is skipped and its nearest untested neighbour is tried instead, as
`git bisect run` does.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import paths
from rocforge_build.build import sources
from rocforge_build.build.plan import Request, work_dir
from rocforge_build.build.upgrade import Gate, rocforge_cli, run_gate
from rocforge_build.errors import BuildError, UsageError
from rocforge_build.proc import CommandFailed, run
from rocforge_build.refs import check_git_ref

METRICS = {"pp512": ("pp", 512), "tg128": ("tg", 128)}


@dataclass
class Step:
    ref: str
    verdict: str  # good | bad | skip
    detail: str = ""
    figures: dict = field(default_factory=dict)
    built: bool = False
    prefix: str = ""

    def to_json(self) -> dict:
        return {"ref": self.ref, "verdict": self.verdict, "detail": self.detail,
                "figures": self.figures, "built": self.built, "prefix": self.prefix}


@dataclass
class Result:
    candidates: list[str]
    subjects: dict[str, str]
    steps: list[Step]
    first_bad: str | None
    suspects: list[str]  # when skips leave several: the first bad is one of these

    @property
    def builds(self) -> int:
        return sum(1 for s in self.steps if s.built)


# -- the candidates -------------------------------------------------------------------------------

def git_location(recipe, source: str | None, good: str) -> str:
    """The git repository to bisect: --source, else the recipe's git source."""
    spec = sources.spec_for(recipe, ref=good, source=source)
    if spec.kind != "git":
        raise UsageError(f"bisect needs a git source; {spec.location} is a {spec.kind}",
                         "give --source a git repository (a URL or a local clone)")
    return spec.location


def candidates(location: str, good: str, bad: str) -> tuple[list[str], dict[str, str]]:
    """First-parent commits after `good` up to `bad`, oldest first, with their subjects."""
    for ref, option in ((good, "--good"), (bad, "--bad")):
        check_git_ref(ref, option)
    good_sha = sources._git_resolve(location, good)
    bad_sha = sources._git_resolve(location, bad)
    mirror = sources._mirror(location)
    if not mirror.is_dir():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "init", "-q", "--bare", mirror])
    shallow = ["--unshallow"] if (mirror / "shallow").exists() else []
    got = run(["git", "-C", mirror, "fetch", "-q", *shallow, "--", location, good_sha, bad_sha],
              check=False, timeout=3600)
    if got.returncode != 0:  # servers that refuse a sha want: fetch the branches and tags
        try:
            run(["git", "-C", mirror, "fetch", "-q", *shallow, "--tags", "--", location,
                 "+refs/heads/*:refs/heads/*"], timeout=3600)
        except CommandFailed as exc:
            from rocforge_build.errors import NetworkError

            raise NetworkError(f"git fetch {location} failed",
                               exc.output.strip()[-400:] or None) from exc
    if run(["git", "-C", mirror, "merge-base", "--is-ancestor", good_sha, bad_sha],
           check=False).returncode != 0:
        raise UsageError(f"--good {good} is not an ancestor of --bad {bad}",
                         "give a good ref that comes before the bad one in the history")
    out = run(["git", "-C", mirror, "log", "--first-parent", "--reverse", "--format=%H %s",
               f"{good_sha}..{bad_sha}"]).stdout
    shas, subjects = [], {}
    for line in out.splitlines():
        sha, _, subject = line.partition(" ")
        shas.append(sha)
        subjects[sha] = subject
    if not shas:
        raise UsageError(f"no commits between --good {good} and --bad {bad}")
    return shas, subjects


def max_builds(n: int) -> int:
    return math.ceil(math.log2(n)) + 1 if n > 1 else 1


# -- the search -----------------------------------------------------------------------------------

def search(commits: list[str], test: Callable[[str], Step]) -> tuple[list[Step], int | None,
                                                                      list[str]]:
    """Binary search for the first bad commit; commits[-1] is tested first and must be bad.
    Returns (steps, index of the first bad or None, the suspects when skips leave several)."""
    steps: list[Step] = []
    last = test(commits[-1])
    steps.append(last)
    if last.verdict != "bad":
        raise UsageError(f"--bad {commits[-1][:12]} does not test bad ({last.verdict}: "
                         f"{last.detail})", "give a --bad ref that shows the problem")
    lo, hi = -1, len(commits) - 1  # lo: last known good (-1: --good), hi: first known bad
    skipped: set[int] = set()
    while hi - lo > 1:
        mid = _pick(lo, hi, skipped)
        if mid is None:
            return steps, None, commits[lo + 1:hi + 1]
        step = test(commits[mid])
        steps.append(step)
        if step.verdict == "good":
            lo = mid
        elif step.verdict == "bad":
            hi = mid
        else:
            skipped.add(mid)
    return steps, hi, [commits[hi]]


def _pick(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The middle of (lo, hi), or its nearest untested neighbour when the middle was skipped."""
    mid = (lo + hi) // 2
    for d in range(hi - lo):
        for i in (mid + d, mid - d):
            if lo < i < hi and i not in skipped:
                return i
    return None


# -- one step -------------------------------------------------------------------------------------

def step_prefix(recipe: str, target: str, backend: str | None, sha: str) -> Path:
    return paths.cache_dir() / "bisect" / f"{recipe}-{target}-{backend or 'default'}" / sha[:12]


def build_step(req: Request, root) -> tuple[bool, str | None]:
    """Build one step (up to date when an earlier bisect built it); (built, failure or None)."""
    from rocforge_build.build import pipeline

    try:
        out = pipeline.execute(req, root, quiet=True)
    except BuildError as exc:
        return True, exc.message.splitlines()[0]
    finally:
        shutil.rmtree(work_dir(Path(req.prefix)), ignore_errors=True)
    return out.status == "built", None


def run_test(argv: list[str]) -> Callable[[Path], Step]:
    def test(prefix: Path) -> Step:
        g = run_gate(argv, prefix)
        return _from_gate(g)
    return test


def verify_test(model: str, root: str | None) -> Callable[[Path], Step]:
    def test(prefix: Path) -> Step:
        rc, _ = rocforge_cli(["verify", str(prefix), "--model", model, "--json"], root)
        verdict = {0: "good", 1: "bad"}.get(rc, "skip")
        return Step("", verdict, f"`rocforge verify` exited {rc}", {"exit_code": rc})
    return test


def bench_figure(prefix: Path, model: str, metric: str, root: str | None) -> float | None:
    """The build's t/s for the metric (llama-bench through `rocforge bench --json`)."""
    import json

    test, n = METRICS[metric]
    rc, out = rocforge_cli(["bench", str(prefix), "--model", model, "--no-gate", "--json",
                            "-p", "512" if test == "pp" else "0",
                            "-n", "128" if test == "tg" else "0"], root)
    try:
        rows = json.loads(out)
    except ValueError:
        return None
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get("test") == test and r.get("status") == "ok" and \
                r.get("n_prompt" if test == "pp" else "n_gen") == n and \
                isinstance(r.get("t_s"), (int, float)) and math.isfinite(r["t_s"]):
            return float(r["t_s"])
    return None


def bench_test(model: str, metric: str, baseline: float, pct: float,
               root: str | None) -> Callable[[Path], Step]:
    def test(prefix: Path) -> Step:
        figure = bench_figure(prefix, model, metric, root)
        if figure is None:
            return Step("", "skip", f"no {metric} figure from `rocforge bench`")
        change = (figure - baseline) / baseline * 100
        verdict = "bad" if change < -pct else "good"
        return Step("", verdict, f"{metric} {figure:.2f} t/s ({change:+.1f}% against the good "
                    f"ref's {baseline:.2f})", {metric: figure, "change_pct": round(change, 2)})
    return test


def _from_gate(g: Gate) -> Step:
    verdict = {"pass": "good", "fail": "bad"}.get(g.verdict, "skip")
    return Step("", verdict, g.detail, g.figures)
