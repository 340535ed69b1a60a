"""A recipe's source, one class per kind: a git URL + ref (`GitSource`), a tarball URL or file +
sha256 (`TarballSource`), or a local tree given with `--source PATH` (`LocalSource`).

Each source names its tree by an *identity* — the git commit, the tarball's sha256, or a hash over
a local tree's file names, sizes and mtimes — computed cheaply before anything is fetched, so a
no-op build can stop early.  Pristine trees live in `paths.cache_dir()/sources/` (how they get
there: forge/source_fetch.py); builds work on a synced copy (see `sync_tree`) so patches never
touch the cache or the user's own tree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlparse

from rocforge_build import ownership, paths
from rocforge_build.download import sha256_file
from rocforge_build.errors import ConfigError, IntegrityError, NetworkError, UsageError
from rocforge_build.forge import source_fetch
from rocforge_build.forge.locations import claim_cache_root
from rocforge_build.forge.source_fetch import is_commit, is_complete, trees_dir
from rocforge_build.ownership import COMPLETE, MARK
from rocforge_build.proc import PROBE, CommandFailed, run
from rocforge_build.progress import Heartbeat
from rocforge_build.refs import check_git_ref, check_git_url

_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar", ".tar.zst")
_SKIP = {".git", "__pycache__"}


class Source(ABC):
    """Where a recipe's source comes from.  Each kind knows how to name its tree before reading it
    (`identify`), bring it into the cache (`fetch`) and read it without a download
    (`without_download`), so no caller asks which kind it holds."""

    kind: ClassVar[str]  # "git" | "tarball" | "local": the name manifests and plans record
    location: str  # URL or host path
    subdir: str | None  # the CMake project inside the fetched tree

    @property
    @abstractmethod
    def remote(self) -> bool:
        """Whether reading the source asks a server."""

    @property
    def pinned_version(self) -> str | None:
        """The version the recipe declares for this very tree (its own pinned tarball), known
        before the tree is read; None for any other source."""
        return None

    @abstractmethod
    def identify(self) -> str:
        """The source's identity without fetching it."""

    @abstractmethod
    def fetch(self, identity: str | None = None, *, progress: bool = True) -> Fetched:
        """Make the pristine tree available (cached by identity) and return where it is."""

    @abstractmethod
    def without_download(self) -> Fetched:
        """The source as a dry run may read it: a local one (read, as the build will), a remote
        one already in the source cache, else a stand-in (`read=False`) — the plan then leaves
        what depends on the source's contents to after the fetch.  Never a request to a server."""

    def identified(self, identity: str) -> Fetched:
        """The source at a known `identity` as far as this host has it without a download: its
        tree from the cache, else a stand-in (`read=False`) that a store's pull needs no more of."""
        return self._stand_in(identity)

    @property
    def copies_whole_tree(self) -> bool:
        """Whether a build's work copy holds the whole fetched tree, the project being its
        `subdir`, rather than the project alone."""
        return False

    @property
    def ref_name(self) -> str | None:
        """The tag or branch the tree was fetched by, which a `git describe` of it would say."""
        return None

    def describe(self, identity: str = "") -> str:
        """The source in a few words, as a fetch announces it."""
        return self.location

    def announce(self, identity: str) -> None:
        """Say what is fetched before it is: a build reads the source's build files, so an
        uncached llama.cpp costs a download of its tree; the cache makes later plans and builds
        offline."""
        sys.stderr.write(f"rocforge: fetching {self.describe(identity)} into "
                         f"{paths.cache_dir() / 'sources'} (builds read the source; later runs "
                         "use this copy)\n")

    def check_version(self, recipe_name: str, version: str | None) -> None:
        """The tree must say the version the recipe declares for it: that version decided
        conditions before the download."""
        pinned = self.pinned_version
        if pinned and version != pinned:
            raise ConfigError(
                f"recipe {recipe_name}: source.pinned_version is {pinned}, but the pinned tarball "
                f"({self.location}) says {version or 'no version'}",
                "set pinned_version to the tarball's version (it decides `source_version` "
                "conditions before the download)")

    def to_json(self) -> dict:
        """What manifests and plans record: the kind and every field that is set."""
        d: dict = {"kind": self.kind}
        for f in fields(self):  # every kind is a dataclass
            value = getattr(self, f.name)
            if f.metadata.get("recorded", True) and value not in (None, (), False):
                d[f.name] = list(value) if isinstance(value, tuple) else value
        return d

    def _finish(self, identity: str, root: Path, commit: str | None = None) -> Fetched:
        tree = root / self.subdir if self.subdir else root
        if not tree.is_dir():
            raise UsageError(f"source {self.location} has no directory {self.subdir!r}")
        require_project(tree, f"source {self.location}")
        return Fetched(self, identity, root, tree, commit)

    def _stand_in(self, identity: str, commit: str | None = None) -> Fetched:
        """What a plan says of a source it did not read: where the fetch will put it."""
        root = trees_dir() / (identity[:20] if identity else "unfetched")
        return Fetched(self, identity, root, root / self.subdir if self.subdir else root, commit,
                       read=False)


@dataclass(frozen=True)
class Fetched:
    spec: Source
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


@dataclass(frozen=True)
class LocalSource(Source):
    """A tree on this host, read in place; its identity is a hash over its files' stats."""

    location: str
    subdir: str | None = None
    kind: ClassVar[str] = "local"

    @property
    def remote(self) -> bool:
        return False

    def identify(self) -> str:
        top = Path(self.location)
        if self.subdir:  # the project, plus the top directory's own files (version files)
            return "tree:" + hashlib.sha256((tree_hash(top / self.subdir) + tree_hash(
                top, recursive=False)).encode()).hexdigest()
        return "tree:" + tree_hash(top)

    def fetch(self, identity: str | None = None, *, progress: bool = True) -> Fetched:
        root = Path(self.location)
        commit = None
        if (root / ".git").exists():
            try:
                commit = run(["git", "-C", root, "rev-parse", "HEAD"]).stdout.strip()
            except CommandFailed:
                commit = None
        return self._finish(identity or self.identify(), root, commit)

    def without_download(self) -> Fetched:
        return self.fetch()

    def shared_identity(self, fetched: Fetched) -> tuple[str, str]:
        """(kind, identity) another machine can name this tree by, unlike `identify`'s stats: a
        clean git checkout by its commit, any other tree by a hash of its files' contents.
        NotNameable when a link of the tree leads out of it: the build reads what it points to,
        which neither a commit nor the link's text says (two machines' /opt/x differ)."""
        _links_stay_inside(Path(self.location))
        if fetched.commit and _clean_checkout(fetched.root, fetched.commit):
            return "git-checkout", fetched.commit + (f":{self.subdir}" if self.subdir else "")
        top = Path(self.location)
        if self.subdir:  # as `identify`: the project, plus the top directory's own files
            return "tree", "content:" + hashlib.sha256((content_hash(top / self.subdir) + content_hash(
                top, recursive=False)).encode()).hexdigest()
        return "tree", "content:" + content_hash(top)

    def check_copy(self, fetched: Fetched, said: dict, copy: Path, whole: bool) -> None:
        """The work copy `copy` (of the whole tree, or of `subdir` alone) is what the substitute
        key `said` ({"kind", "identity"} from `shared_identity` when the build was planned)
        names, or an IntegrityError: a tree changed between its key and its copy would be built,
        recorded and published under the key of a tree it is not."""
        kind, identity = said.get("kind"), said.get("identity")
        top = Path(self.location)
        try:
            same = self._copy_is(fetched, kind, identity, copy, whole)
        except NotNameable:  # the tree was nameable when its key was made
            same = False
        if not same:
            raise IntegrityError(f"{top}: the source tree changed while this build read it (after its "
                                 "substitute key was made, before it was copied to be built); nothing "
                                 "was built from it", "run the build again once the tree is still")

    def _copy_is(self, fetched: Fetched, kind, identity, copy: Path, whole: bool) -> bool:
        top = Path(self.location)
        if kind == "git-checkout":
            same = bool(fetched.commit) and _clean_checkout(
                fetched.root, fetched.commit, files=copy, under="" if whole else (self.subdir or ""))
        else:
            inner = copy / self.subdir if (whole and self.subdir) else copy
            if self.subdir:
                now = hashlib.sha256((content_hash(inner) + content_hash(top, recursive=False)).encode()).hexdigest()
            else:
                now = content_hash(inner)
            same = identity == "content:" + now
        return same


class NotNameable(Exception):
    """A local tree no other machine can name by its commit or contents (why: `str()`)."""


def _links_stay_inside(top: Path) -> None:
    real_top = os.path.realpath(top)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in _SKIP]
        for name in (*dirnames, *filenames):
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                continue
            real = os.path.realpath(full)
            if real != real_top and not real.startswith(real_top + os.sep):
                rel = os.fsencode(os.path.relpath(full, top)).decode("utf-8", "replace")
                raise NotNameable(f"its link {rel[:200]!r} leads out of the tree, so what the build "
                                  "reads through it is in no key")


def _clean_checkout(root: Path, commit: str | None = None, *, files: Path | None = None,
                    under: str = "") -> bool:
    """Whether the git checkout at `root` holds exactly its commit, byte for byte: every file and
    link the commit has, with its bytes and executable bit, and nothing else (`_SKIP` aside).
    Read from the files themselves, not from `git status`, which the checkout's own state can
    quiet: an ignored file, an index entry marked assume-unchanged or skip-worktree, a clean
    filter, `core.fileMode=false`, a submodule set to `ignore = all`.  A commit with submodules
    is not one tree of its own: never clean.  `files` (with `under`, the commit's directory it
    holds): a copy of the checkout to compare with the commit instead of the checkout itself."""
    try:
        commit = commit or run(["git", "-C", root, "rev-parse", "--verify", "HEAD^{commit}"]).stdout.strip()
        fmt = run(["git", "-C", root, "rev-parse", "--show-object-format"], check=False).stdout.strip() or "sha1"
        listed = run(["git", "-C", root, "ls-tree", "-r", "-z", "--full-tree", commit], check=False)
        walked = files or root
    except CommandFailed:
        return False
    if listed.returncode != 0 or fmt not in ("sha1", "sha256"):
        return False
    want: dict[str, tuple[str, str]] = {}
    for rec in listed.stdout.split("\0"):
        if not rec:
            continue
        meta, _, name = rec.partition("\t")
        mode, kind, obj = (meta.split(" ") + ["", "", ""])[:3]
        if under:
            if not name.startswith(under.strip("/") + "/"):
                continue
            name = name[len(under.strip("/")) + 1:]
        if kind != "blob" or mode not in ("100644", "100755", "120000"):
            return False  # a submodule (commit), or a mode git does not write
        want[name] = (mode, obj)

    def blob_id(data: bytes) -> str:
        return hashlib.new(fmt, b"blob %d\0" % len(data) + data).hexdigest()
    seen = 0
    for dirpath, dirnames, filenames in os.walk(walked):
        dirnames[:] = [d for d in dirnames if d not in _SKIP]
        for name in filenames:
            if name in _SKIP:
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, walked)
            if rel not in want:
                return False  # untracked or ignored: the tree is more than the commit
            mode, obj = want[rel]
            try:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    if mode != "120000" or blob_id(os.fsencode(os.readlink(full))) != obj:
                        return False
                elif not stat.S_ISREG(st.st_mode) or mode == "120000":
                    return False
                else:
                    if (mode == "100755") != bool(st.st_mode & stat.S_IXUSR):
                        return False
                    h = hashlib.new(fmt, b"blob %d\0" % st.st_size)
                    with open(full, "rb") as f:
                        while chunk := f.read(1 << 20):
                            h.update(chunk)
                    if h.hexdigest() != obj:
                        return False
            except OSError:
                return False
            seen += 1
        for d in dirnames:  # a link to a directory: os.walk lists it among the directories
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                rel = os.path.relpath(full, walked)
                if want.get(rel, ("",))[0] != "120000" or blob_id(
                        os.fsencode(os.readlink(full))) != want[rel][1]:
                    return False
                seen += 1
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return seen == len(want)  # nothing of the commit is missing


@dataclass(frozen=True)
class TarballSource(Source):
    """An archive, by URL or host path; a sha256 pins its bytes (and so its tree)."""

    location: str
    sha256: str | None = None
    subdir: str | None = None
    # the recipe's `[source] pinned_version`, on the recipe's own url with its sha256 alone; what
    # the recipe says of the tree, not where the tree comes from, so manifests do not record it
    pinned_version: str | None = field(default=None, metadata={"recorded": False})
    kind: ClassVar[str] = "tarball"

    @property
    def remote(self) -> bool:
        return urlparse(self.location).scheme not in ("", "file")

    def identify(self) -> str:
        if self.sha256:
            return self.sha256
        if not urlparse(self.location).scheme:  # a local tarball file: hash it
            return sha256_file(Path(self.location))
        return ""  # a remote tarball without a pin: known only after the download

    def fetch(self, identity: str | None = None, *, progress: bool = True) -> Fetched:
        identity = identity or self.identify()
        claim_cache_root()
        dest = trees_dir() / (identity[:20] if identity else "unpinned")
        if identity and is_complete(dest):
            return self._finish(identity, dest)
        archive, sha = _get_tarball(self, progress)
        dest = trees_dir() / sha[:20]
        if not is_complete(dest):
            source_fetch.extract(archive, dest)
        return self._finish(sha, dest)

    def without_download(self) -> Fetched:
        if not self.remote:
            return self.fetch()
        sha = self.sha256
        if sha and is_complete(trees_dir() / sha[:20]):
            return self._finish(sha, trees_dir() / sha[:20])
        if sha and self.downloaded() is not None:  # downloaded, not unpacked: unpack, no network
            return self.fetch(sha, progress=False)
        return self._stand_in(sha or "")

    def identified(self, identity: str) -> Fetched:
        if is_complete(trees_dir() / identity[:20]):
            return self._finish(identity, trees_dir() / identity[:20])
        return self._stand_in(identity)

    def download_path(self) -> Path:
        """Where a download of the URL is kept: by the pinned sha256 when there is one."""
        name = Path(unquote(urlparse(self.location).path)).name or "source.tar.gz"
        return paths.cache_dir() / "downloads" / (f"{self.sha256[:16]}-{name}" if self.sha256 else name)

    def downloaded(self) -> Path | None:
        """The pinned tarball, already complete in the downloads cache (checked by its sha256)."""
        dest = self.download_path()
        return dest if self.sha256 and dest.is_file() and sha256_file(dest) == self.sha256 else None


@dataclass(frozen=True)
class GitSource(Source):
    """A git repository at a ref: exported from a bare mirror, or (`checkout`) a shallow partial
    clone with only the `sparse` directories and, with `submodules`, shallow submodules."""

    location: str
    ref: str | None = None
    subdir: str | None = None
    sparse: tuple[str, ...] = ()  # a shallow, blob-less, sparse (cone) checkout of these paths
    submodules: bool = False  # shallow submodules too
    # the recipe's subdir where a repository may be the project or its packaging (llama-cpp-python
    # vendors llama.cpp under vendor/llama.cpp): the project is there when the fetched tree has one
    vendored: str | None = field(default=None, metadata={"recorded": False})
    kind: ClassVar[str] = "git"

    def _finish(self, identity: str, root: Path, commit: str | None = None) -> Fetched:
        for sub in (self.subdir, self.vendored):
            if sub and os.path.lexists(root / sub):  # a project read from the fetched tree only
                _inside_tree(root, root / sub, f"{self.location} @ {identity[:12]}")
        if self.vendored and not self.subdir and os.path.lexists(root / self.vendored):
            if not (root / self.vendored / "CMakeLists.txt").is_file():  # never the packaging instead
                raise UsageError(f"{self.location} @ {identity[:12]}: {self.vendored} holds no "
                                 "CMakeLists.txt (a git submodule's directory is empty in the commit's "
                                 "own files), so the project it vendors is not there to build",
                                 f"check the submodule out and give it: --source PATH/{self.vendored}")
            return dataclasses.replace(self, subdir=self.vendored, vendored=None)._finish(identity, root, commit)
        return super()._finish(identity, root, commit)

    @property
    def checkout(self) -> bool:
        """Fetched as a real (partial, shallow) checkout rather than an exported archive."""
        return bool(self.sparse or self.submodules)

    @property
    def copies_whole_tree(self) -> bool:
        """A sparse monorepo checkout: its projects reach into ../../shared/..."""
        return bool(self.sparse)

    @property
    def ref_name(self) -> str | None:
        return self.ref if self.ref and not re.fullmatch(r"[0-9a-f]{7,40}", self.ref) else None

    @property
    def remote(self) -> bool:
        """A git URL other than a local path or file:// (a local repository is read in place)."""
        scheme = urlparse(self.location).scheme
        return not (scheme == "file" or (scheme == "" and Path(self.location).exists()))

    @property
    def mirror(self) -> Path:
        """The bare mirror of the repository in the source cache (it holds its history)."""
        return source_fetch.git_mirror(self.location)

    def identify(self) -> str:
        """The commit the ref names: one `git ls-remote` (a full sha asks nothing)."""
        return source_fetch.resolve_git_ref(self.location, self.ref or "HEAD")

    def describe(self, identity: str = "") -> str:
        return f"{self.location} @ {self.ref or identity[:12]}"

    def _tree(self, commit: str) -> Path:
        """Where the commit's tree is cached: one per commit, and per set of checked-out paths."""
        if not self.checkout:
            return trees_dir() / commit[:20]
        shape = hashlib.sha256(json.dumps([sorted(self.sparse), self.submodules]).encode()).hexdigest()
        return trees_dir() / f"{commit[:20]}-{shape[:8]}"

    def fetch(self, identity: str | None = None, *, progress: bool = True) -> Fetched:
        identity = identity or self.identify()
        claim_cache_root()
        dest = self._tree(identity)
        if not is_complete(dest):
            if self.checkout:
                self.announce(identity)
                self._checkout(identity, dest, progress)
            else:
                if not source_fetch.mirror_has(self.location, identity):
                    self.announce(identity)
                source_fetch.git_export(self.location, identity, dest, progress)
        return self._finish(identity, dest, identity)

    def without_download(self) -> Fetched:
        """Not even `git ls-remote`: a named ref is taken as it resolved at the last fetch."""
        if not self.remote:
            return self.fetch()
        ref = self.ref or "HEAD"
        commit = ref if is_commit(ref) else source_fetch.remembered_commit(self.location, ref)
        if commit is None:
            return self._stand_in("")
        if commit != ref:
            sys.stderr.write(f"rocforge: not asking {self.location} what {ref} is now (no download): "
                             f"{ref} = {commit[:12]}, as the last fetch found it; a build asks\n")
        if is_complete(self._tree(commit)) or (
                not self.checkout and source_fetch.mirror_has(self.location, commit)):
            return self.fetch(commit)  # from the cache or the local mirror: no network
        return self._stand_in(commit, commit)

    def identified(self, identity: str) -> Fetched:
        if is_complete(self._tree(identity)) or (
                not self.checkout and source_fetch.mirror_has(self.location, identity)):
            return self.fetch(identity)  # from the cache or the local mirror: no network
        return self._stand_in(identity, identity)

    def _checkout(self, commit: str, dest: Path, progress: bool) -> None:
        """A shallow (depth 1), blob-less partial clone of one commit with a sparse (cone)
        checkout of `sparse` — a monorepo such as ROCm/rocm-libraries downloads only those
        directories — and, with `submodules`, shallow submodules.  Built in a marked temporary
        sibling and put at `dest` as a whole (`ownership.install_tree`), so `dest` is complete or
        not stamped."""
        ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any clone
        with ownership.scratch_dir(dest.parent, ".checkout-", "a source tree (forge/sources.py)") as tmp:
            self._checkout_into(tmp, commit, dest, progress)

    def _checkout_into(self, tmp: Path, commit: str, dest: Path, progress: bool) -> None:
        env = {"GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(dest.parent)}

        def git(*args, timeout=PROBE):
            return run(["git", "-C", tmp, *args], env=env, timeout=timeout)

        steps = 2 + bool(self.submodules)  # fetch, checkout, submodules: [n/N] of the progress line
        git("init", "-q")
        git("remote", "add", "origin", self.location)
        with Heartbeat(f"git {self.location}", enabled=progress) as beat:
            beat.update(1, steps, f"git fetch --depth 1 --filter=blob:none {self.ref or commit[:12]}")
            self._checkout_fetch(git, commit)
            if self.sparse:
                git("sparse-checkout", "set", "--cone", *self.sparse)
            try:
                beat.update(2, steps, f"git checkout {commit[:12]}"
                            + (f" (sparse: {', '.join(self.sparse)})" if self.sparse else ""))
                git("checkout", "-q", "--detach", commit, timeout=3600)
                if self.submodules:
                    beat.update(3, steps, "git submodule update --init --recursive --depth 1")
                    source_fetch.checkout_submodules(tmp, env)
            except CommandFailed as exc:
                raise NetworkError(f"git checkout of {commit} from {self.location} failed",
                                   exc.output.strip()[-400:] or None) from exc
        links_inside(tmp, f"{self.location} @ {commit[:12]}")  # as an exported tree's are
        missing = [p for p in self.sparse if not (tmp / p).is_dir()]
        if missing:
            raise UsageError(f"{self.location} @ {commit[:12]} has no {', '.join(missing)}",
                             "the recipe's source.sparse names directories of another layout")
        (tmp / COMPLETE).write_text(f"{self.location} {commit}\n")
        ownership.install_tree(tmp, dest, "a source tree", marks=(MARK, COMPLETE))

    def _checkout_fetch(self, git, commit: str) -> None:
        """Shallow, blob-less: the commit, or its ref name where the server refuses a sha want."""
        fetch = ["fetch", "-q", "--depth", "1", "--filter=blob:none", "origin"]
        wants = [commit] + ([self.ref] if self.ref and self.ref != commit else [])
        for i, want in enumerate(wants):
            try:
                git(*fetch, want, timeout=3600)
                return
            except CommandFailed as exc:
                if i == len(wants) - 1:
                    raise NetworkError(f"git fetch {self.location} {self.ref or commit} failed",
                                       exc.output.strip()[-400:] or None) from exc


# -- which source a build uses ------------------------------------------------------------------

def _is_tarball(name: str) -> bool:
    return name.lower().endswith(_TAR_SUFFIXES)


def _git_subdir(rs) -> dict:
    """Where the project lives in a git source the user names: the recipe's `subdir` where git is
    how the recipe gets its source (a sparse monorepo, or git alone); where it also has a tarball
    `url`, the subdir describes that tarball (llama-cpp: the llama-cpp-python sdist's
    vendor/llama.cpp) and the repository is the project itself (llama.cpp) -- or that packaging's
    own repository, which vendors it there (`vendored`: decided by the fetched tree)."""
    return {"subdir": rs.subdir} if rs.sparse or not rs.url else {"vendored": rs.subdir}


def _own_tarball(rs) -> TarballSource:
    """The recipe's own tarball: its sha256 pins the tree, so its declared version is known."""
    return TarballSource(rs.url, sha256=rs.sha256, subdir=rs.subdir,
                         pinned_version=rs.pinned_version if rs.sha256 else None)


def source_for(recipe, *, ref: str | None = None, source: str | None = None) -> Source:
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
                if source == rs.url:
                    return _own_tarball(rs)
                return TarballSource(source, subdir=rs.subdir)
            return GitSource(source, ref=ref or rs.ref, **_git_subdir(rs), **git_extra)
        if parsed.scheme in ("git", "ssh") or source.startswith("git+"):
            url = source.removeprefix("git+")  # git+ext::CMD would be ext::CMD: never
            check_git_url(url, "--source")
            return GitSource(url, ref=ref or rs.ref, **_git_subdir(rs), **git_extra)
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else source).expanduser()
        from rocforge_build import userpath  # missing, a link loop, a FIFO, socket or device

        userpath.require(path, "--source", ("file", "directory"),
                         hint="give a source tree, a tarball or a URL")
        path = path.resolve()
        if path.is_file():
            if not _is_tarball(path.name):
                raise UsageError(f"--source {source}: a file source must be a tarball")
            return TarballSource(str(path), subdir=rs.subdir)
        if ref:  # a local git repository at a given ref
            return GitSource(str(path), ref=ref, **_git_subdir(rs), **git_extra)
        sub = rs.subdir if rs.subdir and (path / rs.subdir).is_dir() else None
        require_project(path / sub if sub else path, f"--source {source}")
        return LocalSource(str(path), subdir=sub)
    if ref:
        if not rs.git:
            raise UsageError(f"recipe {recipe.name} has no git source; --ref needs one",
                             "use --source URL|PATH instead")
        if rs.sparse:  # a monorepo: the project directory is part of the git source
            return GitSource(rs.git, ref=ref, subdir=rs.subdir, **git_extra)
        return GitSource(rs.git, ref=ref, submodules=rs.submodules)
    if rs.url:
        return _own_tarball(rs)
    return GitSource(rs.git, ref=rs.ref, subdir=rs.subdir, **git_extra)


def _inside_tree(root: Path, path: Path, what: str) -> None:
    """`path` (through every link on the way) is inside the fetched tree `root`, or an IntegrityError."""
    top = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != top and not real.startswith(top + os.sep):
        raise IntegrityError(f"{what}: {os.path.relpath(path, root)} leads outside the fetched tree "
                             f"(to {real}); nothing is read or built from there",
                             "the repository is broken or hostile: build another commit or source")


def links_inside(top: Path, what: str) -> None:
    """Every symbolic link of a git checkout resolves inside it, as `extract.check_links` holds an
    exported (unpacked) tree to: git writes a commit's links as they are, absolute or `../..`."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            if os.path.islink(os.path.join(dirpath, name)):
                _inside_tree(Path(top), Path(dirpath, name), what)


def require_project(tree: Path, what: str) -> None:
    """Every recipe configures with CMake: a tree without CMakeLists.txt (an empty directory,
    the wrong level of a checkout) is refused before any plan, not in CMake or as a patch
    that does not apply."""
    if not (tree / "CMakeLists.txt").is_file():
        raise UsageError(f"{what}: {tree} holds no CMakeLists.txt, so there is nothing the "
                         "recipe can build", "give the project's top directory, the one "
                         "with CMakeLists.txt")


def _said(text: str) -> str:
    """`text` (a name or link target, as os.scandir gives it: undecodable bytes as surrogates)
    in one form no other text shares and with no newline, so the records of `content_hash` join
    into bytes that say exactly one tree: a backslash and a newline are escaped (text without
    either, nearly every name, is as it is), undecodable bytes kept as bytes."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _special(path: str, mode: int) -> str:
    """What an entry of a source tree that is no file, link or directory is, said for people."""
    what = next((what for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                                         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
                 if test(mode)), "not a file")
    return f"{path} is {what}"


def content_hash(tree: Path, *, recursive: bool = True) -> str:
    """Hash over relative names, the executable bit and contents of every file and the target of
    every link (what a build reads, never when it was touched); `_SKIP` left out as in `tree_hash`.
    Every entry counts: a FIFO, socket or device, or a file or directory that cannot be read, is
    NotNameable (left out, the tree would have the key of a tree without it): such a tree is built,
    with no substitute key."""
    entries: list[tuple[str, str]] = []
    stack = [str(tree)]
    base = len(str(tree)) + 1

    def unreadable(path: str, err: OSError) -> NotNameable:
        return NotNameable(f"{os.fsencode(path).decode('utf-8', 'replace')[:300]} cannot be read "
                           f"({err.strerror or err}), so the tree cannot be named by its contents")
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError as e:
            raise unreadable(d, e) from None
        with it:
            for e in it:
                if e.name in _SKIP or e.name == COMPLETE:
                    continue  # as `sync_tree`: never in the copy a build reads (a submodule's .git file)
                rel = _said(e.path[base:])
                try:
                    if e.is_symlink():
                        entries.append((rel, "link:" + _said(os.readlink(e.path))))
                    elif e.is_dir(follow_symlinks=False):
                        if recursive:
                            stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        mode = "x" if os.access(e.path, os.X_OK) else "-"
                        entries.append((rel, mode + sha256_file(Path(e.path))))
                    else:  # no build reads one; the tree is not named without it either
                        raise NotNameable(_special(os.fsencode(e.path).decode("utf-8", "replace")[:300],
                                                   e.stat(follow_symlinks=False).st_mode)
                                          + ", which no content hash says")
                except FileNotFoundError:
                    continue  # gone while read: the tree's key is of what is there
                except OSError as err:
                    raise unreadable(e.path, err) from None
    entries.sort()
    h = hashlib.sha256()
    for rel, what in entries:
        h.update(f"{rel}\0{what}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


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
        h.update(f"{rel}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _get_tarball(spec: TarballSource, progress: bool) -> tuple[Path, str]:
    parsed = urlparse(spec.location)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme else spec.location)
        sha = sha256_file(path)
        if spec.sha256 and sha != spec.sha256:
            raise IntegrityError(f"{path}: sha256 {sha} does not match the recipe's {spec.sha256}")
        return path, sha
    dest = spec.download_path()
    if spec.downloaded() is not None:
        return dest, spec.sha256
    try:
        from rocforge_build.download import download
    except ImportError as exc:  # pragma: no cover - download.py ships with rocforge
        raise NetworkError("HTTP downloads are unavailable in this rocforge build",
                           "fetch the tarball yourself and pass --source FILE") from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    spec.announce(spec.sha256 or "")
    result = download(spec.location, dest, sha256=spec.sha256, progress=progress)
    return Path(result.path), result.sha256


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
            if not stat.S_ISREG(st.st_mode):  # a FIFO, socket, device: never opened (a FIFO's read
                wanted.discard(os.path.normpath(os.path.join(rel, name)))  # blocks for ever), not copied
                continue
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
