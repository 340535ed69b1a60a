"""What rocforge keeps in its cache directory, how big and how old, and removing it safely.

Only what carries rocforge's mark is ever removable (ownership.py): the cache root must not be
`/`, HOME or above HOME, and must hold rocforge's CACHEDIR.TAG or only names rocforge makes there;
each entry of rocforge's own subdirectories (source trees and git mirrors, downloaded tarballs,
build work dirs, bisect builds, container contexts, verify references, `rocforge env`'s answers,
llama.cpp help texts) must hold the mark file rocforge wrote when it made it, or have the form
rocforge gives it (`OWNED_FORMS`: the caches of a rocforge that wrote no marks yet keep working).
Anything else is shown and never touched; a name rocforge gives beside a build prefix
(`SWAP_SIBLING`: a staged, replaced or half-deleted tree) counts as rocforge's by its mark alone,
never by its form.  An entry is also left alone, with its reason, when it is a symbolic link
(never followed: sizes come from lstat), holds or is a build prefix (a `rocforge-manifest.toml`,
a configured data or nightly directory placed inside the cache), is or holds another mounted file
system (never crossed: removal stays on one device and mount), is or holds a swap's journal
(`<prefix>.rocforge-swap`: the next build of that prefix finishes the swap from it), cannot be
read whole, or is a work dir whose build holds its lock (forge/lock.py: listed as running;
the lock is held while the dir is removed, so no build starts in it meanwhile).

The compiler cache (ccache's or sccache's directory) is not rocforge's: it is listed, and cleaned
only on request, by asking ccache itself to evict entries older than the given age.
"""

from __future__ import annotations

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
from rocforge_build.replace import JOURNAL

DAY = 86400.0
MANIFESTS = ("rocforge-manifest.toml", "rocforge-kernels.json")
# (category, directory under the cache dir, whether its entries are the directory's children)
LAYOUT = (
    ("sources", "sources/git", True),
    ("sources", "sources/trees", True),
    ("sources", "sources/refs.json", False),
    ("sources", "downloads", True),
    ("work", "work", True),
    ("bisect", "bisect", True),
    ("containers", "containers", True),
    ("verify", "verify/refs", True),
    ("verify", "verify", True),  # the model texts (text-*.txt); refs/ is listed above
    ("llama-help", "llama-help", True),
    ("env", "env", True),
)
OWN_TOP = {"sources", "downloads", "work", "bisect", "containers", "verify", "llama-help", "env"}
# replace.py's names beside a prefix (a prefix may be put inside the cache): rocforge's by MARK only
SWAP_SIBLING = re.compile(r".+\.rocforge-(?:new|old|previous|destdir|partial|swap)"
                          r"(?:\.deleting|\.tmp)?")
CATEGORIES = ("sources", "work", "failed", "running", "bisect", "containers", "verify",
              "llama-help", "env", "ccache")


def _file_form(pattern: str) -> Callable[[Path], bool]:
    """A file named as rocforge names it there (also its `.part`/temporary forms: download.py,
    paths.write_whole, envcache)."""
    form = re.compile(r"\.?(?:" + pattern + r")(?:\.part(?:\.validator)?|\.\d+\.tmp)?")
    return lambda p: form.fullmatch(p.name) is not None and _is_file(p)


def _is_file(p: Path) -> bool:
    return stat.S_ISREG(os.lstat(p).st_mode)


def _is_dir(p: Path) -> bool:
    return stat.S_ISDIR(os.lstat(p).st_mode)


def _named_dir(pattern: str) -> Callable[[Path], bool]:
    form = re.compile(pattern)
    return lambda p: form.fullmatch(p.name) is not None and _is_dir(p)


# What rocforge made before it wrote marks, by the form it gives each entry (a directory holding
# ownership.MARK is rocforge's wherever it is).  A source tree holds rocforge's completeness stamp
# (forge/sources.py); a work dir is named by its prefix's hash (forge/plan.work_dir); files are
# named by what they hold (a hash, a digest), which no one else's file is called in these places.
OWNED_FORMS: dict[str, Callable[[Path], bool]] = {
    "sources/trees": lambda p: (_is_dir(p) and os.path.isfile(p / ownership.COMPLETE)
                                or _named_dir(r"\.(checkout|extract)-\w{8}")(p)),
    "sources/git": lambda p: (_named_dir(r"[0-9a-f]{16}\.git")(p) and os.path.isfile(p / "HEAD")
                              or _named_dir(r"tmp\w{8}")(p)),
    "sources/refs.json": _file_form(r"refs\.json"),
    "downloads": _file_form(r"[^/]+\.(tar(\.\w+)?|tgz|zip)|[0-9a-f]{16}-[^/]+"),
    "work": _named_dir(r"[0-9a-f]{12}"),
    "bisect": _named_dir(r"[\w.+]+(-[\w.+]+){2,}"),  # RECIPE-TARGET-BACKEND (forge/bisect.py)
    "containers": lambda p: _is_dir(p) and os.path.isdir(p / "wheels"),
    "verify/refs": _file_form(r"[0-9a-f]{32}\.(kld|json)"),
    "verify": _file_form(r"text-(start-)?[0-9a-f]{16}\.txt"),
    "llama-help": _file_form(r"[0-9a-f]{32}"),
    "env": _file_form(r"[0-9a-f]{8}\.sh"),
}


def claim_cache_root() -> None:
    """Tag the cache root as rocforge's (CACHEDIR.TAG) when rocforge makes it or it holds only
    what rocforge makes: called where rocforge first writes into the cache."""
    ownership.tag_cache_root(paths.cache_dir(), OWN_TOP)


def check_root(base: Path) -> None:
    """Refuse, before anything is removed, a cache root that is not rocforge's (ownership.py)."""
    ownership.check_destructive_root(base, OWN_TOP, "rocforge cache clean")


def owned(rel: str, path: Path) -> bool:
    """Whether the entry `path` of `rel` carries rocforge's mark, or the form rocforge gives it."""
    try:
        if ownership.is_marked(path):
            return True
        if SWAP_SIBLING.fullmatch(path.name):
            return False  # a prefix's sibling: its mark alone says it is rocforge's to remove
        form = OWNED_FORMS.get(rel)
        return form is not None and bool(form(path))
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


def protected() -> list[Path]:
    """rocforge's own places that may sit inside the cache dir and must never be removed."""
    from rocforge_build import config

    out = [paths.data_dir(), paths.config_dir(), paths.builds_prefix(), paths.nightly_prefix()]
    try:
        out.append(config.nightly_prefix())
    except Exception:  # a broken config file: its own commands report it
        pass
    return [Path(os.path.abspath(p)) for p in out]


def _measure(entry: Entry, guard: list[Path], mounts: set[str]) -> None:
    """Size and newest mtime of `entry.path`, never following a link; sets `kept` when the
    entry must stay (link, build prefix, another file system or mount, unreadable)."""
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
    for g in guard:
        if g == absolute or absolute in g.parents:
            entry.kept = f"holds {g}, one of rocforge's data or install directories"
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
    log = entry.path / "rocforge-build.log"
    try:
        with open(log, "rb") as fh:
            head = fh.read(4 << 20).decode("utf-8", "replace")
        plan, _ = json.JSONDecoder().raw_decode(head)
    except (OSError, ValueError):
        entry.detail = "no build log"
        return
    prefix = Path(str(plan.get("prefix", "")))
    entry.detail = f"for {prefix}"
    try:
        import tomllib

        with open(prefix / MANIFESTS[0], "rb") as fh:
            stamp = tomllib.load(fh).get("stamp")
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
        if name not in OWN_TOP and name != ownership.CACHEDIR_TAG:
            e = Entry("other", base / name)
            _measure(e, guard, mounts)
            e.kept = "not something rocforge makes"
            entries.append(e)
    listed: set[Path] = set()
    for category, rel, children in LAYOUT:
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
    refused = ownership.root_problem(base, OWN_TOP)
    for e in entries if refused else ():  # what `cache clean` would refuse is listed as kept
        e.kept = f"cache clean refuses {base}: {refused}"
    entries += compiler_caches(guard)
    return base, entries


def _entry(category: str, rel: str, path: Path, guard: list[Path], mounts: set[str]) -> Entry:
    """One entry of `rel`, measured; kept unless it carries rocforge's mark (a work dir whose
    build holds its lock: category `running`)."""
    e = Entry(category, path)
    _measure(e, guard, mounts)
    if e.kept is None and not owned(rel, path):
        e.kept = (f"carries no mark of rocforge's ({ownership.MARK}) and is not named as "
                  "rocforge names its entries there: not something rocforge made")
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


def compiler_caches(guard: list[Path]) -> list[Entry]:
    """The local directories of the compiler launchers rocforge's builds use (forge/cache.py:
    ccache or sccache from PATH, each with its own default directory: rocforge sets neither)."""
    out = []
    for tool, where in (("ccache", _ccache_dir()), ("sccache", _sccache_dir())):
        if where is None or not os.path.lexists(where):
            continue
        e = Entry("ccache", where, detail=tool)
        _measure(e, [], set())
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
