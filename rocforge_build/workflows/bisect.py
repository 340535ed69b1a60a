"""`rocforge bisect`: find the first bad candidate between a good and a bad one.

Three axes: the first-parent commits of a git source (`--good REF --bad REF`); the released
versions of a tarball or sdist source (`--versions V1,V2,...`, each version's tarball from a URL
or path template); and TheRock nightlies for one fixed source (`--nightlies V1,V2,...`, each step
built against that nightly's ROCm, installed beside the others on first use).  The search, the
cached builds, the skips and the bound below are the same on every axis.

The candidates are `git rev-list --first-parent GOOD..BAD` (oldest first; BAD is the last).  BAD is
built and tested first (a bisect whose bad ref tests good would name a wrong commit), then a binary
search over the rest: with no skips at most ceil(log2 n) + 1 builds for n candidates, and one
more, GOOD's, for `--bench` (its baseline) and for `--verify` without `--reference` (the fixed
reference every step is compared with).  Each step is an ordinary pipeline build into its own prefix
under the cache dir, named by commit: a second bisect over the same range finds those builds up to
date (the plan's stamp), and the compiler cache makes the new ones cheap; the step's work dir is
removed after a build that installs (the install is what the test needs; a failed one keeps its log).  A step whose test exits 125, or
whose build fails, is skipped and its nearest untested neighbour is tried instead, as
`git bisect run` does.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from rocforge_build import ownership
from rocforge_build.errors import BuildError, UsageError
from rocforge_build.forge import sources
from rocforge_build.forge.locations import own_builds_dir
from rocforge_build.forge.plan import Request, work_dir
from rocforge_build.proc import CommandFailed, run
from rocforge_build.refs import check_git_ref
from rocforge_build.rootfs import Root
from rocforge_build.workflows.upgrade import Gate, rocforge_cli, run_gate

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
    spec = sources.source_for(recipe, ref=good, source=source)
    if not isinstance(spec, sources.GitSource):
        raise UsageError(f"bisect needs a git source; {spec.location} is a {spec.kind}",
                         "give --source a git repository (a URL or a local clone)")
    return spec.location


def candidates(location: str, good: str, bad: str) -> tuple[list[str], dict[str, str]]:
    """First-parent commits after `good` up to `bad`, oldest first, with their subjects."""
    for ref, option in ((good, "--good"), (bad, "--bad")):
        check_git_ref(ref, option)
    good_sha = sources.GitSource(location, ref=good).identify()
    bad_sha = sources.GitSource(location, ref=bad).identify()
    mirror = sources.GitSource(location).mirror
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

            local = _local_path(location)
            if local is not None:  # no network was involved: the directory is not a repository
                said = (exc.output.strip().splitlines() or ["git fetch failed"])[0]
                raise UsageError(f"{location}: bisect needs a git repository, and git cannot "
                                 f"read one there ({said})", "give --source a clone (a directory "
                                 "with .git) or a git URL") from None
            raise NetworkError(f"git fetch {location} failed",
                               exc.output.strip()[-400:] or None) from exc
    for sha, ref, option in ((good_sha, good, "--good"), (bad_sha, bad, "--bad")):
        if run(["git", "-C", mirror, "cat-file", "-e", f"{sha}^{{commit}}"],
               check=False).returncode != 0:
            raise UsageError(f"{option} {ref}: no such commit in {location}",
                             "give a commit, tag or branch of that repository (`git log` there)")
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


def _local_path(location: str) -> str | None:
    """The directory a git location names on this machine (a path or a file:// URL), else None."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme or ":" in location.split("/", 1)[0]:  # a URL, or scp-like host:path
        return None
    return location


# -- the versions axis ----------------------------------------------------------------------------

# A version becomes part of a URL, a file name and a cache directory name: letters, digits and
# `._+~-`, starting with a letter or digit, never `..` (PEP 440 versions and TheRock's all fit).
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,99}")
_TARBALL_NAME = re.compile(r"(?P<name>.+?)-(?P<version>\d[^/]*?)"
                           r"(?P<ext>\.tar\.gz|\.tgz|\.tar\.xz|\.tar\.bz2|\.tar\.zst|\.tar)$")
PYPI_FILES = "files.pythonhosted.org"


def version_list(text: str, option: str) -> list[str]:
    """`V1,V2,...` in the order given (oldest first): each a version, no repeats, at least two."""
    items = [v.strip() for v in text.split(",")]
    for v in items:
        if not VERSION_RE.fullmatch(v) or ".." in v:
            raise UsageError(f"{option}: {v!r} is not a version (letters, digits and ._+~- "
                             "only, starting with a letter or digit)",
                             f"give {option} a comma-separated list, oldest first, e.g. "
                             f"{option} 0.3.7,0.3.8,0.3.9")
    repeated = sorted({v for v in items if items.count(v) > 1})
    if repeated:
        raise UsageError(f"{option} names {', '.join(repeated)} more than once")
    if len(items) < 2:
        raise UsageError(f"{option} needs at least two versions: a good one and a later bad one")
    return items


def version_span(items: list[str], good: str | None, bad: str | None,
                 option: str) -> tuple[str, list[str]]:
    """(the good version, the candidates after it up to the bad one): good defaults to the first
    version, bad to the last; both must be in the list, good before bad."""
    for value, flag in ((good, "--good"), (bad, "--bad")):
        if value is not None and value not in items:
            raise UsageError(f"{flag} {value!r} is not in {option}",
                             f"name one of {', '.join(items)}")
    g = items.index(good) if good is not None else 0
    b = items.index(bad) if bad is not None else len(items) - 1
    if b <= g:
        raise UsageError(f"--good {items[g]} does not come before --bad {items[b]} in {option}",
                         f"{option} lists versions oldest first")
    return items[g], items[g + 1:b + 1]


def version_template(recipe, source: str | None) -> str:
    """Where each version's tarball is: `--source` with `{version}` in it, else the recipe's
    tarball URL with its version replaced (a PyPI file URL becomes PyPI's predictable source URL,
    https://docs.pypi.org/api/#predictable-urls, since its own path is a hash)."""
    if source is not None:
        rest = source.replace("{version}", "")
        if "{version}" not in source or "{" in rest or "}" in rest:
            raise UsageError(f"--source {source!r}: with --versions it is a template holding "
                             "{version} (and no other braces)",
                             "e.g. --source 'https://example.org/proj-{version}.tar.gz'")
        return source
    url = recipe.source.url
    if not url:
        raise UsageError(f"recipe {recipe.name} has a git source: bisect its commits with --good "
                         "and --bad, or give --source a tarball template holding {version}")
    parsed = urlparse(url)
    name = parsed.path.rsplit("/", 1)[-1]
    m = _TARBALL_NAME.fullmatch(name)
    if not m:
        raise UsageError(f"recipe {recipe.name}'s tarball {name} has no version in its name",
                         "give --source a template holding {version}")
    if parsed.netloc == PYPI_FILES:
        project = m.group("name")
        return (f"https://{PYPI_FILES}/packages/source/{project[0]}/{project}/"
                f"{project}-{{version}}{m.group('ext')}")
    return url[:len(url) - len(name)] + f"{m.group('name')}-{{version}}{m.group('ext')}"


def version_source(template: str, version: str) -> str:
    return template.replace("{version}", version)


def check_version_files(template: str, versions: list[str]) -> None:
    """A template naming local files: every version's file exists (found now, not mid-search)."""
    if urlparse(template).scheme in ("http", "https"):
        return
    for v in versions:
        where = version_source(template, v)
        path = Path(urlparse(where).path if where.startswith("file:") else where).expanduser()
        if not path.is_file():
            raise UsageError(f"--versions {v}: {where} is not a file",
                             "every version in the list needs its tarball")


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
        raise UsageError(f"--bad {short(commits[-1])} does not test bad ({last.verdict}: "
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

def step_prefix(recipe: str, target: str, backend: str | None, name: str) -> Path:
    """A step's cached build: `name` is the commit's first 12 digits, `v-VERSION` or
    `nightly-VERSION`."""
    return own_builds_dir("bisect") / f"{recipe}-{target}-{backend or 'default'}" / name


def short(ref: str) -> str:
    """A commit shortened to 12 digits; a version as it is."""
    return ref[:12] if re.fullmatch(r"[0-9a-f]{40}", ref) else ref


def build_step(req: Request, root) -> tuple[bool, str | None]:
    """Build one step (up to date when an earlier bisect built it); (built, failure or None)."""
    from rocforge_build.forge import pipeline

    try:
        out = pipeline.build(req, root, quiet=True)
    except BuildError as exc:  # the work dir stays: the message names its log (`rocforge cache clean --failed`)
        return True, exc.message.splitlines()[0]
    ownership.discard(work_dir(Path(req.prefix)), "a bisect step's build work dir")
    return out.status in ("built", "substituted"), None


def run_test(argv: list[str]) -> Callable[..., Step]:
    def test(prefix: Path, environ: Mapping[str, str] | None = None) -> Step:
        g = run_gate(argv, prefix, environ=environ)
        return _from_gate(g)
    return test


def verify_test(model: str, reference: Path, root: str | None) -> Callable[..., Step]:
    """Each step against one fixed reference (the good ref's build unless --reference): verify's own
    default, the CPU build of the step's own commit, is the step itself when the bisect builds the
    CPU backend, and a commit that breaks the CPU path would pass against itself."""
    def test(prefix: Path, environ: Mapping[str, str] | None = None) -> Step:
        rc, _ = rocforge_cli(["verify", str(prefix), "--model", model, "--reference", str(reference),
                              "--json"], root, environ=environ)
        verdict = {0: "good", 1: "bad"}.get(rc, "skip")
        return Step("", verdict, f"`rocforge verify` against {reference.name} exited {rc}",
                    {"exit_code": rc})
    return test


def bench_figure(prefix: Path, model: str, metric: str, root: str | None,
                 environ: Mapping[str, str] | None = None) -> float | None:
    """The build's t/s for the metric (llama-bench through `rocforge bench --json`)."""
    import json

    test, n = METRICS[metric]
    rc, out = rocforge_cli(["bench", str(prefix), "--model", model, "--no-gate", "--json",
                            "-p", "512" if test == "pp" else "0",
                            "-n", "128" if test == "tg" else "0"], root, environ=environ)
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
               root: str | None) -> Callable[..., Step]:
    def test(prefix: Path, environ: Mapping[str, str] | None = None) -> Step:
        figure = bench_figure(prefix, model, metric, root, environ)
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


# -- one bisect as asked --------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTest:
    """How each step is tested, as asked: --run CMD, --verify GGUF (against --reference), or
    --bench GGUF with --metric and --threshold."""
    run: str | None = None
    verify: str | None = None
    reference: str | None = None
    bench: str | None = None
    metric: str | None = None
    threshold: float | None = None

    def words(self) -> str:
        """The test's part of the command line, quoted (the report's reproduction)."""
        if self.run:
            return f"--run {shlex.quote(self.run)}"
        if self.verify:
            return f"--verify {shlex.quote(self.verify)}" + (
                f" --reference {shlex.quote(self.reference)}" if self.reference else "")
        return (f"--bench {shlex.quote(self.bench)} --metric {self.metric}"
                + (f" --threshold {self.threshold:g}" if self.threshold is not None else ""))

    @property
    def programs(self) -> tuple[str, ...]:
        """What each step's build makes: the program the test runs and no more (a whole llama.cpp
        tree is every example and tool)."""
        return ("llama-perplexity",) if self.verify else ("llama-bench",) if self.bench else ()


@dataclass(frozen=True)
class Asked:
    """One bisect as the command line gave it: what is built, the axis (git, versions or
    nightlies) with its bounds and list as typed, and the step test."""
    recipe: str
    target: str
    backend: str | None
    axis: str
    source: str | None
    good: str | None
    bad: str | None
    listed: str | None  # --versions or --nightlies as given
    test: StepTest


@dataclass
class Axis:
    """The candidates of one bisect: what each is called, where its source comes from."""
    location: str
    good: str
    commits: list[str]
    subjects: dict[str, str]
    names: dict[str, str]  # candidate -> its step prefix's name
    source_of: dict[str, tuple]  # candidate -> (--source, --ref) of its build
    what: str
    nightlies: object = None


def axis_candidates(asked: Asked, recipe, good: str | None, listed: list[str] | None) -> Axis:
    """The candidates on the asked axis (`good` and `listed`: the versions checked from the list,
    None for git), each with its source, its step name and a line saying what it is."""
    if asked.axis == "git":
        location = git_location(recipe, asked.source, asked.good)
        commits, subjects = candidates(location, asked.good, asked.bad)
        good = sources_sha(location, asked.good)
        return Axis(location, good, commits, subjects, {c: c[:12] for c in [good, *commits]},
                    {c: (asked.source, c) for c in [good, *commits]},
                    f"first-parent commits after {asked.good} up to {asked.bad}")
    if asked.axis == "versions":
        location = version_template(recipe, asked.source)
        check_version_files(location, [good, *listed])
        source_of = {v: (version_source(location, v), None) for v in [good, *listed]}
        for where, _ in source_of.values():  # each one a tarball rocforge can fetch, checked now
            _tarball_spec(recipe, where)
        return Axis(location, good, listed, {v: source_of[v][0] for v in listed},
                    {v: f"v-{v}" for v in [good, *listed]}, source_of,
                    f"versions after {good} up to {listed[-1]}")
    _rocm_backend(recipe, asked.backend)
    source, ref = _fixed_source(recipe, asked.source)
    location = source or recipe.name
    nightlies = _nightlies(asked.target, [good, *listed])
    return Axis(location, good, listed, {v: nightlies.describe(v) for v in listed},
                {v: f"nightly-{v}" for v in [good, *listed]}, {v: (source, ref) for v in [good, *listed]},
                f"TheRock nightlies after {good} up to {listed[-1]}, source {location}", nightlies)


def _tarball_spec(recipe, where: str) -> None:
    spec = sources.source_for(recipe, source=where)
    if not isinstance(spec, sources.TarballSource):
        raise UsageError(f"--versions: {where} is a {spec.kind} source, not a tarball",
                         "give --source a tarball URL or file holding {version}")


def _fixed_source(recipe, source: str | None) -> tuple[str | None, str | None]:
    """The nightly axis's one source: a git source pinned to one commit now (every step builds
    the same tree), anything else as given."""
    spec = sources.source_for(recipe, source=source)
    if isinstance(spec, sources.GitSource):
        return source, spec.identify()
    return source, None


def _nightlies(target: str, versions: list[str]):
    """Each version's tree: installed, or found in the configured sources (checked now)."""
    from rocforge_build import config
    from rocforge_build.discover import targets
    from rocforge_build.nightly import axis

    name = targets.get_target(target).name
    cfg = config.effective()
    return axis.plan(versions, name, cfg, config.nightly_prefix(cfg))


def _rocm_backend(recipe, backend: str | None) -> None:
    """--nightlies with a --backend that does not build with ROCm: refused before anything."""
    be = recipe.backends.get(backend) if backend is not None else None
    if be is not None and be.toolchain != "hip":
        raise UsageError(f"--nightlies: backend {backend} builds with the {be.toolchain} "
                         "toolchain, not a ROCm one", "give --backend a backend whose toolchain "
                         "is hip")


def sources_sha(location: str, ref: str) -> str:
    return sources.GitSource(location, ref=ref).identify()


def check_uses_rocm(prefix: Path, rocm: str) -> None:
    """A nightly step's build must have been made with that nightly's ROCm: a backend of the
    host toolchain would make every step the same build."""
    from rocforge_build.discover.builds import read_manifest

    tc = (read_manifest(prefix) or {}).get("toolchain")
    used = tc.get("rocm_path") if isinstance(tc, dict) else None
    if not isinstance(used, str) or os.path.realpath(used) != os.path.realpath(rocm):
        kind = tc.get("kind") if isinstance(tc, dict) else None
        raise UsageError(f"--nightlies: the build at {prefix} does not use the nightly's ROCm "
                         f"(its toolchain is {kind or 'unknown'}), so every step would be the "
                         "same build", "give --backend a backend whose toolchain is hip")


def oracle(test: StepTest, argv: list[str] | None, good: str, good_given: str | None, model: str | None,
           pct: float, root: str | None, build: Callable[[str], tuple[bool, str | None]],
           prefix_of: Callable[[str], Path],
           environ_of: Callable[[str], Mapping[str, str] | None] = lambda key: None
           ) -> Callable[..., Step]:
    """The test each step's build gets: --run's program; --verify against --reference or the good
    ref's build; --bench against the good ref's figure (`build` makes the good ref's build first)."""
    if argv:
        return run_test(argv)
    if test.verify and test.reference:
        return verify_test(model, Path(test.reference).absolute(), root)
    built, failed = build(good)  # the good ref's build is the reference or the baseline
    if failed:
        raise UsageError(f"--good {good_given or good} does not build: {failed}")
    if test.verify:
        return verify_test(model, prefix_of(good), root)
    baseline = bench_figure(prefix_of(good), model, test.metric, root, environ_of(good))
    if not baseline:
        raise UsageError(f"--good {good_given or good} gave no {test.metric} figure",
                         "check the model with `rocforge bench` on that build")
    return bench_test(model, test.metric, baseline, pct, root)


# -- one bisect, run ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bisection:
    """One bisect with every flag checked, made once by `rocforge bisect` before anything is
    fetched or built: what was asked, the versions checked from the list (None on the git axis),
    how each step is built (jobs, the root) and tested (--run's words, the model, the threshold)."""
    asked: Asked
    good: str | None  # --versions/--nightlies: the good version from the list
    listed: tuple[str, ...] | None  # --versions/--nightlies: the candidates after it
    rootfs: Root
    root_arg: str | None  # --root as given for each test's `rocforge` run; None on the host
    jobs: int | None
    run_argv: tuple[str, ...] | None
    model: str | None  # --verify/--bench's model, its real path
    pct: float  # --bench: slower than the good ref by more than this percent is bad


@dataclass(frozen=True)
class Candidate:
    """One candidate's step: its build request (its own prefix, source and ref) and, on the
    nightly axis, the nightly's ROCm it is built with, set as ROCM_PATH in the request only, so
    the build and its test see that tree and never this process's."""
    key: str
    request: Request
    rocm: str | None = None

    @property
    def prefix(self) -> Path:
        return Path(self.request.prefix)


def candidate(bisection: Bisection, recipe_name: str, ax: Axis, key: str) -> Candidate:
    """The step of candidate `key` (the nightly axis installs its nightly on first use)."""
    asked = bisection.asked
    prefix = step_prefix(recipe_name, asked.target, asked.backend, ax.names[key])
    rocm = str(ax.nightlies.tree(key)) if asked.axis == "nightlies" else None
    source, ref = ax.source_of[key]
    request = Request(recipe=asked.recipe, target=asked.target, backend=asked.backend, ref=ref,
                      source=source, prefix=str(prefix), jobs=bisection.jobs,
                      environ={**os.environ, "ROCM_PATH": rocm} if rocm is not None else None,
                      build_targets=asked.test.programs, made_for="bisect")
    return Candidate(key, request, rocm)


def build_candidate(c: Candidate, root: Root) -> tuple[bool, str | None]:
    """The step's build (`build_step`); a nightly step's is checked to use that nightly's ROCm."""
    built, failed = build_step(c.request, root)
    if not failed and c.rocm is not None:
        check_uses_rocm(c.prefix, c.rocm)
    return built, failed


@dataclass(frozen=True)
class Bisected:
    """What a bisect found: its candidates as the axis gave them, and the search's result."""
    axis: Axis
    result: Result


def find_first_bad(bisection: Bisection, say: Callable[[str], None]) -> Bisected:
    """The candidates on the asked axis, the good ref's build first where the test compares with
    it, then the search, each step built and tested as it was built; `say` hears each step."""
    from rocforge_build.forge import recipes

    asked, test = bisection.asked, bisection.asked.test
    recipe = recipes.load(asked.recipe)
    ax = axis_candidates(asked, recipe, bisection.good,
                         list(bisection.listed) if bisection.listed is not None else None)
    reference = "" if test.run or test.reference else (
        ", and the good ref's build first (the reference)" if test.verify
        else ", and the good ref's build first (the baseline)")
    say(f"{len(ax.commits)} {ax.what}; at most {max_builds(len(ax.commits))} builds "
        f"without skips{reference}")

    def step_of(key: str) -> Candidate:
        return candidate(bisection, recipe.name, ax, key)

    check = oracle(test, list(bisection.run_argv) if bisection.run_argv is not None else None,
                   ax.good, asked.good, bisection.model, bisection.pct, bisection.root_arg,
                   lambda key: build_candidate(step_of(key), bisection.rootfs),
                   lambda key: step_of(key).prefix, lambda key: step_of(key).request.environ)

    def tested(key: str) -> Step:
        c = step_of(key)
        built, failed = build_candidate(c, bisection.rootfs)
        step = (Step(key, "skip", f"build failed: {failed}") if failed
                else check(c.prefix, c.request.environ))  # the step runs as it was built
        step.ref, step.built, step.prefix = key, built or bool(failed), c.request.prefix
        say(f"{short(key)} {step.verdict}: {step.detail}  ({ax.subjects.get(key, '')})")
        return step

    steps, index, suspects = search(ax.commits, tested)
    return Bisected(ax, Result(ax.commits, ax.subjects, steps,
                               ax.commits[index] if index is not None else None, suspects))
