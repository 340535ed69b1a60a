"""Replacing a directory as a whole: build prefixes (`rocforge build --prefix`), kernel builds
(`kernels build --out`) and library closures (`container closure --out`).

rocforge replaces only what it made: a destination that does not exist, is empty, or holds
rocforge's own marker file for that kind of tree (the build manifest, the kernels' manifest, the
closure marker).  Anything else is refused before any work starts, naming the file that made it
refuse; rocforge never deletes a user's directory, so there is no flag to make it.

`swap(new, dest)` is restartable.  The old tree is moved aside to `<dest>.rocforge-old`, the new one
renamed into place, and only then is the old one deleted; the renames run with Ctrl-C/SIGTERM held
back (`signals.deferred`), and `recover(dest)` (run before every swap and at the start of every
build) finishes or undoes a swap that was cut off harder (SIGKILL, power loss): with no `dest`
the old tree is renamed back, with both the old one is deleted.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from rocforge_build import signals
from rocforge_build.errors import UsageError

OLD = ".rocforge-old"
DELETING = ".rocforge-old.deleting"


def sibling(dest: Path, suffix: str) -> Path:
    return Path(f"{dest}{suffix}")


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
    try:
        names = sorted(os.listdir(dest))
    except OSError as exc:
        raise UsageError(f"{option} {dest} cannot be read: {exc.strerror}") from exc
    if not names or _marked(dest, marker):
        return
    raise UsageError(
        f"refusing to replace {option} {dest}: it holds {dest / names[0]}, and it has no "
        f"{marker}, so rocforge did not make it",
        f"choose a new or empty directory for {option}; if everything in {dest} may go, "
        "remove it yourself first")


def _marked(tree: Path, marker: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(tree / marker).st_mode)
    except OSError:
        return False


def interrupted(dest: Path) -> bool:
    """Whether a replacement of `dest` was cut off (`recover` has something to do)."""
    return os.path.lexists(sibling(dest, OLD)) or os.path.lexists(sibling(dest, DELETING))


def recover(dest: Path, marker: str) -> str | None:
    """Finish or undo a swap of `dest` that was cut off; says what it did (None: nothing)."""
    dest = Path(dest)
    old, deleting = sibling(dest, OLD), sibling(dest, DELETING)
    done = None
    if os.path.lexists(old):
        if not os.path.lexists(dest):
            os.replace(old, dest)  # cut between the renames: the old tree comes back
            done = f"restored {dest} from an interrupted replacement"
        elif _marked(old, marker) or not os.listdir(old):
            os.replace(old, deleting)  # cut after the new tree was in place
            done = f"removed the previous tree of {dest} left by an interrupted replacement"
    if os.path.lexists(deleting):
        shutil.rmtree(deleting, ignore_errors=True)
    return done


def swap(new: Path, dest: Path, marker: str) -> None:
    """Put the tree `new` in place of `dest` (replaced as a whole; see the module's docstring)."""
    new, dest = Path(new), Path(dest)
    recover(dest, marker)
    old, deleting = sibling(dest, OLD), sibling(dest, DELETING)
    if os.path.lexists(old):
        raise UsageError(f"{old} is in the way of replacing {dest} and rocforge did not make it",
                         f"move {old} elsewhere")
    moved = os.path.lexists(dest)
    try:
        with signals.deferred():  # a signal held back here is raised when the block ends
            if moved:
                os.replace(dest, old)
            try:
                os.replace(new, dest)
            except BaseException:
                if moved:
                    os.replace(old, dest)
                raise
            if moved:
                os.replace(old, deleting)
    finally:
        if moved:  # also when that signal is on its way out (a second one leaves it to recover)
            shutil.rmtree(deleting, ignore_errors=True)
