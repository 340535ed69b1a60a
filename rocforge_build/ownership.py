"""Ownership by mark: rocforge deletes, prunes or replaces only what carries the mark it wrote.

A location alone proves nothing (a cache dir set to HOME holds `work/` of the user's own), so
every directory rocforge makes for later removal gets a mark file when it is made (`MARK`), and a
cache root rocforge made gets a CACHEDIR.TAG (https://bford.info/cachedir/, which also keeps
backup tools out of it).  A root that is `/`, HOME or above HOME is refused for destructive
commands whatever it holds.  Removal never leaves the file system (and mount) it starts on and
never follows a link, so a tmpfs or bind mount inside the cache keeps its files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.install_record import RECORD, valid_record
from rocforge_build.manifest_schema import MANIFEST, checked_manifest
from rocforge_build.rename_exchange import exchange
from rocforge_build.toml_subset import tomllib_loads

MARK = ".rocforge-owned"
SCRATCH = ".rocforge-scratch"  # the mark in a scratch tree rocforge made (staged installs)
COMPLETE = ".rocforge-complete"  # forge/sources.py: a fetched tree is whole (removed first)
CACHEDIR_TAG = "CACHEDIR.TAG"
SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
TAG_LINE = "# This file is a cache directory tag created by rocforge."  # rocforge's, not any tool's
TAG_TEXT = (f"{SIGNATURE}\n{TAG_LINE}\n"
            "# For information about cache directory tags, see https://bford.info/cachedir/\n")
MAX_DEPTH = 400  # deeper than any tree rocforge makes; a deeper one is left, not recursed into
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text` unless something is already there; never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


MARK_HEAD = "made by rocforge: "  # every MARK starts so; a file of another content is no mark
HOME_DOTFILES = (".bashrc", ".bash_profile", ".bash_logout", ".profile", ".zshrc", ".ssh",
                 ".gnupg")  # a directory holding one is someone's home, whatever HOME says
# What rocforge writes at the start of the marks whose content it fixes (see `valid_marker`).
MARK_HEADS = {SCRATCH: b"rocforge scratch tree:", MARK: MARK_HEAD.encode(),
              ".rocforge-closure": b"staged by `rocforge container closure`"}
VALIDATED_MARKERS = (*MARK_HEADS, MANIFEST, "rocforge-kernels.json")
MARKER_BYTES = 1 << 20  # a marker larger than rocforge writes is not one of rocforge's


def write_mark(directory: Path, what: str) -> None:
    """Mark `directory` (made by rocforge just now) as rocforge's: `what` says what it is."""
    _write_new(Path(directory) / MARK, f"{MARK_HEAD}{what}\n")


def _mark_ok(path: Path) -> bool:
    """Whether `path` is a regular file (never followed) that starts as `write_mark` writes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MARK_HEAD)) == MARK_HEAD.encode()
    except OSError:
        return False
    finally:
        os.close(fd)


def _holds(directory: Path, name: str) -> bool:
    """Whether `directory` holds the mark `name`: content checked where rocforge fixes it
    (`MARK`, and the markers `valid_marker` knows), else a regular file."""
    if name == MARK:
        return _mark_ok(directory / name)
    if name in VALIDATED_MARKERS:
        return valid_marker(directory, name)
    if name == COMPLETE:
        return valid_stamp(directory / name)
    if name == RECORD:  # a nightly install: its record must validate
        return valid_record(directory)
    return _regular(directory / name)


def valid_marker(tree: Path, name: str) -> bool:
    """Whether `tree/name` is a marker as rocforge writes it (a regular file, never followed):
    a fixed text (`MARK_HEADS`), a build manifest that passes its schema (`manifest_schema.py`),
    or a kernels manifest (a JSON object naming target, platform and binary).  Anything else under a
    marker's name, a broken manifest included, does not make a tree rocforge's."""
    try:
        fd = os.open(Path(tree) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MARKER_BYTES:
            return False
        data = os.read(fd, MARKER_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    if name in MARK_HEADS:
        return data.startswith(MARK_HEADS[name])
    try:
        text = data.decode("utf-8")
        if name.endswith(".toml"):
            return _valid_manifest(text, str(Path(tree) / name))
        if name.endswith(".json"):
            doc = json.loads(text)
            return isinstance(doc, dict) and all(
                isinstance(doc.get(k), str) for k in ("target", "platform", "binary"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return False


def _valid_manifest(text: str, path: str) -> bool:
    try:
        data = tomllib_loads(text)
        checked_manifest(data, path)
    except (ValueError, RecursionError, RocforgeError):
        return False
    return isinstance(data, dict)


_STAMP = re.compile(r"\S.* [0-9a-f]{40}(?:[0-9a-f]{24})?|.+\.(?:tar(?:\.\w+)?|tgz|zip)")


def valid_stamp(path: Path) -> bool:
    """Whether `path` is a completeness stamp as forge/sources.py writes it (a regular file, never
    followed): one line, `LOCATION COMMIT` of a git checkout or the archive it was unpacked from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.read(fd, 8193) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    return (len(data) <= 8192 and text.endswith("\n") and text.count("\n") == 1
            and _STAMP.fullmatch(text[:-1]) is not None)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_marked(directory: Path) -> bool:
    """Whether `directory` (not a link) holds rocforge's mark as a regular file."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return False
    except OSError:
        return False
    return _mark_ok(Path(directory) / MARK)


def has_cache_tag(root: Path) -> bool:
    """Whether `root` holds a CACHEDIR.TAG that starts with the standard's signature."""
    tag = Path(root) / CACHEDIR_TAG
    if not _regular(tag):
        return False
    try:
        with open(tag, "rb") as fh:
            return fh.read(len(SIGNATURE)) == SIGNATURE.encode()
    except OSError:
        return False


def has_rocforge_tag(root: Path) -> bool:
    """Whether `root` holds a CACHEDIR.TAG with the signature and rocforge's own line
    (`TAG_LINE`): a tag another tool wrote makes nothing in `root` rocforge's."""
    if not has_cache_tag(root):
        return False
    try:
        with open(Path(root) / CACHEDIR_TAG, "rb") as fh:
            lines = fh.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    return TAG_LINE in lines[1:]


def identity(path: str | os.PathLike[str], follow: bool = True) -> tuple[int, int] | None:
    """(st_dev, st_ino) of `path` (through links when `follow`): the same directory reached
    through a link or a bind mount has the same identity, whatever its path says."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def identity_chain(path: str | os.PathLike[str]) -> set[tuple[int, int]]:
    """The identities of `path` (links resolved) and of every directory above it."""
    real = Path(os.path.realpath(path))
    return {i for i in map(identity, (real, *real.parents)) if i is not None}


def _homes() -> set[str]:
    out = {os.path.realpath(os.path.expanduser("~"))}
    try:
        out.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (KeyError, OSError):
        pass
    return out


def forbidden_root(root: Path) -> str | None:
    """Why `root` can never be a directory rocforge empties (`/`, HOME, above HOME), or None."""
    real = os.path.realpath(root)
    ident = identity(real)  # by identity too: a bind mount of HOME elsewhere is still HOME
    if real == "/" or (ident is not None and ident == identity("/")):
        return "it is the root directory /"
    for home in _homes():
        if real == home or (ident is not None and ident == identity(home)):
            return "it is your home directory"
        if home.startswith(real.rstrip("/") + "/") or (ident is not None
                                                       and ident in identity_chain(home)):
            return f"it holds your home directory {home}"
    return None


def forbidden_target(path: Path) -> str | None:
    """Why the directory `path` can never be replaced or emptied as a whole: `forbidden_root`,
    a mount point, or one holding a home directory's own dot-files; None when it may be."""
    why = forbidden_root(path)
    if why is not None:
        return why
    mounts = mount_points()
    if os.path.abspath(path) in mounts or os.path.realpath(path) in mounts:
        return "it is a mount point (another file system is mounted there)"
    dots = [n for n in HOME_DOTFILES if os.path.lexists(os.path.join(path, n))]
    if dots:
        return f"it holds {dots[0]}, as a home directory does"
    return None


def foreign_names(root: Path, own: Iterable[str]) -> list[str]:
    """The names directly in `root` that rocforge never makes there."""
    try:
        names = os.listdir(root)
    except OSError:  # absent, not a directory, unreadable: nothing in it is listed or removed
        return []
    allowed = set(own) | {CACHEDIR_TAG}
    return sorted(n for n in names if n not in allowed)


def root_problem(root: Path, own: Iterable[str]) -> str | None:
    """Why `root` may not be emptied: `/`, HOME or above HOME, or names in it that rocforge never
    makes there while no CACHEDIR.TAG says rocforge made it; None when it may."""
    why = forbidden_root(root)
    if why is None and not has_rocforge_tag(root):
        foreign = foreign_names(root, own)
        if foreign:
            shown = ", ".join(repr(n) for n in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            why = (f"it holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} rocforge "
                   f"did not make ({shown}) and no {CACHEDIR_TAG} of rocforge's")
    return why


def check_destructive_root(root: Path, own: Iterable[str], what: str) -> None:
    """Refuse (one line, exit 2) to empty `root` when `root_problem` names a reason."""
    why = root_problem(root, own)
    if why is not None:
        raise UsageError(f"{what} refuses {root}: {why}",
                         "point it at a directory of rocforge's own (ROCFORGE_CACHE_DIR, "
                         "`rocforge config`); nothing was removed")


def tag_cache_root(root: Path, own: Iterable[str]) -> None:
    """Write the CACHEDIR.TAG of a cache root rocforge makes now, or one that holds only what
    rocforge makes there (a cache of an earlier rocforge); never into HOME, `/` or a directory
    with files of someone else's.  Best effort: a root that cannot be written fails later, there."""
    root = Path(root)
    if forbidden_root(root) is not None or has_cache_tag(root):
        return  # a tag of another tool's stays as it is: its directory is not rocforge's
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not foreign_names(root, own):
            _write_new(root / CACHEDIR_TAG, TAG_TEXT)
    except OSError:
        pass


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace (a bind mount of the same file system
    has the same st_dev, so st_dev alone does not see it)."""
    out = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split(" ")
                if len(fields) > 4:
                    out.add(_unescape(fields[4]))
    except OSError:
        pass
    return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def remove_tree_one_device(path: Path, *, first: Iterable[str] = (COMPLETE,),
                           last: Iterable[str] = (MARK,)) -> list[str]:
    """Remove `path` without following a link or entering another file system or mount; the
    names in `first` go first (a completeness mark: an interrupted removal leaves a tree that is
    visibly incomplete) and `MARK` last (what is left stays recognisably rocforge's).  Returns
    the mount points left in place (with the directories above them); raises OSError otherwise."""
    path = Path(os.path.abspath(path))
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return []
    mounts = mount_points()
    if str(path) in mounts:
        return [str(path)]
    parent = os.open(path.parent, _OPEN_DIR)
    try:
        fd = _open_child(parent, path.name, st)
        if fd is None:
            return [str(path)]
        try:
            left = _clear(fd, str(path), st.st_dev, mounts, tuple(first), tuple(last), 0)
        finally:
            os.close(fd)
        if not left:
            _retry_writable(parent, lambda: os.rmdir(path.name, dir_fd=parent))
        return left
    finally:
        os.close(parent)


def _open_child(parent: int, name: str, seen: os.stat_result) -> int | None:
    """Open directory `name` under `parent`, or None when it is no longer the one `seen`."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)  # a 0000 dir of an archive; checked as a dir below
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        return None
    return fd


def _retry_writable(fd: int, action) -> None:
    """Run `action` (an unlink or rmdir in directory `fd`), making the directory writable once
    when it is read-only (archives carry 0555 directories)."""
    try:
        action()
    except PermissionError:
        os.fchmod(fd, 0o700)
        action()


def _clear(fd: int, where: str, dev: int, mounts: set[str], first: tuple, last: tuple,
           depth: int) -> list[str]:
    """Empty the directory open as `fd` (at `where`); returns the mount points left in it."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, "nested deeper than rocforge makes", where)
    names = os.listdir(fd)
    order = ([n for n in first if n in names] + [n for n in names if n not in first + last]
             + [n for n in last if n in names])
    left: list[str] = []
    for name in order:
        full = os.path.join(where, name)
        if name in last and left:
            break  # something stays: so does the mark that says it is rocforge's
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            _retry_writable(fd, lambda n=name: os.unlink(n, dir_fd=fd))
            continue
        if st.st_dev != dev or full in mounts:
            left.append(full)
            continue
        child = _open_child(fd, name, st)
        if child is None:
            left.append(full)
            continue
        try:
            below = _clear(child, full, dev, mounts, (), (), depth + 1)
        finally:
            os.close(child)
        left += below
        if not below:
            _retry_writable(fd, lambda n=name: os.rmdir(n, dir_fd=fd))
    return left


# -- the one way rocforge removes a tree ------------------------------------------------------------

class NotOwned(UsageError):
    """A tree rocforge was about to remove or replace carries no mark of rocforge's."""


def _on_one_mount(path: Path, ancestor: Path, mounts: set[str]) -> bool:
    """Whether `path` lies on the same file system and mount as its `ancestor`."""
    try:
        dev = os.lstat(path).st_dev
    except OSError:
        return False
    here = path
    while here != ancestor:
        if str(here) in mounts:
            return False
        here = here.parent
    try:
        return os.lstat(ancestor).st_dev == dev
    except OSError:
        return False


def owner(path: Path, marks: Iterable[str] = (MARK,), made: os.stat_result | None = None
          ) -> Path | None:
    """The tree that makes directory `path` rocforge's: `path` itself when it holds one of `marks`
    (regular files), else the nearest directory above its real location that holds `MARK` or is
    the directory `made` (one this process created: its lstat then), on the same file system and
    mount; None when there is none (or `path` is a link or no directory)."""
    path = Path(os.path.abspath(path))
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    if any(_holds(path, m) for m in marks):
        return path
    real = Path(os.path.realpath(path.parent)) / path.name
    mounts = mount_points()
    for above in real.parents:
        if forbidden_root(above) is not None:
            return None  # HOME, `/` and above HOME make nothing below them rocforge's
        if is_marked(above) or (made is not None and _same_dir(above, made)):
            return above if _on_one_mount(real, above, mounts) else None
    return None


def _same_dir(path: Path, made: os.stat_result) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == (made.st_dev, made.st_ino)


def warn_left(paths: Iterable[str], why: str = "another file system is mounted there") -> None:
    """One `rocforge: warning:` line for each path a removal left in place."""
    import sys

    for p in paths:
        print(f"rocforge: warning: left {p} in place: {why}", file=sys.stderr)


def remove_owned(path: Path, what: str, *, marks: Iterable[str] = (MARK,),
                 first: Iterable[str] = (COMPLETE,), refuse: bool = True,
                 made: os.stat_result | None = None) -> list[str]:
    """Remove the directory `path` (`what` names it) when `owner` finds it rocforge's, with the
    one-device remover; returns the mount points left in place.  A tree without a mark is never
    removed: NotOwned (one line, exit 2), or with `refuse=False` a warning line and it stays."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    if owner(path, marks, made) is None:
        why = (f"refusing to remove {path} ({what}): it carries no mark of rocforge's "
               f"({' or '.join(dict.fromkeys((*marks, MARK)))}), so rocforge did not make it")
        if refuse:
            raise NotOwned(why, "move it away, or remove it yourself if nothing in it is needed; "
                                "nothing was removed")
        warn_left([str(path)], f"it carries no mark of rocforge's ({MARK})")
        return []
    return remove_tree_one_device(path, first=first)


def discard(path: Path, what: str, *, marks: Iterable[str] = (MARK,)) -> None:
    """Remove a tree of rocforge's on the way out of a step, never failing it: what carries no
    mark, a mount inside and what cannot be removed stay, each with a warning line."""
    try:
        warn_left(remove_owned(path, what, marks=marks, refuse=False))
    except OSError as exc:
        warn_left([str(path)], f"it could not be removed: {exc.strerror}")


@contextlib.contextmanager
def scratch_dir(parent: Path | None, prefix: str, what: str | None = None) -> Iterator[Path]:
    """A fresh directory (mkdtemp in `parent`, or the temp dir) for this process, removed on the
    way out, Ctrl-C included, unless the caller moved it away.  With `what` it is marked too, so a
    killed run's leftover is recognisably rocforge's.  What the path holds at the end is removed
    when it is still the directory made here, or carries a mark; otherwise it is left, with a
    warning."""
    import tempfile

    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    made = os.lstat(path)
    if what is not None:
        write_mark(path, what)
    try:
        yield path
    finally:
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
            try:
                warn_left(remove_tree_one_device(path))
            except OSError as exc:  # never hides what ended the block
                warn_left([str(path)], f"it could not be removed: {exc.strerror}")
        elif now is not None:
            discard(path, "a tree left in a scratch directory")


def walk_one_device(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk (top-down, links not followed) that never enters another file system or mount:
    the only walk a removal of single files may use."""
    top_dev = os.lstat(top).st_dev
    mounts = mount_points()
    for dirpath, dirnames, filenames in os.walk(top):
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or (st.st_dev == top_dev and full not in mounts):
                keep.append(name)
        dirnames[:] = keep
        yield dirpath, dirnames, filenames


def install_tree(new: Path, dest: Path, what: str, *, marks: Iterable[str] = (MARK,)) -> list[str]:
    """Put the complete tree `new` (its completeness stamp written last) at `dest`, replacing a
    tree there only when `owner` finds it rocforge's: in one renameat2(RENAME_EXCHANGE) where the
    file system has it (rename(2)), else by renaming the old tree aside first (for that instant
    `dest` is absent and a reader fetches again).  The replaced tree, now at `new`'s name, is
    removed with the one-device remover; returns the mount points it left in place."""
    new, dest = Path(new), Path(dest)
    if not os.path.lexists(dest):
        os.rename(new, dest)
        return []
    check_tree_replaceable(dest, what, marks)
    old = new
    if not exchange(new, dest):
        old = Path(f"{new}.replaced")
        os.rename(dest, old)
        os.rename(new, dest)
    try:  # the new tree is in place: the old one failing to go is a warning, not a failure
        return remove_owned(old, what, marks=marks)
    except OSError as exc:
        warn_left([str(old)], f"it could not be removed: {exc.strerror}")
        return []


def check_tree_replaceable(dest: Path, what: str, marks: Iterable[str] = (MARK,)) -> None:
    """Refuse (NotOwned: one line, exit 2) to replace `dest` unless it is absent or carries
    one of `marks` itself, and is no mount point."""
    if not os.path.lexists(dest):
        return
    why = forbidden_target(dest) if os.path.isdir(dest) else None
    if why is not None:
        raise NotOwned(f"refusing to replace {dest} ({what}): {why}",
                       "unmount it or move it away; nothing was removed")
    if owner(dest, marks) != Path(os.path.abspath(dest)):
        raise NotOwned(f"refusing to replace {dest} ({what}): it carries no mark of rocforge's "
                       f"({' or '.join(dict.fromkeys((*marks, MARK)))}), so rocforge did not make "
                       "it", "move it away, or remove it yourself if nothing in it is needed; "
                       "nothing was removed")
