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


def swap(new: Path, dest: Path, marker: str, keep: Path | None = None) -> None:
    """Put the tree `new` in place of `dest` (replaced as a whole; see the module's docstring).
    `keep`: the replaced tree is renamed there instead of deleted (`rocforge upgrade` keeps it
    for `rocforge rollback`); the caller has cleared that name (`retire`)."""
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
                os.replace(old, deleting if keep is None else keep)
    finally:
        if moved and keep is None:  # also when that signal is on its way out (a second one leaves it to recover)
            shutil.rmtree(deleting, ignore_errors=True)


def retire(tree: Path, marker: str, what: str) -> None:
    """Delete a whole tree rocforge made (it holds `marker`): renamed to a `.deleting` sibling
    first, so a cut-off delete never leaves a half tree under the name.  Anything else at that
    name is refused (one line), never deleted."""
    tree = Path(tree)
    if not os.path.lexists(tree):
        return
    if os.path.islink(tree) or not os.path.isdir(tree) or not _marked(tree, marker):
        raise UsageError(f"{tree} is in the way of {what} and rocforge did not make it (no "
                         f"{marker})", f"move {tree} elsewhere, then run the command again")
    gone = sibling(tree, ".deleting")
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(tree, gone)
    shutil.rmtree(gone, ignore_errors=True)


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
