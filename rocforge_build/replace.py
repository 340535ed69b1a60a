"""Replacing a directory as a whole: build prefixes (`rocforge build --prefix`, `rocforge upgrade`,
`rocforge rollback`), kernel builds (`kernels build --out`) and library closures (`container closure
--out`).

rocforge replaces only what it made: a destination that does not exist, is empty, or holds
rocforge's own marker file for that kind of tree (the build manifest, the kernels' manifest, the
closure marker).  Anything else is refused before any work starts, naming the file that made it
refuse; rocforge never deletes a user's directory, so there is no flag to make it.  Every tree
is removed through ownership.py, by its mark: the scratch trees a build stages into
(`<prefix>.rocforge-new`) when they carry the scratch mark (`SCRATCH`), the tree's marker or
`ownership.MARK` (`scratch`, `discard`); a replaced tree when it is the one the journal names
(its inode numbers) or carries one of those marks.  A tree being removed gets `ownership.MARK`
first and loses its marker first, so one cut off half deleted is never taken for a whole one and
stays recognisably rocforge's; an unmarked tree in a place rocforge deletes is left, with a
warning, or refused with one line.

`swap(new, dest)` is atomic and restartable.  It writes a journal (`<dest>.rocforge-swap`: both
trees' inode numbers, where the replaced one goes), then exchanges the two trees in one
`renameat2(RENAME_EXCHANGE)` (rename(2) man page), so at every instant one complete tree is at
`dest`.  Where the file system lacks the exchange (EINVAL, ENOSYS, EOPNOTSUPP) it falls back to two
renames, `dest` aside to `<dest>.rocforge-old` and `new` in (between them there is no `dest`:
the journal lets the next command put one back).  The replaced tree is then moved to `keep` or deleted (its marker first, so a half
deleted tree is never taken for a whole one), and the journal goes last.  The renames run with
Ctrl-C/SIGTERM held back (`signals.deferred`); after a SIGKILL or power loss, `recover(dest)` (run
before every swap, at the start of every build, upgrade and rollback) reads the journal: a swap
cut off after the new tree went in is finished (the replaced one kept or deleted), one cut off
before is undone (the old tree stays, or goes back from `<dest>.rocforge-old`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from pathlib import Path

from rocforge_build import ownership, signals
from rocforge_build.errors import UsageError, disk_failure
from rocforge_build.manifest_schema import MANIFEST
from rocforge_build.ownership import SCRATCH, valid_marker
from rocforge_build.rename_exchange import exchange
from rocforge_build.toml_subset import tomllib_loads

OLD = ".rocforge-old"
DELETING = ".rocforge-old.deleting"
JOURNAL = ".rocforge-swap"  # beside `dest` while a swap is under way
# The only names a swap's trees have beside `dest`: the staged tree (`new`) and the kept one
# (`keep`) are always one of these, so a journal naming any other path is not rocforge's.
NEW_SUFFIXES = (".rocforge-new", ".rocforge-partial", ".rocforge-previous")
KEEP_SUFFIXES = (".rocforge-previous",)
_MKDTEMP = "[A-Za-z0-9_]{8}"  # `.<name>.XXXXXXXX`: kernels build in a mkdtemp beside `--out`
_RENAME_ERRORS = {errno.EBUSY, errno.EXDEV, errno.EACCES, errno.EPERM, errno.EROFS,
                  errno.ENOSPC, errno.ENOTEMPTY, errno.EEXIST}


def sibling(dest: Path, suffix: str) -> Path:
    return Path(f"{dest}{suffix}")


def derived(dest: Path, path: Path | str, suffixes: tuple[str, ...]) -> bool:
    """Whether `path` is one of the names rocforge gives a swap's trees beside `dest`."""
    dest, path = Path(os.path.abspath(dest)), Path(os.path.abspath(path))
    if path in (sibling(dest, s) for s in suffixes):
        return True
    return suffixes is NEW_SUFFIXES and path.parent == dest.parent and re.fullmatch(
        re.escape(f".{dest.name}.") + _MKDTEMP, path.name) is not None


def check_target(dest: Path, option: str) -> None:
    """Refuse (UsageError, one line, exit 2) a directory no replacement or removal may take:
    `/`, HOME, above HOME, a mount point, one holding a home directory's own dot-files
    (`ownership.forbidden_target`), whatever marker it holds."""
    why = ownership.forbidden_target(dest)
    if why is not None:
        raise UsageError(f"refusing to replace {option} {dest}: {why}",
                         f"choose a new or empty directory for {option}; nothing was removed")


def check_replaceable(dest: Path, marker: str, option: str, *, path_list: bool = False) -> None:
    """Refuse (UsageError, one line) a destination rocforge may not replace as a whole.
    `path_list`: the tree's directories go on PATH-like lists, so a ':' in it is refused too."""
    dest = Path(dest)
    if path_list and ":" in str(dest):
        raise UsageError(f"{option} {dest} contains ':', which separates entries of PATH and "
                         "LD_LIBRARY_PATH: its directories could not be put on them",
                         f"choose a {option} without ':'")
    for parent in reversed(dest.parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise UsageError(f"{option} {dest}: cannot read {parent}: {exc.strerror}") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{option} {dest} is below {parent}, which is a file, not a directory",
                             f"choose a {option} whose parents are directories")
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"{option} {dest} cannot be read: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{option} {dest} is a symbolic link; rocforge replaces it as a whole and "
                         "would not follow it", f"give the directory it points to as {option}")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{option} {dest} is a file, not a directory",
                         f"choose a new or empty directory for {option}")
    check_target(dest, option)
    try:
        names = sorted(os.listdir(dest))
    except OSError as exc:
        raise UsageError(f"{option} {dest} cannot be read: {exc.strerror}") from exc
    if not names:
        return
    if _marked(dest, marker):
        why = binding_problem(dest, marker)
        if why is None:
            return
        raise UsageError(f"refusing to replace {option} {dest}: its {marker} {why}, so rocforge "
                         "did not make this directory", f"choose a new or empty directory for "
                         f"{option}; if everything in {dest} may go, remove it yourself first")
    held = marker if marker in names else names[0]
    raise UsageError(
        f"refusing to replace {option} {dest}: it holds {dest / held}, and it has no valid "
        f"{marker} of rocforge's, so rocforge did not make it",
        f"choose a new or empty directory for {option}; if everything in {dest} may go, "
        "remove it yourself first")


def _marked(tree: Path, marker: str) -> bool:
    return valid_marker(tree, marker)


def binding_problem(dest: Path, marker: str) -> str | None:
    """Why the build manifest in `dest` does not make `dest` rocforge's, or None: a manifest is
    written for one prefix and records it, so a copy of it in another directory (a user's) names
    another place and marks nothing.  The recorded prefix must be `dest` itself (the same absolute
    path, or the same directory once links above it are resolved).  The schema keeps `prefix`
    optional, so a manifest that records none is taken as written where it is: refusing it could
    strand a build whose manifest lacks the field, while the copied-manifest case (a real build's
    manifest in a user's directory) always names the build it came from.  Other markers (kernels,
    closures) are not bound here."""
    if marker != MANIFEST:
        return None
    try:
        recorded = tomllib_loads((Path(dest) / marker).read_text(encoding="utf-8")).get("prefix")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return "cannot be read"
    if recorded is None:
        return None
    if not isinstance(recorded, str) or not recorded:
        return "records no usable prefix"
    if os.path.abspath(recorded) == os.path.abspath(dest):
        return None
    if not os.path.islink(recorded) and os.path.realpath(recorded) == os.path.realpath(dest):
        return None
    return f"was written for another prefix, {recorded}"


def _marks(marker: str) -> tuple[str, ...]:
    """The marks that make a tree in one of replace's places rocforge's."""
    return (marker, SCRATCH, ownership.MARK)


def _ours(tree: Path, marker: str) -> bool:
    return any(_marked(tree, m) for m in _marks(marker))


def interrupted(dest: Path) -> bool:
    """Whether a replacement of `dest` was cut off (`recover` has something to do)."""
    return any(os.path.lexists(sibling(dest, s)) for s in (JOURNAL, OLD, DELETING))


def _ident(path: Path) -> list[int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _write_journal(dest: Path, entry: dict) -> None:
    """The journal, whole or not at all: written to a temporary name, synced, renamed."""
    journal, tmp = sibling(dest, JOURNAL), sibling(dest, JOURNAL + ".tmp")
    _unlink_file(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(entry, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, journal)
    _sync_dir(dest.parent)


def _read_journal(dest: Path) -> dict | None:
    journal = sibling(dest, JOURNAL)
    _unlink_file(sibling(dest, JOURNAL + ".tmp"))  # never renamed in: no swap started
    if not os.path.lexists(journal):
        return None
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            entry = json.loads(fh.read(65536)) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ValueError):
        entry = None
    keys = {"dest": str, "new": str, "keep": (str, type(None)), "new_id": list, "old_id": list,
            "kept_id": (list, type(None))}
    if not (isinstance(entry, dict) and all(isinstance(entry.get(k), t) for k, t in keys.items())
            and _journal_paths_ok(dest, entry)):
        raise UsageError(f"{journal} is in the way of replacing {dest} and it is not a journal "
                         "rocforge wrote for it (nothing was moved or removed)",
                         f"move {journal} elsewhere")
    return entry


def _journal_paths_ok(dest: Path, entry: dict) -> bool:
    """A journal only confirms: its paths must be the very names rocforge derives from `dest`
    (never a path it names on its own), its ids pairs of integers."""
    def ident_ok(v) -> bool:
        return v is None or (isinstance(v, list) and len(v) == 2
                             and all(type(i) is int for i in v))

    return (os.path.abspath(entry["dest"]) == os.path.abspath(dest)
            and derived(dest, entry["new"], NEW_SUFFIXES)
            and (entry["keep"] is None or derived(dest, entry["keep"], KEEP_SUFFIXES))
            and all(ident_ok(entry[k]) for k in ("new_id", "old_id", "kept_id"))
            and entry["new_id"] is not None and entry["old_id"] is not None)


def _unlink_file(path: Path) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)


def _sync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def recover(dest: Path, marker: str) -> str | None:
    """Finish a swap of `dest` that was cut off (see the module's docstring); says what it did
    (None: nothing).  Callers hold the lock of whatever swaps `dest`."""
    dest = Path(dest)
    entry = _read_journal(dest)
    if entry is not None:
        return _finish(dest, marker, entry)
    old, deleting = sibling(dest, OLD), sibling(dest, DELETING)
    _delete(deleting, marker)  # by its mark: a tree of someone else's there stays
    done = None
    if os.path.lexists(old) and os.path.isdir(old) and not os.path.islink(old):
        if not os.path.lexists(dest) and _marked(old, marker):
            os.replace(old, dest)  # cut between two renames without a journal: the old tree back
            done = f"restored {dest} from an interrupted replacement"
        elif os.path.lexists(dest) and (_ours(old, marker) or not os.listdir(old)):
            _delete(old, marker, _ident(old), None if os.path.lexists(deleting) else deleting)
            done = f"removed the previous tree of {dest} left by an interrupted replacement"
    return done


def _finish(dest: Path, marker: str, entry: dict) -> str:
    """The journal's swap finished or undone: once the new tree is at `dest` (its inode is the
    journal's) the replaced one is moved to `keep` (the tree kept there before is deleted) or
    deleted; before that the swap is undone (the old tree stays or goes back, the staged one
    stays where it was, a kept tree is untouched); the journal last."""
    new, aside = Path(entry["new"]), sibling(dest, OLD)
    keep = Path(entry["keep"]) if entry["keep"] else None
    places = [dest, new, aside] + ([keep] if keep else [])

    def where(ident: list) -> Path | None:
        return next((p for p in places if _ident(p) == ident), None)

    if not os.path.lexists(dest):  # cut between the fallback's renames: before the new tree was in
        whole = where(entry["old_id"]) or where(entry["new_id"])
        if whole is not None:
            os.replace(whole, dest)
    if _ident(dest) == entry["new_id"]:
        _dispose(where(entry["old_id"]), aside, keep, entry, marker)
        done = f"finished an interrupted replacement of {dest}"
    else:
        done = f"undid an interrupted replacement of {dest}: the tree it had is in place"
    os.unlink(sibling(dest, JOURNAL))
    return done


def _dispose(old: Path | None, aside: Path, keep: Path | None, entry: dict,
             marker: str) -> None:
    """The replaced tree (at `old`; None: already deleted) moved to `keep`, where the tree
    kept before (the journal's `kept_id`) is moved aside and deleted, or deleted itself."""
    kept_id = entry["kept_id"]
    if keep is not None:
        retired = sibling(keep, ".deleting")
        if old is not None and old != keep:
            if os.path.lexists(keep):
                if kept_id is None or _ident(keep) != kept_id:
                    raise UsageError(f"{keep} is in the way of keeping the replaced tree, which "
                                     f"is at {old}", f"move {keep} elsewhere, then run the "
                                     "command again")
                os.replace(keep, retired)
            os.replace(old, keep)
        _delete(retired, marker, kept_id)
        return
    if old is not None and old != aside:
        os.replace(old, aside)
    _delete(aside, marker, entry["old_id"])


def _delete(tree: Path, marker: str, ident: list | None = None, at: Path | None = None) -> None:
    """Remove a replaced tree through ownership.py, never failing the command: when it is the
    tree `ident` names (the journal's inode numbers, a confirmation only) and carries one of
    `_marks` (valid, `valid_marker`), it gets
    `ownership.MARK` first (so a removal cut off leaves it rocforge's) and loses `marker` first
    (so it is never taken for a whole tree); anything else, a mount inside it and what cannot be
    removed stay, with a warning.  `at`: renamed there first (the name it is deleted under)."""
    if not os.path.lexists(tree):
        return
    try:
        st = os.lstat(tree)
        if ident is not None and [st.st_dev, st.st_ino] != ident:
            ownership.warn_left([str(tree)], "it is not the tree rocforge replaced there")
            return
        if stat.S_ISDIR(st.st_mode) and ownership.forbidden_target(tree) is not None:
            ownership.warn_left([str(tree)], ownership.forbidden_target(tree))
            return
        if stat.S_ISDIR(st.st_mode) and _ours(tree, marker):
            ownership.write_mark(tree, "a replaced tree rocforge is deleting")
        if at is not None:
            os.replace(tree, at)
            tree = at
        if stat.S_ISDIR(st.st_mode) and not os.listdir(tree):
            os.rmdir(tree)  # an empty directory: nothing in it to lose
            return
        ownership.warn_left(ownership.remove_owned(tree, "a replaced tree", marks=(ownership.MARK,),
                                                   first=(marker, SCRATCH), refuse=False))
    except OSError as exc:
        ownership.warn_left([str(tree)], f"it could not be removed: {exc.strerror}")


def installed_files(tree: Path) -> list[str]:
    """Every file and link below `tree` (relative, sorted, links not followed): what rocforge
    installed there, recorded in the manifest so a later replacement knows what is not its own."""
    out = []
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append(os.path.relpath(os.path.join(dirpath, name), tree))
    # a name the manifest cannot hold on one line is left out: a later swap keeps it, never loses it
    return sorted(f for f in out if "\n" not in f and "\r" not in f)


def keep_added_files(old: Path, dest: Path, marker: str) -> Path | None:
    """Move the files a user added to the replaced tree `old` (anything its manifest's `installed`
    list does not name) to `<dest>.rocforge-kept-<time>/`, same relative paths, and name them in
    one line: they are the user's and never deleted with rocforge's tree.  A manifest without the
    list (a build made before it was recorded) cannot tell them apart, and the tree goes whole."""
    if marker != MANIFEST:
        return None
    try:
        recorded = tomllib_loads((Path(old) / marker).read_text(encoding="utf-8")).get("installed")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(recorded, list) or not recorded:
        return None
    # an entry that is not a path (a manifest edited by hand) names nothing of rocforge's: its
    # files are kept aside with the user's, never lost and never a traceback
    ours = {f for f in recorded if isinstance(f, str)} | {marker, SCRATCH, ownership.MARK}
    added = [f for f in installed_files(old) if f not in ours]
    if not added:
        return None
    import time

    base = sibling(dest, ".rocforge-kept-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime()))
    kept, n = base, 0
    while os.path.lexists(kept):  # never into a directory already there
        n += 1
        kept = Path(f"{base}-{n}")
    for rel in added:
        there = kept / rel
        there.parent.mkdir(parents=True, exist_ok=True)
        os.rename(Path(old) / rel, there)
    shown = ", ".join(added[:5]) + (f" and {len(added) - 5} more" if len(added) > 5 else "")
    print(f"rocforge: warning: kept {len(added)} file(s) you added to {dest} in {kept}: {shown}",
          file=sys.stderr)
    return kept


def swap(new: Path, dest: Path, marker: str, keep: Path | None = None) -> None:
    """Put the tree `new` in place of `dest` (replaced as a whole; see the module's docstring).
    `keep`: the replaced tree is renamed there instead of deleted (`rocforge upgrade` keeps it
    for `rocforge rollback`), and the tree kept there before (rocforge's: it has `marker`) is
    deleted once the new one is in; or it is `new` itself (`rocforge rollback`: the two trees
    change places)."""
    new, dest = Path(new), Path(dest)
    if not derived(dest, new, NEW_SUFFIXES) or not (keep is None or derived(dest, keep, KEEP_SUFFIXES)):
        raise ValueError(f"swap of {dest}: {new} / {keep} are not names replace.py derives from it")
    try:
        _swap(new, dest, marker, keep)
    except OSError as exc:
        if exc.errno not in _RENAME_ERRORS or exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_failure(exc, f"replacing {dest}") from exc  # EIO, a full disk: one line
        raise UsageError(f"cannot replace {dest}: {exc.strerror}" + (
            " (a file system is mounted there, or beside it)" if exc.errno in (errno.EBUSY, errno.EXDEV)
            else ""), f"choose a {dest.name} on one file system, not a mount point, then run the "
            "command again") from exc


def _swap(new: Path, dest: Path, marker: str, keep: Path | None) -> None:
    recover(dest, marker)
    aside = sibling(dest, OLD)
    if os.path.lexists(aside):
        raise UsageError(f"{aside} is in the way of replacing {dest} and rocforge did not make it",
                         f"move {aside} elsewhere")
    if not os.path.lexists(dest):
        with signals.deferred():
            os.rename(new, dest)  # one rename: nothing to journal
        return
    keep = Path(keep) if keep is not None else None
    if keep is None:
        _check_deletable(dest, marker)
    kept = keep is not None and keep != new and os.path.lexists(keep)
    if kept:
        _check_kept(keep, marker)
    entry = {"dest": str(dest), "new": str(new), "keep": str(keep) if keep else None,
             "new_id": _ident(new), "old_id": _ident(dest), "kept_id": _ident(keep) if kept else None}
    placed = False
    try:
        with signals.deferred():  # a signal held back here is raised when the block ends
            _write_journal(dest, entry)
            if exchange(new, dest):
                old = new
            else:
                os.rename(dest, aside)
                os.rename(new, dest)
                old = aside
            if keep is not None and old != keep:
                if kept:
                    os.rename(keep, sibling(keep, ".deleting"))
                os.rename(old, keep)
            elif keep is None and old != aside:
                os.rename(old, aside)
            placed = True
    finally:
        if placed:  # also when that signal is on its way out (a second one leaves it to recover)
            if keep is None:
                keep_added_files(aside, dest, marker)
                _delete(aside, marker, entry["old_id"])
            else:
                _delete(sibling(keep, ".deleting"), marker, entry["kept_id"])
            os.unlink(sibling(dest, JOURNAL))
        elif os.path.lexists(sibling(dest, JOURNAL)):
            recover(dest, marker)  # an error between the renames: the journal says where each is


def _check_deletable(dest: Path, marker: str) -> None:
    """The tree at `dest`, which the swap deletes, is empty or carries `marker` (the callers'
    check_replaceable, made again where the deletion is decided): else one line, nothing done."""
    check_target(dest, "the destination")
    if os.path.islink(dest) or not os.path.isdir(dest) or not (
            _marked(dest, marker) or not os.listdir(dest)):
        raise UsageError(f"refusing to replace {dest}: it has no {marker}, so rocforge did not "
                         "make it", f"move {dest} elsewhere, then run the command again")
    why = binding_problem(dest, marker) if os.listdir(dest) else None
    if why is not None:
        raise UsageError(f"refusing to replace {dest}: its {marker} {why}, so rocforge did not "
                         "make this directory", f"move {dest} elsewhere, then run the command again")


def _check_kept(keep: Path, marker: str) -> None:
    """The tree at `keep` is one rocforge kept (it will be deleted): else one line, nothing done."""
    check_target(keep, "the kept tree")
    if os.path.islink(keep) or not os.path.isdir(keep) or not _marked(keep, marker):
        raise UsageError(f"{keep} is in the way of keeping the replaced tree and rocforge did not "
                         f"make it (no {marker})", f"move {keep} elsewhere, then run the command "
                         "again")
    retired = sibling(keep, ".deleting")
    _delete(retired, marker)  # left by a delete that was cut off: by its mark
    if os.path.lexists(retired):
        raise UsageError(f"{retired} is in the way of keeping the replaced tree and rocforge did "
                         "not make it", f"move {retired} elsewhere, then run the command again")


# -- scratch trees (a build's staged install) ------------------------------------------------------

def check_scratch(path: Path, marker: str, what: str) -> None:
    """Refuse (UsageError, one line) a scratch path rocforge may not clear: anything there but
    an empty directory or a tree with the scratch mark or `marker` (a staged tree left whole)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        check_target(path, what)
    if stat.S_ISDIR(st.st_mode) and (_ours(path, marker) or not os.listdir(path)):
        return
    raise UsageError(f"refusing to remove {path}: rocforge puts {what} there, and it has no "
                     f"{SCRATCH}, {ownership.MARK} or {marker}, so rocforge did not make it",
                     f"move {path} elsewhere (it may be yours), then run the command again")


def discard(path: Path, marker: str, what: str) -> None:
    """Remove a scratch tree after `check_scratch`, through ownership.py: `ownership.MARK`
    written first and removed last, `marker` removed first (a removal cut off leaves a tree the
    next one clears, never one taken for a whole build).  A mount inside it is refused."""
    path = Path(path)
    check_scratch(path, marker, what)
    if not os.path.lexists(path):
        return
    if not os.listdir(path):
        os.rmdir(path)
        return
    ownership.write_mark(path, f"{what}, being removed")
    left = ownership.remove_owned(path, what, marks=_marks(marker), first=(marker,))
    if left:
        raise UsageError(f"cannot remove {path} ({what}): another file system is mounted at "
                         f"{left[0]}", f"unmount {left[0]}, then run the command again")


def scratch(path: Path, marker: str, what: str) -> Path:
    """A fresh, empty scratch tree at `path` with the scratch mark (what was there is
    `discard`ed, or refused)."""
    path = Path(path)
    discard(path, marker, what)
    path.mkdir(parents=True)
    mark_scratch(path)
    return path


def mark_scratch(path: Path) -> None:
    (Path(path) / SCRATCH).write_text("rocforge scratch tree: rocforge deletes it when it is done\n")


def unmark_scratch(path: Path) -> None:
    """The scratch mark removed from a tree about to go in place (its `marker` now says it is
    rocforge's, written last)."""
    _unlink_file(Path(path) / SCRATCH)


# -- single files rocforge writes for the user (results plot -o, ...) ------------------------------
HEAD_BYTES = 4096  # how much of an existing file is read to find rocforge's marker


def check_own_file(path: Path, option: str, made_by_rocforge) -> None:
    """Refuse (UsageError, one line) an output file rocforge may not overwrite: a symbolic link
    (dangling or not: never written through), a directory, a FIFO or device (never opened), or a
    regular file whose first bytes do not satisfy `made_by_rocforge(head: bytes)`.  A name that
    does not exist yet is fine."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"{option} {path} cannot be read: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{option} {path} is a symbolic link; rocforge does not write through links",
                         f"give the file it points to, or a new name, as {option}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UsageError(f"{option} {path} is {kind}", f"give a new file name as {option}")
    try:  # O_NOFOLLOW|O_NONBLOCK: whatever was swapped in since the lstat is not followed or waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            head = os.read(fd, HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{option} {path} cannot be read: {exc.strerror}") from exc
    if not made_by_rocforge(head):
        raise UsageError(f"{option} {path} exists and rocforge did not make it: not overwriting it",
                         f"move it away or give another {option}")


def write_own_file(path: Path, text: str, option: str, made_by_rocforge,
                   mode: int | None = None) -> None:
    """Write `text` to `path` after `check_own_file`: into a fresh temporary sibling (O_EXCL, so
    never through someone else's file or link), then renamed over `path`, so the old file stays
    whole until the new one is complete.  Mode 0666 less the umask, as a plain write gives, or
    exactly `mode` (a script: 0755)."""
    import tempfile

    path = Path(path)
    check_own_file(path, option, made_by_rocforge)
    tmp = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".rocforge-tmp",
                                    dir=path.parent)
        tmp = Path(name)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}",
                         f"give a {option} in a writable directory") from exc
