"""Bundle archives (.tar.gz, .tar.zst, .zip): writing one, and reading one through the rules
`check` (archive or unpacked folder) and `unpack` share (`Folder`, `parse_bundle_toml`,
`scan_archive`): one top folder named as bundle.toml's plain `name`, each path once, nothing
written below a file or through a link, every link resolving inside the bundle's own folder;
anything else, a damaged stream or bundle.toml included, is one IntegrityError.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import stat
import subprocess
import tarfile
import tempfile
import tomllib
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import proc, rootfs, schema, shellsafe
from rocforge_build.errors import (
    IntegrityError,
    RocforgeError,
    ToolchainError,
    UsageError,
)

BUNDLE_TOML = "bundle.toml"
FORMATS = (".tar.gz", ".tgz", ".tar.zst", ".zip")
_ZIP_LINK = 0o120000

# -- archives -------------------------------------------------------------------------------------
def archive_format(path: Path) -> str:
    name = path.name
    for suffix in FORMATS:
        if name.endswith(suffix):
            return ".tar.gz" if suffix == ".tgz" else suffix
    raise UsageError(f"{path}: unknown bundle format", f"name it FILE{', FILE'.join(FORMATS)}")


def zstd_program() -> str:
    found = proc.which("zstd")
    if found is None:
        raise ToolchainError("a .tar.zst bundle needs the zstd program, which was not found",
                             "apt-get install zstd, or choose --out FILE.tar.gz or FILE.zip")
    return found


def write_archive(tree: Path, out: Path) -> None:
    """`tree` as `out` (its top directory kept), written beside `out` and renamed into place."""
    fmt = archive_format(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if fmt == ".zip":
            _write_zip(tree, tmp)
        elif fmt == ".tar.gz":
            # gzip's own default level: tarfile's 9 compresses ROCm's device code barely smaller
            # in about twice the time (docs/measurements/bundles.md)
            with tarfile.open(tmp, "w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tf:
                _add_tree(tf, tree)
        else:
            plain = tmp.with_suffix(".tar")
            try:
                with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tf:
                    _add_tree(tf, tree)
                proc.run([zstd_program(), "-q", "-f", "-T0", str(plain), "-o", str(tmp)], timeout=None)  # size-bound
            finally:
                plain.unlink(missing_ok=True)
        # mkstemp's file is 0600: the archive is for sharing, so it gets the umask's mode
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _add_tree(tf: tarfile.TarFile, tree: Path) -> None:
    """The top folder, bundle.toml right after it, then the rest in sorted order: a reader that
    has the index first can hold every later member to it before writing a byte (`index_first`)."""
    tf.add(tree, arcname=tree.name, recursive=False, filter=_tar_filter)
    if (tree / BUNDLE_TOML).is_file():
        tf.add(tree / BUNDLE_TOML, arcname=f"{tree.name}/{BUNDLE_TOML}", filter=_tar_filter)
    for name in sorted(os.listdir(tree)):
        if name != BUNDLE_TOML:
            tf.add(tree / name, arcname=f"{tree.name}/{name}", filter=_tar_filter)


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_zip(tree: Path, out: Path) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        index = tree / BUNDLE_TOML  # first, as in a tar (`_add_tree`)
        for p in sorted(tree_entries(tree), key=lambda p: p != index):
            arc = f"{tree.name}/{p.relative_to(tree).as_posix()}"
            if p.is_symlink():  # Info-ZIP's convention: mode S_IFLNK, the target as the data
                info = zipfile.ZipInfo(arc)
                info.create_system = 3
                info.external_attr = (_ZIP_LINK | 0o777) << 16
                zf.writestr(info, os.readlink(p))
            else:
                zf.write(p, arc)


def tree_entries(tree: Path) -> Iterator[Path]:
    """Every file and symbolic link under `tree` (links to directories too, not followed), in
    sorted order: what bundle.toml records, an archive holds and `verify` compares."""
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for n in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            yield Path(dirpath, n)


# -- reading a bundle: the rules `check` (archive or folder) and `unpack` share -------------------
MAX_TOML = 64 << 20  # bundle.toml of a ROCm bundle of 3,000 files is under 1 MB
_MAX_LINK = 4096  # PATH_MAX: no link target on Linux is longer
_MAX_HOPS = 40  # Linux's MAXSYMLINKS: more links in one lookup is ELOOP
_DAMAGED_HINT = ("the bundle is damaged or hostile: do not unpack it by hand; make it again from "
                 "the build (rocforge bundle PREFIX --target GFX --out FILE)")
# what a damaged archive raises while it is read (never a write: those are the caller's)
_DAMAGE = (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile, lzma.LZMAError, OSError,
           RuntimeError, NotImplementedError, ValueError)


def refuse(where: str, name: str, why: str) -> IntegrityError:
    return IntegrityError(f"{where}: refusing {name!r}: {why}", _DAMAGED_HINT)


def _damaged(where: str, fmt: str, exc: BaseException | str) -> IntegrityError:
    from rocforge_build import extract

    why = exc if isinstance(exc, str) else extract._reason(exc)
    return IntegrityError(f"{where} is truncated or not a readable {fmt} archive ({why})", _DAMAGED_HINT)


_NOT_PLAIN = "is not a plain folder name (one path component, no '/', '..' or control characters)"


def _is_plain_name(name: object) -> bool:
    """A bundle's folder name is one plain path component: it names a directory under --into."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and name.isprintable() and _utf8(name) and len(name.encode("utf-8")) <= 255)


def _plain_name(where: str, name: str, what: str) -> None:
    if not _is_plain_name(name):
        raise IntegrityError(f"{where}: {what} {name!r} {_NOT_PLAIN}", _DAMAGED_HINT)


def _utf8(text: str) -> bool:
    """False for a name with bytes that are not UTF-8 (os and tarfile keep them as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Folder:
    """The entries of one bundle folder as they come (an archive's members, or a directory's
    entries), held to the rules every reader applies: each path once; nothing below a file or
    through a link; every link resolving inside the folder itself, never through its parent (a
    bundle is moved and renamed freely, and `unpack` stages it beside other things)."""

    def __init__(self, where: str):
        self.where = where
        self.kinds: dict[str, str] = {"": "dir"}
        self.links: dict[str, str] = {}

    def add(self, rel: str, kind: str, link: str = "", shown: str | None = None) -> None:
        shown = shown or rel
        if not _utf8(rel):
            raise refuse(self.where, shown, "the name is not UTF-8; rocforge makes no such bundle")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            have = self.kinds.setdefault(parent, "dir")
            if have == "link":
                raise refuse(self.where, shown, f"it would be written through the link {parent}")
            if have != "dir":
                raise refuse(self.where, shown, f"it lies below the file {parent}")
        have = self.kinds.get(rel)
        if have is not None and not have == kind == "dir":
            raise refuse(self.where, shown, f"the path comes twice (a {have}, then a {kind}); "
                          "rocforge writes each path once")
        self.kinds[rel] = kind
        if kind == "link":
            self.links[rel] = link
            self._resolve(rel, shown)  # the links so far; all of them again in finish()

    def finish(self) -> None:
        """Every link again, now that all are known: one that looked harmless can leave the folder
        once a later link is in place (`p -> q/q/../../../x` before `q -> .`)."""
        for rel in self.links:
            self._resolve(rel, rel)

    def _resolve(self, rel: str, shown: str) -> None:
        target = self.links[rel]
        if not target or target.startswith("/") or "\0" in target:
            raise refuse(self.where, shown, f"a link to {target!r}: absolute or empty")
        if len(target) > _MAX_LINK or not _utf8(target):
            raise refuse(self.where, shown, "a link target that no rocforge bundle has")
        hops = [0]
        self._walk(rel.split("/")[:-1], target, shown, target, hops)

    def _walk(self, at: list[str], target: str, shown: str, first: str, hops: list[int]) -> list[str]:
        """Resolve `target` from the folder `at` as the kernel would (following the bundle's own
        links, at most _MAX_HOPS of them in all); refuse as soon as it climbs above the folder."""
        cur = list(at)
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not cur:
                    raise refuse(self.where, shown, f"the link -> {first!r} resolves outside the "
                                  "bundle's folder")
                cur.pop()
                continue
            cur.append(part)
            here = "/".join(cur)
            if here in self.links:
                hops[0] += 1
                if hops[0] > _MAX_HOPS:
                    raise refuse(self.where, shown, "too many levels of links (a loop)")
                cur = self._walk(cur[:-1], self.links[here], shown, first, hops)
        return cur


@dataclass(frozen=True)
class Member:
    name: str  # as in the archive
    kind: str  # "file" | "dir" | "link"
    link: str = ""
    mode: int = 0o644
    size: int = 0


class _Guarded:
    """A member's data: a damaged stream (a bad deflate block or CRC, an archive cut short) ends
    as an IntegrityError naming the archive, not as a crash in whoever is reading."""

    def __init__(self, fh, where: str, fmt: str):
        self._fh, self._where, self._fmt = fh, where, fmt

    def read(self, n: int = -1) -> bytes:
        try:
            return self._fh.read(n)
        except _DAMAGE as exc:
            raise _damaged(self._where, self._fmt, exc) from exc


def _open_archive(path: Path):
    """The archive, opened only if it is a regular file (a FIFO would block the read forever)."""
    try:
        return rootfs.open_regular(path)
    except rootfs.NotRegularFile as exc:
        raise UsageError(f"{path} is {exc.kind}, not a bundle archive",
                         "give the bundle file (.tar.gz, .tar.zst, .zip) or its unpacked folder") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from exc


def _members(path: Path) -> Iterator[tuple[Member, _Guarded | None]]:
    """Every member of a bundle archive with a reader for files (stream order)."""
    fmt = archive_format(path)
    zstd = zstd_program() if fmt == ".tar.zst" else None
    with _open_archive(path) as raw:
        if fmt == ".zip":
            yield from _zip_members(raw, path.name)
        elif zstd is not None:
            yield from _zst_members(raw, path.name, zstd)
        else:
            from rocforge_build import extract

            try:
                with extract.open_tar_stream(raw) as (tf, drain):
                    yield from _tar_members(tf, path.name, fmt)
                    drain()  # to the end: the gzip CRC32 and length are checked there
            except _DAMAGE as exc:
                raise _damaged(path.name, fmt, exc) from exc


def _tar_members(tf: tarfile.TarFile, where: str, fmt: str) -> Iterator[tuple[Member, _Guarded | None]]:
    for m in tf:
        if m.issym():
            yield Member(m.name, "link", m.linkname), None
        elif m.isdir():
            yield Member(m.name, "dir", mode=m.mode), None
        elif m.isreg():
            yield Member(m.name, "file", mode=m.mode, size=m.size), _Guarded(tf.extractfile(m), where, fmt)
        else:
            raise refuse(where, m.name, "neither file, directory nor symbolic link; rocforge makes "
                          "no such bundle")


def _zst_members(raw, where: str, zstd: str) -> Iterator[tuple[Member, _Guarded | None]]:
    """A .tar.zst through the zstd program; its verdict (a cut frame, a bad checksum) counts."""
    from rocforge_build import extract

    child = proc.spawn([zstd, "-d", "-c", "-q"], stdin=raw, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)

    def ended() -> str | None:
        child.stdout.close()
        err = child.stderr.read().decode("utf-8", "replace").strip()
        child.stderr.close()
        return (err.splitlines() or ["zstd failed"])[-1] if child.wait() != 0 else None

    try:
        try:
            with tarfile.open(fileobj=child.stdout, mode="r|") as tf:
                yield from _tar_members(tf, where, ".tar.zst")
            extract._drain(child.stdout)
        except _DAMAGE as exc:
            raise _damaged(where, ".tar.zst", ended() or exc) from exc
        failed = ended()
        if failed:
            raise _damaged(where, ".tar.zst", failed)
    finally:
        if child.returncode is None:  # the reader stopped early: zstd ends on the closed pipe
            ended()


def _zip_members(raw, where: str) -> Iterator[tuple[Member, _Guarded | None]]:
    try:
        with zipfile.ZipFile(raw) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                kind = stat.S_IFMT(mode)
                if kind == stat.S_IFLNK:  # Info-ZIP's convention: the target is the data
                    if info.file_size > _MAX_LINK:
                        raise refuse(where, info.filename, "a link target longer than PATH_MAX")
                    try:
                        target = zf.read(info).decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise refuse(where, info.filename, "a link target that is not UTF-8") from exc
                    yield Member(info.filename, "link", target), None
                elif kind == stat.S_IFDIR or info.is_dir():
                    yield Member(info.filename.rstrip("/"), "dir"), None
                elif kind in (0, stat.S_IFREG):
                    with zf.open(info) as fh:
                        yield (Member(info.filename, "file", mode=mode & 0o777 or 0o644, size=info.file_size),
                               _Guarded(fh, where, ".zip"))
                else:
                    raise refuse(where, info.filename, "neither file, directory nor symbolic link; "
                                  "rocforge makes no such bundle")
    except _DAMAGE as exc:
        raise _damaged(where, ".zip", exc) from exc


def read_capped(fh, limit: int, where: str) -> bytes:
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise IntegrityError(f"{where} is over {limit >> 20} MB: no rocforge bundle has one that large",
                             _DAMAGED_HINT)
    return data


# bundle.toml's one schema: every key bundle.render_toml writes has a spec here, and any other key
# is refused (`_Closed`): rocforge vouches for a bundle only as it made it, and a key no spec
# names would reach `check`'s output (--json prints [bundle]) unchecked.  The same specs judge
# the names `rocforge bundle` records (`record_problem`), so it never makes a bundle this refuses.
MAX_FILE_SIZE = 1 << 40  # 1 TiB: ROCm's largest file (a kernel pack) is a few GB
_MAX_TEXT = 1 << 16


def _field(path: str, key: object) -> str:
    shown = key if isinstance(key, str) and key.isprintable() and key else repr(key)
    return f"{path}.{shown}" if path else shown


class _Closed(schema.Record):
    """A Record that refuses a key it has no spec for; an optional key that is absent (and has
    no default) stays absent, so the record reads back as it was written."""

    def take(self, value, path):
        if isinstance(value, dict):
            extra = [k for k in value if k not in self.fields]
            if extra:
                raise schema.Bad(_field(path, extra[0]), "is not a key rocforge writes in bundle.toml")
        out = super().take(value, path)
        return {k: v for k, v in out.items() if k in value or v is not None}


class _Text(schema.Spec):
    """One line of printable text: what `check` prints can start no new line or escape sequence."""

    what = "one line of printable text"

    def __init__(self, *, empty: bool = True, most: int = _MAX_TEXT):
        self.empty, self.most = empty, most

    def take(self, value, path):
        if not isinstance(value, str):
            raise schema.Bad(path, f"{value!r:.160} is not a string")
        if not value and not self.empty:
            raise schema.Bad(path, "is empty")
        if len(value) > self.most or not value.isprintable():
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        return value


class _RelPath(_Text):
    """A plain path inside the bundle: relative, no empty, '.' or '..' component."""

    what = "a plain relative path inside the bundle"

    def __init__(self):
        super().__init__(empty=False, most=4096)

    def take(self, value, path):
        super().take(value, path)
        if any(part in ("", ".", "..") for part in value.split("/")):
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        return value


class _LinkTarget(_Text):
    what = "a relative link target (a link of a bundle stays inside it)"

    def __init__(self):
        super().__init__(empty=False, most=_MAX_LINK)

    def take(self, value, path):
        if super().take(value, path).startswith("/"):
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        return value


class _Target(schema.Spec):
    """A GPU target name of the target grammar (gfxNNN), or one of `also`."""

    def __init__(self, *also: str):
        self.also = also
        self.what = "a GPU target name (gfx followed by 3 or 4 digits and letters)" + (
            f" or one of {', '.join(repr(a) for a in also)}" if also else "")

    def take(self, value, path):
        from rocforge_build.discover import targets

        if isinstance(value, str) and value in self.also:
            return value
        try:
            targets.gfx_version(value if isinstance(value, str) else "")
        except ValueError:
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}") from None
        return value


class _FolderName(_Text):
    def take(self, value, path):
        if not isinstance(value, str):
            raise schema.Bad(path, f"{value!r:.160} is not a string")
        if not _is_plain_name(value):
            raise schema.Bad(path, f"{value!r:.160} {_NOT_PLAIN}")
        return value


class _Sha256(schema.Spec):
    what = "a sha256 (64 lowercase hex digits)"

    def take(self, value, path):
        if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        return value


class _Env(schema.Spec):
    """The launcher's env: every name and value by shellsafe's rules (those of `check_env`, which
    the launcher's emitter applies), values strings as rocforge writes them."""

    what = 'a table of NAME = "value"'

    def take(self, value, path):
        if not isinstance(value, dict):
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        for k, v in value.items():
            problem = shellsafe.env_name_problem(k) or shellsafe.env_value_problem(v)
            if problem:
                raise schema.Bad(_field(path, k), problem)
        return value


def _sha256_or_link(entry: dict, path: str) -> None:
    if (entry["sha256"] is None) == (entry["link"] is None):
        raise schema.Bad(path, f"[[file]] {entry['path']!r} needs one of `sha256` or `link` (a string)")


def _each_path_once(info: dict, path: str) -> None:
    seen: set[str] = set()
    for i, f in enumerate(info["file"]):
        if f["path"] in seen:
            raise schema.Bad(f"file[{i}].path", f"[[file]] {f['path']!r} is listed twice")
        seen.add(f["path"])


_Opt = schema.Optional
_FILE = _Closed({"path": _RelPath(), "sha256": _Opt(_Sha256()), "link": _Opt(_LinkTarget()),
                 "size": _Opt(schema.Int(0, MAX_FILE_SIZE)), "from": _Opt(_Text())}, rules=(_sha256_or_link,))
_META = _Closed({
    "name": _FolderName(), "made_by": _Text(), "rocforge": _Opt(_Text()), "made_at": _Opt(_Text()),
    "recipe": _Opt(_Text()), "backend": _Opt(_Text()), "gpu_meaning": _Opt(_Text()), "glibc": _Opt(_Text()),
    "target": _Opt(_Target("")), "gpu": _Opt(_Target("none", "vulkan")),
    "kernel_targets": _Opt(schema.ListOf(_Target())), "launcher": _Opt(_RelPath()),
})
BUNDLE_SCHEMA = _Closed({
    "bundle": _META,
    "decisions": _Opt(schema.ListOf(_Closed({"key": _Text(empty=False), "value": _Text(), "reason": _Text()})), []),
    "excluded": _Opt(schema.ListOf(_Closed({"library": _Text(empty=False), "why": _Text()})), []),
    "kernels": _Opt(schema.ListOf(_Closed({
        "dir": _RelPath(), "kept": schema.Int(0, 1 << 24), "dropped": schema.Int(0, 1 << 24),
        "targets": schema.ListOf(_Target()), "reason": _Text()})), []),
    "env": _Opt(_Env(), {}),
    "file": _Opt(schema.ListOf(_FILE), []),
}, rules=(_each_path_once,))


def record_problem(rel: str) -> str | None:
    """Why bundle.toml cannot record the file `rel` (a name that is not UTF-8 or not one printable
    line), or None: the rule `rocforge bundle` applies before it writes a bundle."""
    if not _utf8(rel):
        return "its name is not UTF-8, and bundle.toml (TOML) carries only UTF-8 text"
    try:
        _RelPath().take(rel, "")
    except schema.Bad as bad:
        return f"bundle.toml records only names that are {_RelPath.what} ({bad.problem})"
    return None


def parse_bundle_toml(data: bytes, where: str) -> dict:
    """bundle.toml, held to what rocforge writes: UTF-8 TOML, `[bundle]` made by rocforge, then
    BUNDLE_SCHEMA (every key rocforge writes, checked; any other refused; each path once).
    IntegrityError names the first field that is wrong."""
    where = shellsafe.one_line(where)  # a folder's path is the user's: it ends no error line
    try:
        info = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"{where} is not UTF-8 text (byte {exc.start})", _DAMAGED_HINT) from exc
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise IntegrityError(f"{where} is not valid TOML ({exc})", _DAMAGED_HINT) from exc
    meta = info.get("bundle")
    if not isinstance(meta, dict) or meta.get("made_by") != "rocforge":
        raise IntegrityError(f"{where} has no [bundle] made_by = \"rocforge\": not a rocforge bundle",
                             "rocforge checks and unpacks only the bundles it makes")
    info = schema.check(info, BUNDLE_SCHEMA, where, IntegrityError, _DAMAGED_HINT)
    return info


def name_is_folder(where: str, info: dict, folder: str, what: str) -> None:
    """[bundle] name is the bundle's folder (an archive's top folder, or the unpacked folder):
    the name `check` reports and `unpack` creates is the folder that was checked."""
    if info["bundle"]["name"] != folder:
        raise IntegrityError(f"{where}: [bundle] name {info['bundle']['name']!r} is not the "
                             f"{what} {folder!r}", _DAMAGED_HINT)


def scan_archive(path: Path, on_member, *, index_first: bool = False) -> tuple[str, dict]:
    """Every member through the folder rules (one top folder, named as bundle.toml's `name`),
    handed to `on_member(top, rel, member, reader)` once it passed; (top, bundle.toml).
    `index_first` (a bundle from a store, which rocforge made with bundle.toml first): each later
    member must be what bundle.toml lists, a file of its declared size or the same link, before
    `on_member` writes a byte of it, so a small archive cannot unpack into a large tree."""
    from rocforge_build import extract

    where = path.name
    folder = Folder(where)
    top: str | None = None
    info: dict | None = None
    listed: dict | None = None  # bundle.toml's entries by path, once it has been read
    for m, fh in _members(path):
        try:
            parts = extract.member_parts(m.name)
        except ValueError as exc:
            raise refuse(where, m.name, str(exc)) from exc
        if not parts:
            continue
        if top is None:
            _plain_name(where, parts[0], "the top folder")
            top = parts[0]
        elif parts[0] != top:
            raise refuse(where, m.name, f"it is outside the bundle's folder {top}/ (a bundle has one)")
        rel = "/".join(parts[1:])
        if not rel:
            if m.kind != "dir":
                raise refuse(where, m.name, "the bundle's folder must be a directory")
            continue
        if index_first and m.kind != "dir" and rel != BUNDLE_TOML:
            _listed(where, listed, rel, m)
        folder.add(rel, m.kind, m.link, shown=m.name)
        if m.kind == "file" and rel == BUNDLE_TOML:
            data = read_capped(fh, MAX_TOML, f"{where}: {top}/{BUNDLE_TOML}")
            info = parse_bundle_toml(data, f"{where}: {top}/{BUNDLE_TOML}")
            name_is_folder(where, info, top, "archive's top folder")
            listed = {e.get("path"): e for e in info.get("file", ())}
            fh = io.BytesIO(data)
        on_member(top, rel, m, fh)
    folder.finish()
    if top is None or info is None:
        raise IntegrityError(f"{where} is not a rocforge bundle (no single top folder with {BUNDLE_TOML})",
                             "rocforge checks and unpacks only the bundles it makes")
    return top, info


def _listed(where: str, listed: dict | None, rel: str, m: Member) -> None:
    if listed is None:
        raise refuse(where, m.name, f"it comes before {BUNDLE_TOML}, which a bundle from a store "
                     "holds first")
    entry = listed.get(rel)
    if entry is None:
        raise refuse(where, m.name, f"{BUNDLE_TOML} does not list it")
    if m.kind == "link" and entry.get("link") != m.link:
        raise refuse(where, m.name, f"{BUNDLE_TOML} lists another link target")
    if m.kind == "file" and ("link" in entry or entry.get("size") != m.size):
        raise refuse(where, m.name, f"its size {m.size} is not the {entry.get('size')} bytes "
                     f"{BUNDLE_TOML} lists")


def hash_regular(path: str) -> str:
    """sha256 of a regular file, opened without following a link or blocking on a FIFO."""
    h = hashlib.sha256()
    with _open_entry(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _open_entry(path: str):
    try:
        return rootfs.open_regular(path, follow=False)
    except rootfs.NotRegularFile as exc:  # it changed since it was listed
        raise IntegrityError(f"{path} is {exc.kind}, not the file it was a moment ago",
                             "something is changing the folder while it is checked") from exc


def read_bundle_toml(path: Path) -> dict | None:
    """The bundle.toml of an archive (None when it has none, or none rocforge made)."""
    try:
        for m, fh in _members(path):
            parts = m.name.strip("/").split("/")
            if len(parts) == 2 and parts[1] == BUNDLE_TOML and fh is not None:
                return parse_bundle_toml(read_capped(fh, MAX_TOML, path.name), path.name)
    except RocforgeError:
        return None
    return None
