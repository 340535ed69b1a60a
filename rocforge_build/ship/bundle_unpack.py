"""`rocforge bundle unpack`: a bundle archive into `--into/<name>`, every member through the rules
`check` applies (`bundle_archive.py`), staged in a directory of a fixed name inside --into,
verified, and renamed into place only when the whole tree checks; never over an existing tree.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from rocforge_build.errors import (
    DiskFullError,
    IntegrityError,
    UsageError,
)
from rocforge_build.ship.bundle_archive import BUNDLE_TOML, Member, archive_format, scan_archive
from rocforge_build.ship.bundle_check import verify


# -- unpack ---------------------------------------------------------------------------------------
def _prepare_into(into: Path) -> None:
    if os.path.lexists(into) and not into.is_dir():
        raise UsageError(f"--into {into} is not a directory", "give a directory (it is made if missing)")
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--into {into} cannot be made ({exc.strerror})",
                         "give a directory you can write to") from exc


class _Unpacker:
    """Writes the members `scan_archive` passed into a staging directory: a fresh tree in which
    no path comes twice and no parent is a link, so nothing can be written through one; files
    are made with O_EXCL|O_NOFOLLOW, and the declared sizes are held against the free space."""

    def __init__(self, archive: Path, into: Path, tmp: Path):
        self.archive, self.into, self.tmp = archive, into, tmp
        self.budget: int | None = None

    def __call__(self, top: str, rel: str, m: Member, fh) -> None:
        from rocforge_build import extract

        folder = self.tmp / top
        if not folder.exists():
            if os.path.lexists(self.into / top):
                raise UsageError(f"{self.into / top} exists: not unpacking over it",
                                 "remove it or unpack elsewhere (--into)")
            folder.mkdir()
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if m.kind == "dir":
            target.mkdir(exist_ok=True)
        elif m.kind == "link":
            os.symlink(m.link, target)
        else:
            if m.size and (self.budget is None or m.size > self.budget):
                self.budget = extract._room_for(self.archive, self.tmp, f"{top}/{rel}", m.size,
                                                extract.filesystem_space, "unpack elsewhere with --into")
            self.budget = None if self.budget is None else self.budget - m.size
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.fchmod(fd, (m.mode & 0o755) | 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(fh, out)


def unpack(path: Path, into: Path, *, index_first: bool = False) -> Path:
    """Unpack a bundle archive into `into/<name>` (refused if that exists), verified afterwards:
    every member through the rules `check` applies, written into a staging directory of a fixed
    name inside `into` and renamed into place only when the whole tree checks."""
    from rocforge_build import extract

    path, into = Path(path), Path(into)
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    archive_format(path)
    _prepare_into(into)
    try:
        with extract.staging(into, prefix=".rocforge-unpack-") as tmp:
            top, _ = scan_archive(path, _Unpacker(path, into, tmp), index_first=index_first)
            _, _, bad = verify(tmp / top)
            if bad:
                raise IntegrityError(f"{path.name}: {len(bad)} files do not match {BUNDLE_TOML}: "
                                     + "; ".join(bad[:5]), "the archive is damaged: make it again")
            dest = into / top
            if os.path.lexists(dest):
                raise UsageError(f"{dest} exists: not unpacking over it", "remove it or unpack elsewhere (--into)")
            os.rename(tmp / top, dest)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left while unpacking {path.name} into {into}; the partial "
                                "tree was removed", f"free space there (`df -h {into}`) or unpack "
                                "elsewhere with --into") from exc
        raise UsageError(f"cannot unpack into {into}: {exc.strerror} ({exc.filename})",
                         "give a directory you can write to (--into)") from exc
    return dest
