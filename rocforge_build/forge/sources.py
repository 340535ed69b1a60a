"""Fetch a recipe's source into the cache: a git URL + ref, a tarball URL + sha256, or a local
tree / offline mirror given with `--source PATH|URL`.

Each source gets an *identity* — the git commit, the tarball's sha256, or a hash over a local
tree's file names, sizes and mtimes — computed cheaply before anything is fetched, so a no-op
build can stop early.  Pristine trees live in `paths.cache_dir()/sources/`; builds work on a
synced copy (see `sync_tree`) so patches never touch the cache or the user's own tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from rocforge_build import ownership, paths
from rocforge_build.download import sha256_file
from rocforge_build.errors import IntegrityError, NetworkError, UsageError
from rocforge_build.forge.cleanup import claim_cache_root
from rocforge_build.ownership import COMPLETE, MARK, write_mark
from rocforge_build.proc import GIT_ALLOW_PROTOCOL, PROBE, CommandFailed, run
from rocforge_build.progress import Heartbeat
from rocforge_build.refs import check_git_ref, check_git_url

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar", ".tar.zst")
_SKIP = {".git", "__pycache__"}


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "git" | "tarball" | "local"
    location: str  # URL or host path
    ref: str | None = None
    sha256: str | None = None
    subdir: str | None = None
    sparse: tuple[str, ...] = ()  # git: shallow, blob-less, sparse (cone) checkout of these paths
    submodules: bool = False  # git: shallow submodules too

    @property
    def checkout(self) -> bool:
        """Fetched as a real (partial, shallow) checkout rather than an exported archive."""
        return self.kind == "git" and bool(self.sparse or self.submodules)

    def to_json(self) -> dict:
        d = {k: v for k, v in vars(self).items() if v not in (None, (), False)}
        if self.sparse:
            d["sparse"] = list(self.sparse)
        return d


@dataclass(frozen=True)
class Fetched:
    spec: SourceSpec
    identity: str  # commit / sha256 / tree hash ("" when only the download tells)
    root: Path  # the fetched top directory (pristine)
    tree: Path  # the CMake project (root / subdir)
    commit: str | None = None
    # False: a dry run's stand-in for a remote source that is not in the cache (nothing is
    # downloaded; root and tree are where the fetch will put it)
    read: bool = True

    def to_json(self) -> dict:
        d = self.spec.to_json()
        d["identity"] = self.identity
        if self.commit:
            d["commit"] = self.commit
        d["tree"] = str(self.tree)
        if not self.read:
            d["fetched"] = False
        return d


def _is_tarball(name: str) -> bool:
    return name.lower().endswith(_TAR_SUFFIXES)


def _git_subdir(rs) -> str | None:
    """Where the project lives in a git source: the recipe's `subdir` where git is how the recipe
    gets its source (a sparse monorepo, or git alone); where it also has a tarball `url`, the subdir
    describes that tarball (llama-cpp: the llama-cpp-python sdist's vendor/llama.cpp), and a git
    source is the project itself (llama.cpp), as the recipe's own `git` with --ref already is."""
    return rs.subdir if rs.sparse or not rs.url else None


def spec_for(recipe, *, ref: str | None = None, source: str | None = None) -> SourceSpec:
    """The source to use: `--source` beats `--ref` beats the recipe's default."""
    if ref is not None:  # it becomes a git argument: a ref such as `--upload-pack=CMD` never may
        check_git_ref(ref)
    rs = recipe.source
    git_extra = {"sparse": rs.sparse, "submodules": rs.submodules}
    if source:
        parsed = urlparse(source)
        if parsed.scheme in ("http", "https"):
            if _is_tarball(parsed.path) or not source.endswith(".git"):
                if not _is_tarball(parsed.path):
                    raise UsageError(f"--source {source}: not a tarball URL (.tar.gz, .tar.xz, ...)",
                                     "give a tarball URL, a git URL ending in .git, or a local path")
                sha = rs.sha256 if source == rs.url else None
                return SourceSpec("tarball", source, sha256=sha, subdir=rs.subdir)
            return SourceSpec("git", source, ref=ref or rs.ref, subdir=_git_subdir(rs), **git_extra)
        if parsed.scheme in ("git", "ssh") or source.startswith("git+"):
            url = source.removeprefix("git+")  # git+ext::CMD would be ext::CMD: never
            check_git_url(url, "--source")
            return SourceSpec("git", url, ref=ref or rs.ref, subdir=_git_subdir(rs), **git_extra)
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else source).expanduser()
        from rocforge_build import userpath  # missing, a link loop, a FIFO, socket or device

        userpath.require(path, "--source", ("file", "directory"),
                         hint="give a source tree, a tarball or a URL")
        path = path.resolve()
        if path.is_file():
            if not _is_tarball(path.name):
                raise UsageError(f"--source {source}: a file source must be a tarball")
            return SourceSpec("tarball", str(path), subdir=rs.subdir)
        if ref:  # a local git repository at a given ref
            return SourceSpec("git", str(path), ref=ref, subdir=_git_subdir(rs), **git_extra)
        sub = rs.subdir if rs.subdir and (path / rs.subdir).is_dir() else None
        require_project(path / sub if sub else path, f"--source {source}")
        return SourceSpec("local", str(path), subdir=sub)
    if ref:
        if not rs.git:
            raise UsageError(f"recipe {recipe.name} has no git source; --ref needs one",
                             "use --source URL|PATH instead")
        if rs.sparse:  # a monorepo: the project directory is part of the git source
            return SourceSpec("git", rs.git, ref=ref, subdir=rs.subdir, **git_extra)
        return SourceSpec("git", rs.git, ref=ref, submodules=rs.submodules)
    if rs.url:
        return SourceSpec("tarball", rs.url, sha256=rs.sha256, subdir=rs.subdir)
    return SourceSpec("git", rs.git, ref=rs.ref, subdir=rs.subdir, **git_extra)


# -- identity -----------------------------------------------------------------------------------

def tree_hash(tree: Path, *, recursive: bool = True) -> str:
    """Hash over relative names, sizes and mtimes of every file (stats only, no reads)."""
    entries: list[tuple[str, int, int]] = []
    stack = [str(tree)]
    base = len(str(tree)) + 1
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if recursive and e.name not in _SKIP:
                        stack.append(e.path)
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append((e.path[base:], st.st_size, st.st_mtime_ns))
    entries.sort()
    h = hashlib.sha256()
    for rel, size, mtime in entries:
        h.update(f"{rel}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


def _mirror(url: str) -> Path:
    return paths.cache_dir() / "sources" / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def _refs_file() -> Path:
    return paths.cache_dir() / "sources" / "refs.json"


def _remembered_refs() -> dict:
    try:
        data = json.loads(_refs_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_ref(url: str, ref: str, sha: str) -> None:
    """What `ref` meant the last time the remote answered: a plan or build with no network
    then works from the source cache (the commit's tree is cached by identity)."""
    refs = _remembered_refs()
    if refs.get(f"{url} {ref}") == sha:
        return
    refs[f"{url} {ref}"] = sha
    target = _refs_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(target, json.dumps(refs, indent=1, sort_keys=True))
    except OSError:
        pass  # only the offline fallback is lost


def _git_resolve(url: str, ref: str) -> str:
    if _SHA_RE.match(ref):
        return ref
    try:
        out = run(["git", "ls-remote", url, ref, f"{ref}^{{}}"], timeout=120).stdout
    except CommandFailed as exc:
        known = _remembered_refs().get(f"{url} {ref}")
        if isinstance(known, str) and _SHA_RE.match(known):  # offline: what the cache knows
            sys.stderr.write(f"rocforge: {url} is unreachable; using {ref} = {known[:12]} "
                             "from the source cache\n")
            return known
        mirror = _mirror(url)
        if mirror.is_dir():  # a mirror fetched in full knows the ref itself
            try:
                return run(["git", "-C", mirror, "rev-parse", f"{ref}^{{commit}}"]).stdout.strip()
            except CommandFailed:
                pass
        raise NetworkError(f"git ls-remote {url} {ref} failed", exc.output.strip()[-400:] or None) from exc
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in found:
            _remember_ref(url, ref, found[name])
            return found[name]
    if found:
        sha = next(iter(found.values()))
        _remember_ref(url, ref, sha)
        return sha
    raise UsageError(f"git ref {ref!r} not found in {url}", "give a tag, branch or full commit sha")


def identify(spec: SourceSpec) -> str:
    """The source's identity without fetching (git: one ls-remote; tarball: the pinned sha256)."""
    if spec.kind == "local":
        top = Path(spec.location)
        if spec.subdir:  # the project, plus the top directory's own files (version files)
            return "tree:" + hashlib.sha256((tree_hash(top / spec.subdir) + tree_hash(
                top, recursive=False)).encode()).hexdigest()
        return "tree:" + tree_hash(top)
    if spec.kind == "git":
        return _git_resolve(spec.location, spec.ref or "HEAD")
    if spec.sha256:
        return spec.sha256
    if not urlparse(spec.location).scheme:  # a local tarball file: hash it
        return sha256_file(Path(spec.location))
    return ""  # a remote tarball without a pin: known only after the download


# -- what a dry run may read: never a download ---------------------------------------------------

def is_remote(spec: SourceSpec) -> bool:
    """Whether reading the source asks a server: a tarball URL, a git URL other than a local
    path or file:// (a local repository is read in place, as a local tree is)."""
    if spec.kind == "local":
        return False
    scheme = urlparse(spec.location).scheme
    if spec.kind == "tarball":
        return scheme not in ("", "file")
    return not (scheme == "file" or (scheme == "" and Path(spec.location).exists()))


def is_pinned(recipe, spec: SourceSpec) -> bool:
    """The recipe's own tarball, by its url and sha256: its tree is known before the download."""
    rs = recipe.source
    return spec.kind == "tarball" and bool(rs.url and rs.sha256) and spec.location == rs.url \
        and spec.sha256 == rs.sha256


def without_download(spec: SourceSpec) -> Fetched:
    """The source as a dry run may read it: a local one (read, as the build will), a remote one
    already in the source cache, else a stand-in (`read=False`) — the plan then leaves what depends
    on the source's contents to after the fetch.  Never a request to a server (not even `git
    ls-remote`: a named git ref is taken as it resolved at the last fetch, and said so)."""
    if not is_remote(spec):
        return fetch(spec)
    if spec.kind == "tarball":
        sha = spec.sha256
        if sha and (_trees_dir() / sha[:20] / ".rocforge-complete").is_file():
            return _finish(spec, sha, _trees_dir() / sha[:20])
        if sha and _downloaded(spec) is not None:  # downloaded, not unpacked: unpack, no network
            return fetch(spec, sha, progress=False)
        return _stand_in(spec, sha or "")
    ref = spec.ref or "HEAD"
    commit = ref if _SHA_RE.match(ref) else _remembered_refs().get(f"{spec.location} {ref}")
    if not isinstance(commit, str) or not _SHA_RE.match(commit):
        return _stand_in(spec, "")
    if commit != ref:
        sys.stderr.write(f"rocforge: not asking {spec.location} what {ref} is now (no download): "
                         f"{ref} = {commit[:12]}, as the last fetch found it; a build asks\n")
    if spec.checkout:
        shape = hashlib.sha256(json.dumps([sorted(spec.sparse), spec.submodules]).encode()).hexdigest()
        if (_trees_dir() / f"{commit[:20]}-{shape[:8]}" / ".rocforge-complete").is_file():
            return fetch(spec, commit)
        return _stand_in(spec, commit)
    if (_trees_dir() / commit[:20] / ".rocforge-complete").is_file() or _mirror_has(spec.location, commit):
        return fetch(spec, commit)  # from the cache or the local mirror: no network
    return _stand_in(spec, commit)


def _downloaded(spec: SourceSpec) -> Path | None:
    """A pinned tarball already complete in the downloads cache (checked against its sha256)."""
    name = Path(unquote(urlparse(spec.location).path)).name or "source.tar.gz"
    dest = paths.cache_dir() / "downloads" / f"{spec.sha256[:16]}-{name}"
    return dest if dest.is_file() and sha256_file(dest) == spec.sha256 else None


def _stand_in(spec: SourceSpec, identity: str) -> Fetched:
    """What a plan says of a source it did not read: where the fetch will put it."""
    root = _trees_dir() / (identity[:20] if identity else "unfetched")
    return Fetched(spec, identity, root, root / spec.subdir if spec.subdir else root,
                   identity if spec.kind == "git" and identity else None, read=False)


# -- fetching -----------------------------------------------------------------------------------

def _trees_dir() -> Path:
    return paths.cache_dir() / "sources" / "trees"


def require_project(tree: Path, what: str) -> None:
    """Every recipe configures with CMake: a tree without CMakeLists.txt (an empty directory,
    the wrong level of a checkout) is refused before any plan, not in CMake or as a patch
    that does not apply."""
    if not (tree / "CMakeLists.txt").is_file():
        raise UsageError(f"{what}: {tree} holds no CMakeLists.txt, so there is nothing the "
                         "recipe can build", "give the project's top directory, the one "
                         "with CMakeLists.txt")


def _finish(spec: SourceSpec, identity: str, root: Path, commit: str | None = None) -> Fetched:
    tree = root / spec.subdir if spec.subdir else root
    if not tree.is_dir():
        raise UsageError(f"source {spec.location} has no directory {spec.subdir!r}")
    require_project(tree, f"source {spec.location}")
    return Fetched(spec, identity, root, tree, commit)


def _announce(spec: SourceSpec, identity: str) -> None:
    """Say what is fetched before it is: a build reads the source's build files, so an uncached
    llama.cpp costs a download of its tree; the cache makes later plans and builds offline."""
    what = spec.location + (f" @ {spec.ref or identity[:12]}" if spec.kind == "git" else "")
    sys.stderr.write(f"rocforge: fetching {what} into {paths.cache_dir() / 'sources'} "
                     "(builds read the source; later runs use this copy)\n")


def fetch(spec: SourceSpec, identity: str | None = None, *, progress: bool = True) -> Fetched:
    """Make the pristine tree available (cached by identity) and return where it is."""
    identity = identity or identify(spec)
    if spec.kind == "local":
        root = Path(spec.location)
        commit = None
        if (root / ".git").exists():
            try:
                commit = run(["git", "-C", root, "rev-parse", "HEAD"]).stdout.strip()
            except CommandFailed:
                commit = None
        return _finish(spec, identity, root, commit)
    claim_cache_root()
    dest = _trees_dir() / (identity[:20] if identity else "unpinned")
    if spec.checkout:  # one tree per commit and set of checked-out paths
        shape = hashlib.sha256(json.dumps([sorted(spec.sparse), spec.submodules]).encode()).hexdigest()
        dest = _trees_dir() / f"{identity[:20]}-{shape[:8]}"
        if not (dest / ".rocforge-complete").is_file():
            _announce(spec, identity)
            _git_checkout(spec, identity, dest, progress)
        return _finish(spec, identity, dest, identity)
    if spec.kind == "git":
        if not (dest / ".rocforge-complete").is_file():
            if not _mirror_has(spec.location, identity):
                _announce(spec, identity)
            _git_export(spec.location, identity, dest, progress)
        return _finish(spec, identity, dest, identity)
    # tarball
    if identity and (dest / ".rocforge-complete").is_file():
        return _finish(spec, identity, dest)
    archive, sha = _get_tarball(spec, progress)
    dest = _trees_dir() / sha[:20]
    if not (dest / ".rocforge-complete").is_file():
        _extract(archive, dest)
    return _finish(spec, sha, dest)


def _mirror_has(url: str, commit: str) -> bool:
    mirror = _mirror(url)
    return mirror.is_dir() and run(["git", "-C", mirror, "cat-file", "-e", f"{commit}^{{commit}}"],
                                   check=False).returncode == 0


def _git_export(url: str, commit: str, dest: Path, progress: bool = True) -> None:
    """The commit's tree from the bare mirror (fetched into it first when missing).  Not on a
    terminal, a line every interval: `git URL [step/3] ELAPSED: fetch|archive|unpack ...`."""
    ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any fetch
    mirror = _mirror(url)
    if not mirror.is_dir():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "init", "-q", "--bare", mirror])
        write_mark(mirror, "a git mirror (forge/sources.py)")
    with Heartbeat(f"git {url}", enabled=progress) as beat:
        have = run(["git", "-C", mirror, "cat-file", "-e", f"{commit}^{{commit}}"], check=False)
        if have.returncode != 0:
            beat.update(1, 3, f"git fetch --depth 1 {commit[:12]}")
            got = run(["git", "-C", mirror, "fetch", "-q", "--depth", "1", url, commit],
                      check=False, timeout=3600)
            if got.returncode != 0:  # servers that refuse a sha want: fetch everything
                beat.update(detail="git fetch --tags (every branch: the server refuses a commit want)")
                try:
                    run(["git", "-C", mirror, "fetch", "-q", "--tags", url, "+refs/heads/*:refs/heads/*"],
                        timeout=3600)
                except CommandFailed as exc:
                    raise NetworkError(f"git fetch {url} failed", exc.output.strip()[-400:] or None) from exc
        with ownership.scratch_dir(mirror.parent, ".archive-", "a git archive") as tmp:
            tarball = tmp / "src.tar"
            beat.update(2, 3, f"git archive {commit[:12]}")
            run(["git", "-C", mirror, "archive", "--format=tar", "-o", tarball, commit], timeout=3600)
            beat.update(3, 3, f"unpacking into {dest}")
            _extract(tarball, dest, strip=False)


def _git_checkout(spec: SourceSpec, commit: str, dest: Path, progress: bool = True) -> None:
    """A shallow (depth 1), blob-less partial clone of one commit with a sparse (cone) checkout of
    `spec.sparse` — a monorepo such as ROCm/rocm-libraries downloads only those directories —
    and, with `spec.submodules`, shallow submodules.  Built in a marked temporary sibling and put
    at `dest` as a whole (`ownership.install_tree`), so `dest` is complete or not stamped."""
    ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any clone
    with ownership.scratch_dir(dest.parent, ".checkout-", "a source tree (forge/sources.py)") as tmp:
        _checkout_into(tmp, spec, commit, dest, progress)


def _checkout_into(tmp: Path, spec: SourceSpec, commit: str, dest: Path, progress: bool) -> None:
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(dest.parent)}

    def git(*args, timeout=PROBE):
        return run(["git", "-C", tmp, *args], env=env, timeout=timeout)

    steps = 2 + bool(spec.submodules)  # fetch, checkout, submodules: [n/N] of the progress line
    git("init", "-q")
    git("remote", "add", "origin", spec.location)
    with Heartbeat(f"git {spec.location}", enabled=progress) as beat:
        beat.update(1, steps, f"git fetch --depth 1 --filter=blob:none {spec.ref or commit[:12]}")
        _checkout_fetch(git, spec, commit)
        if spec.sparse:
            git("sparse-checkout", "set", "--cone", *spec.sparse)
        try:
            beat.update(2, steps, f"git checkout {commit[:12]}"
                        + (f" (sparse: {', '.join(spec.sparse)})" if spec.sparse else ""))
            git("checkout", "-q", "--detach", commit, timeout=3600)
            if spec.submodules:
                beat.update(3, steps, "git submodule update --init --recursive --depth 1")
                _submodules(tmp, env)
        except CommandFailed as exc:
            raise NetworkError(f"git checkout of {commit} from {spec.location} failed",
                               exc.output.strip()[-400:] or None) from exc
    missing = [p for p in spec.sparse if not (tmp / p).is_dir()]
    if missing:
        raise UsageError(f"{spec.location} @ {commit[:12]} has no {', '.join(missing)}",
                         "the recipe's source.sparse names directories of another layout")
    (tmp / COMPLETE).write_text(f"{spec.location} {commit}\n")
    ownership.install_tree(tmp, dest, "a source tree", marks=(MARK, COMPLETE))


def _checkout_fetch(git, spec: SourceSpec, commit: str) -> None:
    """Shallow, blob-less: the commit, or its ref name where the server refuses a sha want."""
    fetch = ["fetch", "-q", "--depth", "1", "--filter=blob:none", "origin"]
    wants = [commit] + ([spec.ref] if spec.ref and spec.ref != commit else [])
    for i, want in enumerate(wants):
        try:
            git(*fetch, want, timeout=3600)
            return
        except CommandFailed as exc:
            if i == len(wants) - 1:
                raise NetworkError(f"git fetch {spec.location} {spec.ref or commit} failed",
                                   exc.output.strip()[-400:] or None) from exc


def _submodules(tree: Path, env: dict) -> None:
    """Check out the submodules (shallow).  Their URLs come from the fetched repository, not the
    user: file:// only where the user's git config allows it for submodules (protocol.file.allow
    = always; git's default refuses it since CVE-2022-39253), never a helper such as ext::."""
    allowed = run(["git", "-C", tree, "config", "--get", "protocol.file.allow"], env=env,
                  check=False).stdout.strip() == "always"
    protocols = GIT_ALLOW_PROTOCOL.split(":")
    sub_env = {**env, "GIT_ALLOW_PROTOCOL": ":".join(
        p for p in protocols if p != "file" or allowed)}
    run(["git", "-C", tree, "submodule", "update", "-q", "--init", "--recursive", "--depth", "1"],
        env=sub_env, timeout=3600)


# An unpinned URL (a --source URL: no sha256) read in this run: the up-to-date check, the
# dependencies and the plan all use the bytes of one download, never a second copy that may differ.
_unpinned: dict[str, tuple[Path, str, tuple[int, int]]] = {}


def forget_unpinned() -> None:
    """A new run (cli.main) reads unpinned URLs afresh."""
    _unpinned.clear()


def _get_tarball(spec: SourceSpec, progress: bool) -> tuple[Path, str]:
    parsed = urlparse(spec.location)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme else spec.location)
        sha = sha256_file(path)
        if spec.sha256 and sha != spec.sha256:
            raise IntegrityError(f"{path}: sha256 {sha} does not match the recipe's {spec.sha256}")
        return path, sha
    name = Path(unquote(parsed.path)).name or "source.tar.gz"
    downloads = paths.cache_dir() / "downloads"
    dest = downloads / (f"{spec.sha256[:16]}-{name}" if spec.sha256 else name)
    if spec.sha256 and dest.is_file() and sha256_file(dest) == spec.sha256:
        return dest, spec.sha256
    try:
        from rocforge_build.download import download
    except ImportError as exc:  # pragma: no cover - download.py ships with rocforge
        raise NetworkError("HTTP downloads are unavailable in this rocforge build",
                           "fetch the tarball yourself and pass --source FILE") from exc
    if not spec.sha256 and spec.location in _unpinned:
        path, sha, seen = _unpinned[spec.location]
        try:
            st = path.stat()
            if (st.st_mtime_ns, st.st_size) == seen:
                return path, sha
        except OSError:
            pass
    downloads.mkdir(parents=True, exist_ok=True)
    _announce(spec, spec.sha256 or "")
    result = download(spec.location, dest, sha256=spec.sha256, progress=progress)
    if not spec.sha256:
        st = Path(result.path).stat()
        _unpinned[spec.location] = (Path(result.path), result.sha256, (st.st_mtime_ns, st.st_size))
    return Path(result.path), result.sha256


def _extract(archive: Path, dest: Path, *, strip: bool = True) -> None:
    """Extract safely (extract.py) into a staging dir, then put it at `dest` as a whole
    (`ownership.install_tree`); a single top directory is stripped.  `dest` is complete or not
    stamped, never half-written and stamped."""
    from rocforge_build.extract import safe_extract, staging, write_own_file

    ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any work
    with staging(dest.parent, ".extract-", "a source tree being unpacked") as tmp:
        safe_extract(archive, tmp)
        top = tmp
        entries = [p for p in tmp.iterdir() if p.name != MARK]
        if strip and len(entries) == 1 and entries[0].is_dir():
            top = entries[0]
        write_own_file(top / MARK, "made by rocforge: a source tree\n")  # cache clean: ours
        write_own_file(top / COMPLETE, str(archive) + "\n")  # last, never through a link
        ownership.install_tree(top, dest, "a source tree", marks=(MARK, COMPLETE))


# -- work copies --------------------------------------------------------------------------------

def _first_copy(src: Path, dst: Path) -> bool:
    """An empty work copy is made by `cp -a` (C speed, reflinks where the filesystem has them:
    about half the time of a file-by-file copy on llama.cpp's 1,600 files); `_trimmed` then
    removes what the copy must not have (.rocforge-complete, nested _SKIP entries)."""
    entries = [str(p) for p in src.iterdir() if p.name not in _SKIP and p.name != ".rocforge-complete"]
    dst.mkdir(parents=True)
    if not entries or not shutil.which("cp"):
        return False
    res = run(["cp", "-a", "--reflink=auto", *entries, str(dst)], check=False, timeout=3600)
    return res.returncode == 0  # else the walk below copies what is missing


def _trimmed(dst: Path, made: os.stat_result) -> int:
    """After a whole-tree `cp -a`: drop the entries a work copy must not have, count the files.
    Names only, no stat per file: the copy itself was complete (cp exited 0)."""
    files = 0
    for dirpath, dirnames, filenames in ownership.walk_one_device(dst):
        for d in [d for d in dirnames if d in _SKIP]:
            dirnames.remove(d)
            _drop(os.path.join(dirpath, d), made)
        for name in filenames:
            if name == ".rocforge-complete" or name in _SKIP:
                os.unlink(os.path.join(dirpath, name))
            else:
                files += 1
    return files


def _same_bytes(a: Path, b: Path) -> bool:
    """Size and mtime alone do not tell two commits' files apart: `git archive` stamps every file
    with its commit's time (one-second steps; a rebased series shares one), so a same-size edit
    committed in the same second looks unchanged.  And a file going back to an older commit gets
    an older mtime than the objects built from the newer one, which ninja (mtime order) would
    keep.  So equal stats are confirmed by content, and every replaced file gets the current time:
    its commit time, even when newer than the file it replaces, can be older than the objects built
    from that file (a commit made a second before the last build: `rocforge bisect` and `upgrade
    --ref` move between commits, and a stale object passed a broken commit's gate)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def sync_tree(src: Path, dst: Path) -> int:
    """Make `dst` a copy of `src`, copying only files whose size or mtime differ (so unchanged
    files keep their timestamps and ninja rebuilds only what changed).  Returns files copied."""
    if not dst.exists() and _first_copy(src, dst):  # it made `dst` (no exist_ok): this run's own
        return _trimmed(dst, os.lstat(dst))
    copied = 0
    dst.mkdir(parents=True, exist_ok=True)
    wanted: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d not in _SKIP]
        rel = os.path.relpath(dirpath, src)
        out_dir = dst / rel
        out_dir.mkdir(parents=True, exist_ok=True)
        wanted.add(os.path.normpath(rel))
        for name in filenames:
            if name == ".rocforge-complete" or name in _SKIP:  # also a submodule's `.git` file:
                continue  # its gitdir (../../.git/modules/...) is not in the copy; git would fail
            s = Path(dirpath) / name
            d = out_dir / name
            wanted.add(os.path.normpath(os.path.join(rel, name)))
            if s.is_symlink():
                if d.is_symlink() and os.readlink(d) == os.readlink(s):
                    continue
                if d.exists() or d.is_symlink():
                    d.unlink()
                os.symlink(os.readlink(s), d)
                copied += 1
                continue
            st = s.stat()
            try:
                dt = d.lstat()
                if (dt.st_size == st.st_size and dt.st_mtime_ns == st.st_mtime_ns
                        and not d.is_symlink() and _same_bytes(s, d)):
                    continue
                d.unlink()
            except FileNotFoundError:
                pass
            shutil.copy2(s, d)
            os.utime(d)  # see _same_bytes: newer than anything built before this sync
            copied += 1
    for dirpath, dirnames, filenames in ownership.walk_one_device(dst):
        rel = os.path.relpath(dirpath, dst)
        for name in filenames:
            if os.path.normpath(os.path.join(rel, name)) not in wanted:
                os.unlink(os.path.join(dirpath, name))
        for name in [d for d in dirnames if os.path.normpath(os.path.join(rel, d)) not in wanted]:
            dirnames.remove(name)
            _drop(os.path.join(dirpath, name))
    return copied


def _drop(full: str, made: os.stat_result | None = None) -> None:
    """Remove an entry of a work copy: a link itself, a directory by `ownership.remove_owned`
    (inside the build's marked work dir, or the copy `made` by this run; else it stays, with a
    warning, as does a mount inside it)."""
    if os.path.islink(full):
        os.unlink(full)
    else:
        ownership.warn_left(ownership.remove_owned(full, "a directory of a work copy", first=(),
                                                   refuse=False, made=made))
