"""What rocforge keeps in its cache directory, how big and how old, and removing it safely.

Only what carries rocforge's mark is ever removable (ownership.py): the cache root must not be
`/`, HOME or above HOME (by identity: a link or bind mount of HOME is HOME), and must hold
rocforge's own CACHEDIR.TAG (its signature and rocforge's line: another tool's tag vouches for
nothing) or only names rocforge makes there; each entry of rocforge's own subdirectories (source
trees and git mirrors, downloaded tarballs, build work dirs, bisect builds, container contexts,
verify references, `rocforge env`'s answers, llama.cpp help texts) must hold the mark file
rocforge wrote when it made it, or content that proves rocforge made it (`OWNED_PROOFS`: the
caches of a rocforge that wrote no marks yet keep working), never a name alone.
Anything else is shown and never touched; a name rocforge gives beside a build prefix
(`SWAP_SIBLING`: a staged, replaced or half-deleted tree) counts as rocforge's by its mark alone,
never by its form.  An entry is also left alone, with its reason, when it is a symbolic link
(never followed: sizes come from lstat), holds or is a build prefix (a `rocforge-manifest.toml`,
a configured data or nightly directory placed inside the cache), is or holds another mounted file
system (never crossed: removal stays on one device and mount), is or holds a swap's journal
(`<prefix>.rocforge-swap`: the next build of that prefix finishes the swap from it), is or holds
rocforge's data, config or results directory, a build prefix or HOME (by st_dev and st_ino, so a
link to it is seen), cannot be
read whole, or is a work dir whose build holds its lock (forge/lock.py: listed as running;
the lock is held while the dir is removed, so no build starts in it meanwhile).

The compiler cache (ccache's or sccache's directory) is not rocforge's: it is listed, and cleaned
only on request, by asking ccache itself to evict entries older than the given age.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import ownership, paths, proc
from rocforge_build.errors import RocforgeError
from rocforge_build.forge import lock
from rocforge_build.forge.locations import CACHE_LAYOUT, CACHE_TOP, claim_cache_root, is_plain_dir
from rocforge_build.manifest_schema import MANIFEST
from rocforge_build.replace import JOURNAL
from rocforge_build.toml_subset import tomllib_parse

DAY = 86400.0
MANIFESTS = (MANIFEST, "rocforge-kernels.json")  # a build's; the kernels runner's (kernels/runner.py)
# replace.py's names beside a prefix (a prefix may be put inside the cache): rocforge's by MARK only
SWAP_SIBLING = re.compile(r".+\.rocforge-(?:new|old|previous|destdir|partial|swap)"
                          r"(?:\.deleting|\.tmp)?")
CATEGORIES = ("sources", "work", "failed", "running", "bisect", "containers", "verify",
              "llama-help", "env", "ccache")


def _head(p: Path, limit: int = 64 << 10) -> str | None:
    """The first `limit` bytes of the regular file `p` (never through a link), or None."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read(limit).decode("utf-8", "replace")


def _sha256_starts(p: Path, hex_prefix: str) -> bool:
    """Whether the regular file `p` hashes (sha256) to a digest starting with `hex_prefix`."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return False
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest().startswith(hex_prefix)


def _stamped_tree(p: Path) -> bool:
    """A source tree whose completeness stamp holds what forge/sources.py writes there."""
    return is_plain_dir(p) and ownership.valid_stamp(p / ownership.COMPLETE)


def _own_mirror(p: Path) -> bool:
    """A git mirror named, as forge/source_fetch.py names it, by the sha256 of the URL its config
    fetches from."""
    m = re.fullmatch(r"([0-9a-f]{16})\.git", p.name)
    text = _head(p / "config") if m and is_plain_dir(p) else None
    urls = re.findall(r"^\s*url\s*=\s*(.+?)\s*$", text or "", re.M)
    return any(hashlib.sha256(u.encode()).hexdigest()[:16] == m.group(1) for u in urls)


def _own_download(p: Path) -> bool:
    """A download named, as forge/sources.py names it, by the sha256 of its own bytes."""
    m = re.fullmatch(r"([0-9a-f]{16})-.+", p.name)
    return bool(m) and _sha256_starts(p, m.group(1))


def _work_plan(p: Path) -> dict | None:
    """The plan a work dir's build log starts with (forge/pipeline.py), or None."""
    head = _head(p / "rocforge-build.log", 4 << 20)
    try:
        plan, _ = json.JSONDecoder().raw_decode(head or "")
    except ValueError:
        return None
    return plan if isinstance(plan, dict) else None


def _own_work(p: Path) -> bool:
    """A work dir named, as forge/plan.work_dir names it, by the sha256 of the prefix its build
    log's plan installs into."""
    plan = _work_plan(p) if re.fullmatch(r"[0-9a-f]{12}", p.name) and is_plain_dir(p) else None
    prefix = plan.get("prefix") if plan else None
    return isinstance(prefix, str) and \
        hashlib.sha256(prefix.encode()).hexdigest()[:12] == p.name


def _own_text(p: Path) -> bool:
    m = re.fullmatch(r"text-([0-9a-f]{16})\.txt", p.name)
    return bool(m) and _sha256_starts(p, m.group(1))


def _own_env(p: Path) -> bool:
    head = _head(p, 64) if re.fullmatch(r"[0-9a-f]{8}\.sh", p.name) else None
    return head is not None and head.startswith("rocforge-envcache ")


# What rocforge made before it wrote marks, proven by what it holds, never by its name alone: a
# name is checked against the hash it was made from (the URL, the bytes, the prefix), a stamp or
# cache file against the text rocforge writes.  Entries of the other places carry the mark.
OWNED_PROOFS: dict[str, Callable[[Path], bool]] = {
    "sources/trees": _stamped_tree,
    "sources/git": _own_mirror,
    "downloads": _own_download,
    "work": _own_work,
    "verify": _own_text,
    "env": _own_env,
}


def check_root(base: Path) -> None:
    """Refuse, before anything is removed, a cache root that is not rocforge's (ownership.py)."""
    ownership.check_destructive_root(base, CACHE_TOP, "rocforge cache clean")


def owned(rel: str, path: Path) -> bool:
    """Whether the entry `path` of `rel` carries rocforge's mark, or content that proves rocforge
    made it (`OWNED_PROOFS`)."""
    try:
        if ownership.is_marked(path):
            return True
        if SWAP_SIBLING.fullmatch(path.name):
            return False  # a prefix's sibling: its mark alone says it is rocforge's to remove
        proof = OWNED_PROOFS.get(rel)
        return proof is not None and bool(proof(path))
    except OSError:
        return False


@dataclass
class Entry:
    """One thing in (or used by) the cache: its size, its last change, and whether it may go."""

    category: str
    path: Path
    size: int = 0
    newest: float = 0.0  # newest mtime of anything in it (lstat)
    kept: str | None = None  # why it is never removed; None: removable
    detail: str = ""

    def age_days(self, now: float) -> float:
        return max(0.0, (now - self.newest) / DAY) if self.newest else 0.0

    def to_json(self, now: float) -> dict:
        return {"category": self.category, "path": str(self.path), "size": self.size,
                "age_days": round(self.age_days(now), 2), "removable": self.kept is None,
                "kept": self.kept, "detail": self.detail}


def protected() -> dict[tuple[int, int], Path]:
    """rocforge's own places and HOME, which may sit inside the cache dir (or be reached from it
    through a link or a bind mount) and must never be removed: by identity (st_dev, st_ino) of
    each and of every directory above it, so an entry that is or holds one of them is seen
    whatever path leads to it."""
    from rocforge_build import config

    out = [paths.data_dir(), paths.config_dir(), paths.builds_prefix(), paths.nightly_prefix(),
           Path(os.path.expanduser("~"))]
    for more in (config.nightly_prefix, lambda: paths.results_db().parent):
        try:
            out.append(Path(more()))
        except Exception:  # a broken config file: its own commands report it
            pass
    return {ident: p for p in out for ident in ownership.identity_chain(p)}


def _measure(entry: Entry, guard: dict[tuple[int, int], Path], mounts: set[str]) -> None:
    """Size and newest mtime of `entry.path`, never following a link; sets `kept` when the
    entry must stay (link, build prefix, rocforge's data or HOME, another file system or mount,
    unreadable)."""
    top = entry.path
    try:
        st = os.lstat(top)
    except OSError as exc:
        entry.kept = f"cannot be read ({exc.strerror})"
        return
    if stat.S_ISLNK(st.st_mode):
        entry.size, entry.newest = st.st_size, st.st_mtime
        entry.kept = f"a symbolic link (to {os.readlink(top)!r}), not something rocforge makes"
        return
    absolute = Path(os.path.abspath(top))
    if (st.st_dev, st.st_ino) in guard:
        entry.kept = f"holds {guard[st.st_dev, st.st_ino]}, one of rocforge's data or install " \
                     "directories or your home"
        return
    entry.size, entry.newest = st.st_size, st.st_mtime
    if not stat.S_ISDIR(st.st_mode):
        _journal(entry, top.name, str(top), st)
        return
    dev = st.st_dev
    if str(absolute) in mounts or os.lstat(absolute.parent).st_dev != dev:
        entry.kept = "another file system is mounted there"
        return
    stack = [str(top)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                children = list(it)
        except OSError as exc:
            entry.kept = f"cannot be read whole ({exc.strerror}: {d})"
            return
        for c in children:
            try:
                cst = c.stat(follow_symlinks=False)
            except OSError as exc:
                entry.kept = f"cannot be read whole ({exc.strerror}: {c.path})"
                return
            entry.size += cst.st_size
            entry.newest = max(entry.newest, cst.st_mtime)
            if c.name in MANIFESTS and stat.S_ISREG(cst.st_mode):
                entry.kept = f"holds a build prefix ({c.path})"
                return
            if _journal(entry, c.name, c.path, cst):
                return
            if stat.S_ISDIR(cst.st_mode):
                if (cst.st_dev, cst.st_ino) in guard:
                    entry.kept = (f"holds {guard[cst.st_dev, cst.st_ino]} ({c.path}), one of "
                                  "rocforge's data or install directories or your home")
                    return
                if cst.st_dev != dev or os.path.abspath(c.path) in mounts:
                    entry.kept = f"another file system is mounted inside it ({c.path})"
                    return
                if c.name.endswith(".rocforge-new"):
                    entry.kept = f"holds a build's staged install ({c.path})"
                    return
                stack.append(c.path)


def _journal(entry: Entry, name: str, path: str, st: os.stat_result) -> bool:
    """Keep `entry` when `path` is a swap's journal (replace.py), which the next build, upgrade
    or rollback of its prefix needs to finish or undo the swap."""
    if name.endswith(JOURNAL) and stat.S_ISREG(st.st_mode):
        entry.kept = (f"holds the journal of an unfinished replacement of a build prefix ({path}): "
                      "the next build, upgrade or rollback of that prefix finishes it")
    return entry.kept is not None


def _work_state(entry: Entry) -> None:
    """`work` for a work dir whose last build installed, `failed` for one whose last build did
    not (its log's plan names a prefix whose manifest has another stamp, or none)."""
    plan = _work_plan(entry.path)
    if plan is None:
        entry.detail = "no build log"
        return
    prefix = Path(str(plan.get("prefix", "")))
    entry.detail = f"for {prefix}"
    try:
        with open(prefix / MANIFESTS[0], encoding="utf-8") as fh:
            stamp = tomllib_parse(fh.read()).get("stamp")
    except (OSError, ValueError):
        stamp = None
    if stamp is None or stamp != plan.get("stamp"):
        entry.category = "failed"
        entry.detail += " (its last build did not install)"


def scan() -> tuple[Path, list[Entry]]:
    """Every entry of rocforge's cache dir, measured; then the compiler caches."""
    base = paths.cache_dir()
    guard, mounts = protected(), ownership.mount_points()
    entries: list[Entry] = []
    try:
        top = sorted(os.listdir(base)) if base.is_dir() else []
    except OSError:
        top = []
    for name in top:
        if name not in CACHE_TOP and name != ownership.CACHEDIR_TAG:
            e = Entry("other", base / name)
            _measure(e, guard, mounts)
            e.kept = "not something rocforge makes"
            entries.append(e)
    listed: set[Path] = set()
    for category, rel, children in CACHE_LAYOUT:
        where = base / rel
        if where in listed:
            continue
        if not children:
            if os.path.lexists(where):
                entries.append(_entry(category, rel, where, guard, mounts))
            continue
        if os.path.islink(where) or (where.parent != base and os.path.islink(where.parent)):
            entries.append(Entry(category, where, kept="a symbolic link, never followed"))
            listed.add(where)
            continue
        if not where.is_dir():
            continue
        try:
            names = sorted(os.listdir(where))
        except OSError as exc:
            entries.append(Entry(category, where, kept=f"cannot be read ({exc.strerror})"))
            continue
        for name in names:
            path = where / name
            if path in listed or (rel == "verify" and name == "refs"):
                continue
            if rel == "sources/git" or rel == "sources/trees":
                listed.add(path)
            if name == ownership.MARK or (rel == "work" and name.endswith(".lock")):
                continue  # a directory's own mark; a work dir's lock (removed with its work dir)
            entries.append(_entry(category, rel, path, guard, mounts))
    refused = ownership.root_problem(base, CACHE_TOP)
    for e in entries if refused else ():  # what `cache clean` would refuse is listed as kept
        e.kept = f"cache clean refuses {base}: {refused}"
    entries += compiler_caches(guard)
    return base, entries


def _entry(category: str, rel: str, path: Path, guard: dict, mounts: set[str]) -> Entry:
    """One entry of `rel`, measured; kept unless it carries rocforge's mark (a work dir whose
    build holds its lock: category `running`)."""
    e = Entry(category, path)
    _measure(e, guard, mounts)
    if e.kept is None and not owned(rel, path):
        e.kept = (f"carries no mark of rocforge's ({ownership.MARK}) and nothing in it proves "
                  "rocforge made it")
    if rel == "work" and e.kept is None and path.is_dir():
        _work_state(e)
        who = lock.holder(path)
        if who is not None:
            e.category = "running"
            e.kept = f"in use: {who} holds its build lock"
    return e


def _ccache_dir() -> Path | None:
    exe = shutil.which("ccache")
    if exe is None:
        return None
    try:
        out = proc.run([exe, "--get-config", "cache_dir"], check=False, stderr=subprocess.PIPE)
    except (RocforgeError, OSError):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _sccache_dir() -> Path:
    if os.environ.get("SCCACHE_DIR"):
        return Path(os.environ["SCCACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "sccache"


def compiler_caches(guard: dict) -> list[Entry]:
    """The local directories of the compiler launchers rocforge's builds use (forge/cache.py:
    ccache or sccache from PATH, each with its own default directory: rocforge sets neither)."""
    out = []
    for tool, where in (("ccache", _ccache_dir()), ("sccache", _sccache_dir())):
        if where is None or not os.path.lexists(where):
            continue
        e = Entry("ccache", where, detail=tool)
        _measure(e, {}, set())
        if e.kept is None:
            e.kept = (f"{tool}'s own directory, shared with your other builds: `cache clean "
                      "--ccache --older-than DAYS` asks ccache to evict old entries"
                      if tool == "ccache" else
                      "sccache's own directory: sccache trims it to SCCACHE_CACHE_SIZE itself")
        out.append(e)
    return out


@dataclass
class Removal:
    entry: Entry
    done: bool
    why: str


@dataclass(frozen=True, kw_only=True)
class Cleaned:
    """What one `cache clean` did (or, dry, would do): each entry it considered, the compiler
    cache's eviction when asked ((done, what happened), None when not), and the categories."""

    base: Path
    removals: tuple[Removal, ...]
    ccache: tuple[bool, str] | None
    categories: frozenset[str]
    older_than: float | None

    @property
    def freed(self) -> int:
        return sum(r.entry.size for r in self.removals if r.done)

    @property
    def failed(self) -> bool:
        """An entry that could not be removed whole, or an eviction asked with an age that failed."""
        return any(not r.done and "could not be removed" in r.why for r in self.removals) or (
            self.ccache is not None and not self.ccache[0] and self.older_than is not None)


def clean_cache(categories: set[str] | None, older_than: float | None, *, dry_run: bool, now: float) -> Cleaned:
    """`rocforge cache clean`: the cache root refused before anything is scanned unless it is
    rocforge's, then the removable entries of `categories` (None: every category but the shared
    compiler cache) older than `older_than` days removed, the root tagged as rocforge's once
    nothing in it lacks the mark, and ccache asked to evict when its category is chosen."""
    check_root(paths.cache_dir())
    base, entries = scan()
    categories = set(CATEGORIES) - {"ccache"} if not categories else categories
    done = clean(entries, categories, older_than, dry_run=dry_run, now=now)
    if not dry_run and base.is_dir():
        claim_cache_root()
    ccache = evict_ccache(older_than, dry_run) if "ccache" in categories else None
    return Cleaned(base=base, removals=tuple(done), ccache=ccache, categories=frozenset(categories),
                   older_than=older_than)


def chosen(entries: list[Entry], categories: set[str], older_than: float | None,
           now: float) -> list[Entry]:
    """The entries a clean of `categories` older than `older_than` days considers: both the dry
    run's list and the real run's come from here, so they cannot differ."""
    return [e for e in entries if e.category in categories and e.category != "ccache"
            and (older_than is None or e.age_days(now) > older_than)]


def clean(entries: list[Entry], categories: set[str], older_than: float | None, *,
          dry_run: bool, now: float | None = None) -> list[Removal]:
    """Remove the removable entries of `categories` older than `older_than` days (each at most
    once; a work dir under its build lock).  Returns what was (or would be) done to each."""
    now = time.time() if now is None else now
    out = []
    for e in chosen(entries, categories, older_than, now):
        if e.kept is not None:
            out.append(Removal(e, False, e.kept))
        elif dry_run:
            out.append(Removal(e, True, "would be removed"))
        else:
            out.append(_remove(e))
    return out


def _remove(e: Entry) -> Removal:
    held = None
    if e.category in ("work", "failed"):
        try:
            held = lock.try_acquire(e.path, "rocforge cache clean")
        except Exception as exc:  # noqa: BLE001 - the lock file cannot be made: leave it
            return Removal(e, False, f"its build lock cannot be taken ({exc})")
        if held is None:
            return Removal(e, False, "in use: a build holds its lock")
    try:
        if stat.S_ISLNK(os.lstat(e.path).st_mode):  # changed since the scan: still never followed
            return Removal(e, False, "became a symbolic link; left alone")
        left = ownership.remove_tree_one_device(e.path)
        if left:
            return Removal(e, False, f"another file system is mounted at {left[0]}: left in "
                           "place with the directories above it")
        if held is not None:
            os.unlink(lock.lock_path(e.path))  # while held: a waiting build re-opens (lock.py)
        return Removal(e, True, "removed")
    except FileNotFoundError:
        return Removal(e, True, "already gone")
    except OSError as exc:
        return Removal(e, False, f"could not be removed whole ({exc.strerror}: {exc.filename})")
    finally:
        if held is not None:
            held.release()


def evict_ccache(older_than: float | None, dry_run: bool) -> tuple[bool, str]:
    """Ask ccache to evict its entries older than `older_than` days (ccache >= 4.4,
    `--evict-older-than`); rocforge never deletes a file of the compiler cache itself."""
    if older_than is None:
        return False, ("the compiler cache is shared with your other builds: give --older-than "
                       "DAYS and ccache evicts what is older")
    exe = shutil.which("ccache")
    if exe is None:
        return False, "ccache is not on PATH; sccache trims its directory itself"
    argv = [exe, "--evict-older-than", f"{max(1, int(older_than * DAY))}s"]
    if dry_run:
        return True, f"would run: {' '.join(argv)}"
    try:
        out = proc.run(argv, check=False, timeout=600, stderr=subprocess.PIPE)
    except (RocforgeError, OSError) as exc:
        return False, f"{' '.join(argv)} did not run: {exc}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return False, f"{' '.join(argv)} failed (exit {out.returncode}): {last}"
    return True, f"ran: {' '.join(argv)}"
