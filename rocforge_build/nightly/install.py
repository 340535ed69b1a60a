"""Install, switch and prune TheRock nightlies under a prefix.

Layout (the contract `installs.find_installs` reads):
    <prefix>/<version-dir>/                     a TheRock tree
    <prefix>/<version-dir>/rocforge-install.toml   url, sha256, size, date, version, family, layers
    <prefix>/current -> <version-dir>           relative symlink, replaced atomically
    <prefix>/.downloads/                        archives (and resumable `.part` files)
    <prefix>/.lock                              one install/use/prune at a time

An install checks free space first, downloads (published checksum verified when there is one;
sha256 always recorded), extracts every layer into `<prefix>/.staging-*`, writes the record,
renames the staging dir to `<version-dir>` and only then repoints `current`.  Any failure
(network, checksum, hostile or truncated archive, full disk, Ctrl-C) removes the staging dir and
leaves `current` and every other install as they were; nothing is written outside the prefix.
The record is written without following links (`extract.write_own_file`); an archive already
complete in `.downloads/` (interrupted unpack) is used again.  What is not rocforge's (a
`current` that is a real directory, a directory in `.downloads/`) is named and left alone; prune
removes only installs whose record validates, marked leftovers and the archives a valid record
names, in a prefix that holds nothing else (checked before anything is removed), and
a prefix that is a file, below a file or read-only is one line, before any download.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rocforge_build import config, download, download_policy, extract, ownership
from rocforge_build.errors import IntegrityError, RocforgeError, UsageError
from rocforge_build.install_record import RECORD, read_record, read_record_checked, valid_record
from rocforge_build.nightly.listing import Nightly
from rocforge_build.progress import Heartbeat, human_size
from rocforge_build.rootfs import Root
from rocforge_build.shellsafe import one_line

CURRENT = "current"
DOWNLOADS = ".downloads"
_HEX64 = re.compile(r"\b[0-9a-fA-F]{64}\b")
CHECKSUM_MAX = 64 << 10  # a checksum file is a line or a few; more is not one


class LockedError(RocforgeError):
    exit_code = 1


@dataclass(frozen=True)
class Installed:
    name: str
    path: Path
    record: dict
    current: bool

    problem: str | None = None  # why the record could not be read in full

    @property
    def version(self) -> str | None:
        return self.record.get("version")

    def to_json(self) -> dict:
        return {"name": self.name, "path": str(self.path), "current": self.current,
                "version": self.version, "family": self.record.get("family"),
                "layers": [layer.get("family") for layer in self.record.get("layers", [])],
                "date": self.record.get("date"), "sha256": self.record.get("sha256"),
                "url": self.record.get("url"), "problem": self.problem}


@dataclass
class InstallResult:
    path: Path
    record: dict
    previous: str | None
    reused: bool = False
    notes: list[str] = field(default_factory=list)


def resolve_prefix(explicit: str | os.PathLike[str] | None, cfg: dict | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().absolute()
    return config.nightly_prefix(cfg)


def prefix_in_root(explicit: str | os.PathLike[str] | None, cfg: dict, root: Root | None) -> Path:
    """The prefix as a real path.  With `--root DIR` the prefix is a path inside DIR (a container
    or image filesystem), unless it already lies below DIR."""
    prefix = resolve_prefix(explicit, cfg)
    if root is None or root.is_host:
        return prefix
    try:
        root.inner(prefix)
        return prefix
    except ValueError:
        return root.host(prefix)


def prepare_prefix(prefix: Path) -> None:
    """Make the prefix (and check it can be written), or one clear line saying why not."""
    try:
        prefix.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"the prefix {prefix} is a file, not a directory",
                         "give --prefix a directory (it is made when missing)") from None
    except NotADirectoryError:
        above = next((p for p in prefix.parents if p.exists() and not p.is_dir()), prefix.parent)
        raise UsageError(f"the prefix {prefix} lies below {above}, which is a file",
                         "give --prefix a directory (it is made when missing)") from None
    except OSError as exc:
        raise _cannot_write(prefix, exc) from None
    cur = prefix / CURRENT
    if os.path.lexists(cur) and not cur.is_symlink():
        raise UsageError(f"{cur} is a {'directory' if cur.is_dir() else 'file'}, not the link "
                         "rocforge keeps there; rocforge will not replace it",
                         "move it away (it may be yours) or install into another --prefix")
    downloads = prefix / DOWNLOADS
    if os.path.lexists(downloads) and (downloads.is_symlink() or not downloads.is_dir()):
        raise UsageError(f"{downloads} is not a directory; rocforge keeps its downloads there",
                         "move it away, then run the command again")


def _cannot_write(prefix: Path, exc: OSError) -> UsageError:
    return UsageError(f"cannot write to the prefix {prefix}: {exc.strerror or exc}",
                      "choose a --prefix you can write to (or fix its permissions)")


def version_dir_name(layers: list[Nightly]) -> str:
    top = layers[-1]
    groups = "+".join(layer.family for layer in layers)
    return f"therock-{top.version}-{groups}"


# -- the lock ----------------------------------------------------------------------------------

@contextlib.contextmanager
def locked(prefix: Path) -> Iterator[None]:
    import fcntl

    prepare_prefix(prefix)
    try:
        fd = os.open(prefix / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise _cannot_write(prefix, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"another rocforge is installing into {prefix}",
                              "wait for it to finish, then run the command again") from None
        yield
    finally:
        os.close(fd)


# -- install -----------------------------------------------------------------------------------

def published_checksum(entry: Nightly, suffixes: list[str], *, session=None) -> tuple[str, str] | None:
    """(sha256, checksum URL) from a `<tarball><suffix>` file beside the tarball, if published."""
    for suffix in suffixes:
        url = entry.url + suffix
        text = download.get_text(url, session=session, missing_ok=True, max_bytes=CHECKSUM_MAX)
        if text is None:
            continue
        for line in text.splitlines():
            m = _HEX64.search(line)
            if m and (len(line.split()) < 2 or entry.name in line or len(text.splitlines()) == 1):
                return m.group(0).lower(), url
        raise IntegrityError(f"{url} holds no sha256 for {entry.name}",
                             "the mirror's checksum file is malformed; report it")
    return None


def install(layers: list[Nightly], prefix: Path, *, cfg: dict, progress: bool = True,
            session=None, force: bool = False, sha256: str | None = None,
            log: Callable[[str], None] | None = None, switch_current: bool = True
            ) -> InstallResult:
    """Install `layers` (base first, each extracted over the previous) as one version dir.
    `switch_current=False` (`nightly install --gate`): installed beside, `current` unchanged."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    ncfg = cfg["nightly"]
    policy = download_policy.policy_from_config(cfg, log)
    name = version_dir_name(layers)
    final = prefix / name
    with locked(prefix):
        previous = current_name(prefix)
        if os.path.lexists(final) and (final.is_symlink() or not valid_record(final)):
            # reused, or with --force moved aside and removed, only when its record proves it
            raise UsageError(f"{final} exists and is not an install rocforge made (no valid "
                             f"{RECORD}): "
                             "rocforge will not use or replace it",
                             "move it away (it may be yours), then run the install again")
        if final.exists() and not force:
            if switch_current:
                switch(prefix, name)
            record = read_record(final)
            return InstallResult(final, record, previous, reused=True,
                                 notes=[f"{name} was already installed" + (
                                     "; `current` points at it" if switch_current else "")])
        sizes = [e.size if e.size is not None
                 else download.remote_size(e.url, session=session, policy=policy)
                 for e in layers]
        downloads = prefix / DOWNLOADS
        for entry in layers:
            _check_download_slot(downloads / entry.name)
        check_space(prefix, layers, sizes, float(ncfg["extract_ratio"]))
        fetched = []
        for entry, size in zip(layers, sizes, strict=True):
            given = sha256 if entry is layers[-1] else None
            published = None if given else published_checksum(
                entry, list(ncfg["checksum_suffixes"]), session=session)
            want = given or (published[0] if published else None)
            how = ("given with --sha256" if given else
                   f"published at {published[1]}" if published else "none published; recorded")
            dest = downloads / entry.name
            if size and dest.is_file() and dest.stat().st_size == size:
                log(f"reusing {entry.name} from an earlier run ({human_size(size)}, complete)")
            else:
                log(f"downloading {entry.name}" + (f" ({human_size(size)})" if size else ""))
            res = download.download(entry.url, dest, sha256=want, expected_size=size,
                                    progress=progress, session=session, policy=policy)
            fetched.append((entry, res, how, want is not None))
        with extract.staging(prefix, what="a nightly install being unpacked") as stage:
            try:
                _unpack(fetched, stage, log, progress)
                check_tree(stage, layers[-1])
            except IntegrityError:
                for _e, res, _h, _v in fetched:  # a bad archive is not kept for reuse
                    res.path.unlink(missing_ok=True)
                raise
            record = make_record(fetched, ncfg["platform"])
            write_record(stage / RECORD, record)
            (stage / ownership.MARK).unlink(missing_ok=True)  # its valid record proves it now
            trash = None
            if final.exists():
                trash = prefix / f".trash-{name}-{os.getpid()}"
                os.rename(final, trash)
            try:
                os.rename(stage, final)
            except OSError:
                if trash is not None:
                    os.rename(trash, final)
                raise
        if trash is not None:
            extract.remove_tree(trash, "a replaced nightly install", (ownership.MARK, RECORD))
        if switch_current:
            switch(prefix, name)
        if not ncfg.get("keep_archives"):
            for _e, res, _h, _v in fetched:
                res.path.unlink(missing_ok=True)
        return InstallResult(final, record, previous)


def _unpack(fetched: list, stage: Path, log: Callable[[str], None], progress: bool) -> None:
    """Every layer into `stage`, in order.  Not on a terminal (a CI log), a line every interval:
    `unpack [layer/layers] ELAPSED: NAME: FILES files, SIZE written` (a layer of GBs takes minutes)."""
    with Heartbeat("unpack", enabled=progress) as beat:
        for i, (entry, res, _how, _v) in enumerate(fetched, 1):
            log(f"unpacking {entry.name}")
            seen = {"files": 0, "bytes": 0}

            def member(m, name=entry.name, seen=seen) -> None:
                if m.isreg():
                    seen["files"] += 1
                    seen["bytes"] += m.size
                beat.update(detail=f"{name}: {seen['files']} files, {human_size(seen['bytes'])} written")

            beat.update(i, len(fetched), f"{entry.name}: 0 files")
            extract.safe_extract(res.path, stage, on_member=member)


def _check_download_slot(dest: Path) -> None:
    """`.downloads/<name>` and its `.part` are rocforge's files: something else there (a
    directory) is left alone and named."""
    for p in (dest, download.part_path(dest)):
        if os.path.lexists(p) and (p.is_symlink() or not p.is_file()):
            raise UsageError(f"{p} is not a file rocforge downloaded (a directory or a link); "
                             "rocforge will not replace it",
                             "move it away, then run the command again")


def check_space(prefix: Path, layers: list[Nightly], sizes: list[int | None], ratio: float) -> None:
    known = [s for s in sizes if s]
    if not known:
        return
    downloads = prefix / DOWNLOADS
    need = 0
    for entry, size in zip(layers, sizes, strict=True):
        if not size:
            continue
        part = download.part_path(downloads / entry.name)
        have = part.stat().st_size if part.exists() else 0
        need += max(size - have, 0) + int(size * ratio)
    free = download.free_bytes(prefix)
    if free < need:
        raise download.DiskFullError(
            f"not enough free space in {prefix}: {human_size(need)} needed "
            f"(archive + unpacked tree), {human_size(free)} free",
            "free space, prune old installs (`rocforge nightly prune --keep 1`) or choose "
            "another --prefix",
        )


def check_tree(stage: Path, top: Nightly) -> None:
    if not (stage / "bin").is_dir() and not (stage / "lib").is_dir():
        raise IntegrityError(
            f"{top.name} did not unpack to a ROCm tree (no bin/ or lib/); nothing was installed",
            "the file is not a TheRock dist tarball; check the source URL",
        )


def make_record(fetched, platform: str) -> dict:
    layers = [{
        "name": entry.name, "url": entry.url, "family": entry.family, "version": entry.version,
        "sha256": res.sha256, "size": res.size, "checksum": how, "verified": verified,
    } for entry, res, how, verified in fetched]
    top_entry, top_res, _how, verified = fetched[-1]
    return {
        "version": top_entry.version,
        "family": top_entry.family,
        "platform": platform,
        "url": top_entry.url,
        "sha256": top_res.sha256,
        "size": top_res.size,
        "verified": verified,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "build_date": top_entry.date.isoformat() if top_entry.date else "",
        "layers": layers,
    }


def write_record(path: Path, record: dict) -> None:
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment("written by `rocforge nightly install`; read by rocforge env/doctor"))
    for k, v in record.items():
        if k != "layers":
            doc[k] = v
    aot = tomlkit.aot()
    for layer in record["layers"]:
        t = tomlkit.table()
        for k, v in layer.items():
            t[k] = v
        aot.append(t)
    doc["layers"] = aot
    extract.write_own_file(path, tomlkit.dumps(doc))


# -- current / installed / use / prune ---------------------------------------------------------

def current_name(prefix: Path) -> str | None:
    link = prefix / CURRENT
    if not link.is_symlink():
        return None
    return os.readlink(link).rstrip("/").rsplit("/", 1)[-1]


def switch(prefix: Path, name: str) -> None:
    """Point `<prefix>/current` at `<prefix>/<name>` atomically: a new relative link renamed over
    it (rename(2) replaces the name in one step), so `current` is always one whole link.  The
    caller holds the prefix's lock (`locked`)."""
    if not (prefix / name).is_dir():
        raise UsageError(f"{name} is not installed in {prefix}")
    cur = prefix / CURRENT
    if os.path.lexists(cur) and not cur.is_symlink():
        raise UsageError(f"{cur} is not the link rocforge keeps there; rocforge will not "
                         "replace it", "move it away (it may be yours), then run `rocforge "
                         f"nightly use {name}`")
    for stale in prefix.glob(".current-*"):  # a temporary link of a switch that was killed
        if stale.is_symlink():
            stale.unlink()
    tmp = prefix / f".current-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(name, tmp)
    try:
        os.replace(tmp, prefix / CURRENT)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def installed(prefix: Path) -> list[Installed]:
    cur = current_name(prefix)
    out = []
    if not prefix.is_dir():
        return out
    for p in sorted(prefix.iterdir()):
        if p.name.startswith(".") or p.name == CURRENT or p.is_symlink() or not p.is_dir():
            continue
        if not (p / RECORD).exists():
            continue
        record, problem = read_record_checked(p)
        out.append(Installed(p.name, p, record, p.name == cur, problem))
    out.sort(key=_age_key, reverse=True)
    return out


def _age_key(i: Installed) -> tuple:
    return (i.record.get("build_date", ""), i.record.get("date", ""), i.name)


def find(prefix: Path, wanted: str) -> Installed:
    items = installed(prefix)
    exact = [i for i in items if i.name == wanted]
    if exact:
        return exact[0]
    by_version = [i for i in items if i.version == wanted]
    if len(by_version) == 1:
        return by_version[0]
    if len(by_version) > 1:
        raise UsageError(f"{wanted} matches several installs: "
                         f"{', '.join(i.name for i in by_version)}", "give the directory name")
    names = ", ".join(i.name for i in items) or "none"
    raise UsageError(f"{wanted} is not installed in {prefix}",
                     f"installed: {names}; install it with `rocforge nightly install --version`")


def use(prefix: Path, wanted: str) -> tuple[Installed, str | None]:
    with locked(prefix):
        target = find(prefix, wanted)
        previous = current_name(prefix)
        switch(prefix, target.name)
        return target, previous


def prune(prefix: Path, keep: int) -> list[str]:
    """Remove all but the `keep` newest installs (the current one is always kept), and leftovers
    of interrupted runs (staging dirs, partial downloads): only what carries rocforge's mark or a
    record that validates (ownership.py), never in a prefix that is `/`, HOME or above HOME or
    holds entries rocforge never makes there, never across a mount, never writing a mark first."""
    if keep < 0:
        raise UsageError("--keep must be 0 or more")
    check_prune_root(prefix)
    removed = []
    with locked(prefix):
        items = installed(prefix)
        for i in [i for i in items if not valid_record(i.path)]:
            _left(i.path, f"its {RECORD} does not validate, so nothing proves rocforge made it")
            items.remove(i)
        archives = _recorded_archives(items)
        keep_names = {i.name for i in items[:keep]} | {i.name for i in items if i.current}
        for i in items:
            if i.name not in keep_names and not _remove_install(prefix, i):
                removed.append(i.name)
        for p in prefix.iterdir():
            if (ownership.is_marked(p) and not (p / RECORD).exists()
                    and p.name != current_name(prefix)):
                if not _remove_owned(p):  # what an interrupted prune left of an install
                    removed.append(p.name)
            elif p.name.startswith(".current-") and p.is_symlink():
                if SWITCH_LINK.fullmatch(p.name) and "/" not in os.readlink(p):
                    p.unlink()  # the link `switch` was making
                    removed.append(p.name)
                else:
                    _left(p, "it is not the link rocforge makes there")
            elif p.name.startswith((".staging-", ".trash-")) and not p.is_symlink():
                if ownership.is_marked(p) or valid_record(p):
                    if not _remove_owned(p, last=(RECORD, ownership.MARK)):
                        removed.append(p.name)
                else:
                    _left(p, "it carries no mark of rocforge's and no valid install record")
        removed += _prune_downloads(prefix / DOWNLOADS, archives)
    return removed


# `switch`'s temporary link: `.current-PID-NANOSECONDS`, pointing at a name in the prefix
SWITCH_LINK = re.compile(r"\.current-\d+-\d+")
def check_prune_root(prefix: Path) -> None:
    """cache clean's root check for a nightly prefix: never `/`, HOME or above HOME (by
    identity), never a directory holding entries rocforge does not make there."""
    why = ownership.forbidden_root(prefix)
    if why is None and prefix.is_dir():
        foreign = sorted(p.name for p in prefix.iterdir() if not _prefix_entry(prefix, p))
        if foreign:
            shown = ", ".join(repr(n) for n in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            why = (f"it holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} rocforge "
                   f"did not make ({shown})")
    if why is not None:
        raise UsageError(f"rocforge nightly prune refuses {prefix}: {why}",
                         "give the nightly prefix itself (--prefix), or move what is not a "
                         "nightly install out of it; nothing was removed")


def _prefix_entry(prefix: Path, p: Path) -> bool:
    """Whether `p` is a name rocforge makes in a nightly prefix, or a directory with its mark or
    an install record (one that does not validate is left, with a warning, not removed)."""
    if p.name in (CURRENT, DOWNLOADS, ".lock") or p.name.startswith(
            (".staging-", ".trash-", ".current-")):
        return True
    return not p.is_symlink() and p.is_dir() and (ownership.is_marked(p) or (p / RECORD).is_file())


def _recorded_archives(items: list[Installed]) -> dict[str, int]:
    """The archive names (and sizes) the valid records name: `.downloads/<layer name>`."""
    return {layer["name"]: layer["size"] for i in items for layer in i.record["layers"]
            if isinstance(layer.get("size"), int) and "/" not in layer["name"]}


def _remove_install(prefix: Path, i: Installed) -> list[str]:
    """Rename install `i` out of the listing (`.trash-NAME-PID`) and remove it with its record
    last: what a kill leaves is a `.trash-` dir whose valid record the next prune recognises."""
    trash = prefix / f".trash-{i.name}-{os.getpid()}"
    os.rename(i.path, trash)
    return _remove_owned(trash, last=(RECORD, ownership.MARK))


def _prune_downloads(downloads: Path, archives: dict[str, int]) -> list[str]:
    """Remove the archives a valid record names (by name and size) and download.py's partial
    downloads (a `.part` with its `.part.validator`); anything else there is someone's."""
    removed: list[str] = []
    if not downloads.is_dir() or downloads.is_symlink():
        return removed
    for p in sorted(downloads.iterdir()):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        partial = (p.name.endswith(".part") and ARCHIVE_NAME.fullmatch(p.name)
                   and os.path.isfile(download.validator_path(p)))
        validator = (p.name.endswith(".part.validator")
                     and os.path.isfile(p.with_name(p.name[:-len(".validator")])))
        if not stat.S_ISREG(st.st_mode) or not (
                archives.get(p.name) == st.st_size or partial or validator):
            _left(p, "rocforge removes there only the archives its install records name")
            continue
        p.unlink()
        removed.append(f"{DOWNLOADS}/{p.name}")
    return removed


# TheRock's archives as download.py keeps them (with `.part` and its validator while partial)
ARCHIVE_NAME = re.compile(r"[^/]+\.(tar\.gz|tgz|tar\.xz|tar\.zst|tar)(\.part(\.validator)?)?"
                          r"|[^/]+\.(sha256|sha256sum)(\.part(\.validator)?)?")


def _remove_owned(path: Path, first: tuple[str, ...] = (),
                  last: tuple[str, ...] = (ownership.MARK,)) -> list[str]:
    """Remove `path` on its own file system only; a mount inside it is named and kept."""
    left = ownership.remove_tree_one_device(path, first=first, last=last)
    for mount in left:
        _left(Path(mount), "another file system is mounted there")
    return left


def _left(path: Path, why: str) -> None:
    print(f"rocforge: warning: left {one_line(path)} in place: {why}", file=sys.stderr)
