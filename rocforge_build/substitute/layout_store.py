"""A store as an OCI image layout (image-spec v1.1 "image-layout": `oci-layout`, `index.json`,
`blobs/sha256/<hex>`) on three carriers: a directory (`file:///DIR`), a static HTTPS server
(`https://...`, read-only) and S3 (`s3://BUCKET/PREFIX`).  Tags are index.json entries named by
the `org.opencontainers.image.ref.name` annotation; a layout has no referrers API, so referrers
live under the tag schema (oci.Store).

A directory store never follows a symbolic link and never opens anything but a regular file or a
real directory (a FIFO there would hang every reader): every path is opened below the store's own
directory descriptor with O_NOFOLLOW; writes go to a temporary file in the same directory and are
renamed into place; index.json is read, changed and written under an flock, so two publishers at
once lose neither's tag."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import random
import re
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from rocforge_build.errors import UsageError
from rocforge_build.substitute import oci
from rocforge_build.substitute.oci import Descriptor, NotFound, StoreError, StoreUnreachable

LAYOUT_FILE = b'{"imageLayoutVersion":"1.0.0"}'
MAX_INDEX = oci.MAX_MANIFEST * 4
INDEX_PATIENCE = 60.0  # S3: seconds a publisher racing others keeps re-reading index.json
INDEX_BACKOFF_CAP = 2.0  # seconds: the longest wait between two of those reads
_BLOB_NAME = re.compile(r"[0-9a-f]{64}")


def open_layout(url: str, *, timeout: float) -> oci.Store:
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{url}: a file:// store is on this machine (file:///DIR)")
        return DirectoryStore(Path(unquote(parts.path)), url)
    if parts.scheme == "https":
        return HttpsStore(url, timeout)
    if parts.scheme == "s3":
        return S3Store(url, timeout)
    raise UsageError(f"{url}: not an image layout store")


class LayoutStore(oci.Store):
    """The layout's rules over a carrier's three operations: read a file (`_open`), write one
    whole (`_write`), and index.json's read-modify-write (`_update_index`)."""

    def _open(self, rel: str, start: int = 0) -> contextlib.AbstractContextManager[BinaryIO]:
        raise NotImplementedError

    def _write(self, rel: str, fh: BinaryIO) -> None:
        raise NotImplementedError

    def _exists(self, rel: str, size: int) -> bool:
        raise NotImplementedError

    def _update_index(self, change) -> None:
        raise NotImplementedError

    # -- the layout -------------------------------------------------------------------------
    @staticmethod
    def _blob(digest: str) -> str:
        return "blobs/sha256/" + oci.check_digest(digest, "blob").removeprefix("sha256:")

    def _index(self) -> list[Descriptor]:
        try:
            with self.transfer("index.json") as transfer, self._open("index.json") as fh:
                data = oci.read_capped(transfer.paced(fh), MAX_INDEX, f"{self.url} index.json")
        except NotFound:
            return []
        return oci.parse_index(data, f"{self.url} index.json")

    def _open_blob(self, digest: str, start: int = 0):
        return self._open(self._blob(digest), start)

    def _open_range(self, digest: str, start: int, end: int, size: int):
        return self._open_part(self._blob(digest), start, end, size)

    def _open_part(self, rel: str, start: int, end: int,
                   size: int) -> contextlib.AbstractContextManager[BinaryIO]:
        """Bytes `start`-`end` of a file of `size` bytes (oci.Store._open_range), where the
        carrier answers ranges (`ranged`)."""
        raise NotImplementedError

    def has_blob(self, digest: str) -> bool:
        return False  # without the descriptor's size a present blob cannot be judged: write it again

    def push_blob_file(self, path: Path, media_type: str) -> Descriptor:
        import hashlib

        h, size = hashlib.sha256(), 0
        with open(path, "rb") as fh:
            for chunk in oci.chunks(fh):
                h.update(chunk)
                size += len(chunk)
        desc = Descriptor(media_type, "sha256:" + h.hexdigest(), size)
        if not self._exists(self._blob(desc.digest), desc.size):
            with open(path, "rb") as fh:
                self._put_blob(fh, desc)
        return desc

    def push_blob_bytes(self, data: bytes, media_type: str) -> Descriptor:
        desc = Descriptor.for_bytes(media_type, data)
        if not self._exists(self._blob(desc.digest), desc.size):
            self._put_blob(io.BytesIO(data), desc)
        return desc

    def _put_blob(self, fh: BinaryIO, desc: Descriptor) -> None:
        if not self.writable:
            raise StoreError(f"{self.url} is read-only")
        self._write(self._blob(desc.digest), fh)

    def _get_manifest(self, ref: str) -> tuple[bytes, str]:
        entries = self._index()
        if ref.startswith("sha256:"):
            entry = next((e for e in entries if e.digest == ref), None)
        else:
            entry = next((e for e in reversed(entries) if e.annotations.get(oci.REF_NAME) == ref), None)
        if entry is None and ref.startswith("sha256:"):
            return self._manifest_blob(ref)
        if entry is None:
            raise NotFound(f"{self.url}: no {ref[:80]}")
        if entry.size > oci.MAX_MANIFEST:
            raise StoreError(f"{self.url}: {ref[:80]} is {entry.size} bytes, past the manifest cap")
        data = self.read_blob(entry, oci.MAX_MANIFEST)
        return data, entry.media_type

    def _manifest_blob(self, digest: str) -> tuple[bytes, str]:
        """A manifest index.json does not list (one an index names: a publisher's list of its
        builds), read as the blob it is and typed by its own mediaType."""
        with self.transfer(f"manifest {digest[:19]}") as transfer, self._open(self._blob(digest)) as fh:
            data = oci.read_capped(transfer.paced(fh), oci.MAX_MANIFEST, f"{self.url} {digest[:19]}")
        if oci.sha256_digest(data) != digest:
            raise StoreError(f"{self.url}: blob {digest[:19]}'s bytes do not match its digest")
        media_type = oci.json_object(data, f"{self.url} {digest[:19]}").get("mediaType")
        if media_type not in (oci.MANIFEST, oci.INDEX):
            raise StoreError(f"{self.url}: {digest[:19]} is not an OCI manifest or index")
        return data, media_type

    def _put_manifest(self, data: bytes, media_type: str, ref: str) -> None:
        if not self.writable:
            raise StoreError(f"{self.url} is read-only")
        desc = Descriptor.for_bytes(media_type, data)
        if not self._exists(self._blob(desc.digest), desc.size):
            self._write(self._blob(desc.digest), io.BytesIO(data))
        tag = None if ref.startswith("sha256:") else ref

        def change(entries: list[Descriptor]) -> list[Descriptor]:
            if tag is None:
                if any(e.digest == desc.digest for e in entries):
                    return entries
                return [*entries, desc]
            kept = [e for e in entries if e.annotations.get(oci.REF_NAME) != tag
                    and not (e.digest == desc.digest and oci.REF_NAME not in e.annotations)]
            return [*kept, Descriptor(media_type, desc.digest, desc.size, annotations={oci.REF_NAME: tag})]

        self._update_index(change)

    # -- removal (`rocforge store gc`) -------------------------------------------------------
    def _remove(self, rel: str) -> None:
        raise StoreError(f"{self.url} is read-only")

    def layout_entries(self) -> list[Descriptor]:
        return self._index()

    def delete_manifest(self, digest: str, size: int) -> None:
        """Its index.json entries (tags too) in one write, then its blob."""
        oci.check_digest(digest, self.url)
        self._update_index(lambda entries: [e for e in entries if e.digest != digest])
        self._remove(self._blob(digest))

    def forget(self, digests: set[str], tags: set[str]) -> None:
        """index.json without the entries of `digests` and `tags`, in one write (the blobs stay)."""
        self._update_index(lambda entries: [e for e in entries if e.digest not in digests
                                            and e.annotations.get(oci.REF_NAME) not in tags])

    def delete_tag(self, tag: str) -> None:
        oci.check_tag(tag, self.url)
        self._update_index(lambda entries: [e for e in entries if e.annotations.get(oci.REF_NAME) != tag])

    def delete_blob(self, digest: str) -> None:
        self._remove(self._blob(digest))

    def _tags(self) -> list[str]:
        """The index's names that are OCI tags (anything else in a hand-made index.json is not
        a name rocforge looks up, and never reaches a terminal)."""
        return [t for t in (e.annotations.get(oci.REF_NAME) for e in self._index())
                if t and oci.TAG.fullmatch(t)]


class DirectoryStore(LayoutStore):
    def __init__(self, path: Path, url: str):
        if not path.is_absolute():
            raise UsageError(f"{url}: a file:// store needs an absolute path (file:///DIR)")
        self.path, self.url = path, url
        self._fd: int | None = None

    # -- the directory, opened once, every path below it without following a link ---------------
    def _root(self, create: bool) -> int:
        if self._fd is not None:
            return self._fd
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise NotFound(f"{self.url}: no such store") from None
            try:
                os.mkdir(self.path, 0o755)
            except FileExistsError:
                pass  # another publisher made it at the same moment; opened below, never through a link
            except OSError as exc:
                raise StoreError(f"{self.url}: cannot make the store ({exc.strerror})") from None
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                raise StoreError(f"{self.url}: the store is not a directory ({_why(exc)})") from None
            if not self._exists("oci-layout", len(LAYOUT_FILE)):
                self._write("oci-layout", io.BytesIO(LAYOUT_FILE))
        except OSError as exc:
            raise StoreError(f"{self.url}: the store is not a directory ({_why(exc)})") from None
        return self._fd

    def _dir(self, parts: list[str], create: bool) -> int:
        fd = os.dup(self._root(create))
        for name in parts:
            try:
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    raise NotFound(f"{self.url}: no {name}") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                raise StoreError(f"{self.url}: {'/'.join(parts)} is not a directory ({_why(exc)})") from None
            os.close(fd)
            fd = nxt
        return fd

    @contextlib.contextmanager
    def _open(self, rel: str, start: int = 0) -> Iterator[BinaryIO]:
        *parts, name = rel.split("/")
        dfd = self._dir(parts, create=False)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            raise NotFound(f"{self.url}: no {rel}") from None
        except OSError as exc:
            raise StoreError(f"{self.url}: {rel}: {_why(exc)}") from None
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{self.url}: {rel} is not a regular file")
            os.set_blocking(fd, True)
            if start:
                os.lseek(fd, start, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as fh:
            yield fh

    def _exists(self, rel: str, size: int) -> bool:
        *parts, name = rel.split("/")
        try:
            dfd = self._dir(parts, create=False)
        except NotFound:
            return False
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{self.url}: {rel} is not a regular file")
        return st.st_size == size

    def _write(self, rel: str, fh: BinaryIO) -> None:
        *parts, name = rel.split("/")
        dfd = self._dir(parts, create=True)
        tmp = f".{name}.{os.getpid()}.{id(fh):x}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in oci.chunks(fh):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if not (stat.S_ISREG(st.st_mode)):
                        raise StoreError(f"{self.url}: {rel} is not a regular file: not replacing it")
                except FileNotFoundError:
                    pass
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot write {rel} ({_why(exc)})") from None
        finally:
            os.close(dfd)

    def _update_index(self, change) -> None:
        root = self._root(create=True)
        try:
            lock = os.open(".rocforge-index.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o644, dir_fd=root)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot lock index.json ({_why(exc)})") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._exists("oci-layout", len(LAYOUT_FILE)):
                self._write("oci-layout", io.BytesIO(LAYOUT_FILE))
            entries = change(self._index())
            self._write("index.json", io.BytesIO(oci.make_index(entries)))
        finally:
            os.close(lock)

    def _remove(self, rel: str) -> None:
        """A regular file below the store removed (a link or anything else there is left)."""
        *parts, name = rel.split("/")
        try:
            dfd = self._dir(parts, create=False)
        except NotFound:
            return
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{self.url}: {rel} is not a regular file: left alone")
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot remove {rel} ({_why(exc)})") from None
        finally:
            os.close(dfd)

    def blob_files(self) -> tuple[dict[str, tuple[int, float]], int]:
        """({digest: (size, mtime)} of the regular files under blobs/sha256/ named as blobs,
        how many other entries are there: left alone)."""
        try:
            dfd = self._dir(["blobs", "sha256"], create=False)
        except NotFound:
            return {}, 0
        found: dict[str, tuple[int, float]] = {}
        foreign = 0
        try:
            for name in os.listdir(dfd):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode) and _BLOB_NAME.fullmatch(name):
                    found["sha256:" + name] = (st.st_size, st.st_mtime)
                elif not (stat.S_ISREG(st.st_mode) and name.startswith(".") and name.endswith(".tmp")):
                    foreign += 1
        finally:
            os.close(dfd)
        return found, foreign

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link, which a store never follows"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    return exc.strerror or type(exc).__name__


class HttpsStore(LayoutStore):
    """An image layout under an HTTPS URL, read-only: redirects followed only on its own host."""

    writable = False

    def __init__(self, url: str, timeout: float):
        import requests

        self.url, self.timeout = oci.shown_url(url.rstrip("/")), timeout
        self.base = urlsplit(self.url)
        self.session = requests.Session()
        self.session.trust_env = True

    @contextlib.contextmanager
    def _open(self, rel: str, start: int = 0) -> Iterator[BinaryIO]:
        import requests

        url = f"{self.url}/{rel}"
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={start}-"} if start else {})}
        transfer = self.current_transfer(rel)
        try:
            for _ in range(6):
                if transfer.expired():
                    raise transfer.expired_error()
                wait = transfer.timeout(self.timeout)  # each wait ends by the transfer's deadline
                r = self.session.get(url, headers=headers, stream=True, allow_redirects=False,
                                     timeout=(wait, wait))
                if r.status_code not in (301, 302, 303, 307, 308):
                    break
                target = urlsplit(requests.compat.urljoin(url, r.headers.get("Location", "")))
                r.close()
                if (target.scheme, target.netloc) != (self.base.scheme, self.base.netloc):
                    raise StoreError(f"{self.url}: {rel} redirects to another host "
                                     f"({target.scheme}://{target.netloc[:80]}): refused")
                url = target.geturl()
            else:
                raise StoreError(f"{self.url}: {rel}: too many redirects")
            if r.status_code == 404:
                r.close()
                raise NotFound(f"{self.url}: no {rel}")
            if r.status_code not in (200, 206):
                r.close()
                raise StoreUnreachable(f"{self.url}: {rel}: HTTP {r.status_code}")
            raw = r.raw
            if start and r.status_code == 200:  # the server ignored Range: skip what we have
                left = start
                while left:
                    got = raw.read(min(left, oci.CHUNK))
                    if not got:
                        raise StoreUnreachable(f"{self.url}: {rel} ended early")
                    left -= len(got)
        except requests.RequestException as exc:
            if transfer.expired():
                raise transfer.expired_error() from None
            raise StoreUnreachable(f"{self.url}: {rel}: {type(exc).__name__}") from None
        try:
            yield _Guarded(raw, f"{self.url}: {rel}", self.timeout)
        finally:
            r.close()

    ranged = True

    @contextlib.contextmanager
    def _open_part(self, rel: str, start: int, end: int, size: int) -> Iterator[BinaryIO]:
        import requests

        url, where = f"{self.url}/{rel}", f"{self.url}: {rel}"
        transfer = self.current_transfer(rel)
        if transfer.expired():
            raise transfer.expired_error()
        wait = transfer.timeout(self.timeout)
        try:
            r = self.session.get(url, headers={"Accept-Encoding": "identity", "Range": f"bytes={start}-{end}"},
                                 stream=True, allow_redirects=False, timeout=(wait, wait))
        except requests.RequestException as exc:
            if transfer.expired():
                raise transfer.expired_error() from None
            raise StoreUnreachable(f"{where}: {type(exc).__name__}") from None
        try:
            if r.status_code == 200:
                raise oci.RangeRefused(f"{where}: answered a range request with the whole file")
            if r.status_code in (301, 302, 303, 307, 308):  # one stream follows it (on this host)
                raise oci.RangeRefused(f"{where}: a range request redirected")
            if r.status_code != 206:
                raise StoreUnreachable(f"{where}: HTTP {r.status_code} to a range request")
            oci.check_range(r.headers.get("Content-Range", ""), r.headers.get("Content-Length"),
                            start, end, size, where)
            yield _Guarded(r.raw, where, self.timeout)
        finally:
            r.close()

    def _exists(self, rel: str, size: int) -> bool:
        return False

    def _write(self, rel: str, fh: BinaryIO) -> None:
        raise StoreError(f"{self.url} is read-only")

    def _update_index(self, change) -> None:
        raise StoreError(f"{self.url} is read-only")

    def close(self) -> None:
        self.session.close()


class _Guarded(io.RawIOBase):
    """A response body whose network errors are StoreUnreachable lines, not tracebacks; each read
    hands over what has arrived (urllib3's read1), its wait ending by `deadline` when a
    Transfer sets one (oci._PacedReader), so no single read can outlast the transfer."""

    deadline = None

    def __init__(self, raw, where: str, timeout: float | None = None):
        self.raw, self.where, self.timeout = raw, where, timeout
        inner = getattr(raw, "_raw_stream", raw)  # botocore's StreamingBody holds urllib3's
        self.read1 = getattr(inner, "read1", None)
        self.sock = oci.socket_of(inner)

    def read(self, n: int = -1) -> bytes:
        n = n if n and n > 0 else oci.CHUNK
        try:
            if self.sock is not None and self.deadline is not None and self.timeout:
                self.sock.settimeout(self.deadline.timeout(self.timeout))
            return self.read1(n) if self.read1 is not None else self.raw.read(n)
        except Exception as exc:  # urllib3's timeouts and protocol errors
            raise StoreUnreachable(f"{self.where}: {type(exc).__name__}") from None

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def abort(self) -> None:
        """End a read under way in another thread (a parallel pull that stops)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)

    def readable(self) -> bool:
        return True


class S3Store(LayoutStore):
    """The layout under s3://BUCKET/PREFIX, through boto3 (its own settings: AWS_ENDPOINT_URL,
    credentials).  S3 has no lock: index.json is replaced only if it is still the one read (a
    conditional write on its ETag, `_update_index`), so two publishers at once both keep their tags."""

    def __init__(self, url: str, timeout: float):
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError(f"{url}: s3:// stores need boto3", "pip install 'rocforge[s3]'") from None
        parts = urlsplit(url)
        if not parts.netloc:
            raise UsageError(f"{url}: give s3://BUCKET/PREFIX")
        self.url, self.bucket, self.prefix = url, parts.netloc, parts.path.strip("/")
        self.client = boto3.client("s3", config=Config(connect_timeout=timeout, read_timeout=timeout,
                                                       retries={"max_attempts": 2}))

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _call(self, what: str, fn, **kw):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kw)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{self.url}: no {what}") from None
            raise StoreUnreachable(f"{self.url}: {what}: {code or 'refused'}") from None
        except BotoCoreError as exc:
            raise StoreUnreachable(f"{self.url}: {what}: {type(exc).__name__}") from None

    @contextlib.contextmanager
    def _open(self, rel: str, start: int = 0) -> Iterator[BinaryIO]:
        kw = {"Range": f"bytes={start}-"} if start else {}
        obj = self._call(rel, self.client.get_object, Key=self._key(rel), **kw)
        body = obj["Body"]
        try:
            yield _Guarded(body, f"{self.url}: {rel}")
        finally:
            body.close()

    ranged = True

    @contextlib.contextmanager
    def _open_part(self, rel: str, start: int, end: int, size: int) -> Iterator[BinaryIO]:
        where = f"{self.url}: {rel}"
        obj = self._call(rel, self.client.get_object, Key=self._key(rel), Range=f"bytes={start}-{end}")
        body = obj["Body"]
        try:
            if obj.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200:
                raise oci.RangeRefused(f"{where}: answered a range request with the whole object")
            length = obj.get("ContentLength")
            oci.check_range(str(obj.get("ContentRange") or ""), None if length is None else str(length),
                            start, end, size, where)
            yield _Guarded(body, where)
        finally:
            body.close()

    def _exists(self, rel: str, size: int) -> bool:
        try:
            head = self._call(rel, self.client.head_object, Key=self._key(rel))
        except NotFound:
            return False
        return head.get("ContentLength") == size

    def _write(self, rel: str, fh: BinaryIO) -> None:
        self._upload(rel, fh)

    def _upload(self, rel: str, fh: BinaryIO) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_fileobj(fh, self.bucket, self._key(rel))
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnreachable(f"{self.url}: cannot write {rel} ({type(exc).__name__})") from None

    def _remove(self, rel: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(rel))
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnreachable(f"{self.url}: cannot remove {rel} ({type(exc).__name__})") from None

    def blob_files(self) -> tuple[dict[str, tuple[int, float]], int]:
        base = self._key("blobs/sha256/")
        found: dict[str, tuple[int, float]] = {}
        foreign = 0
        token = None
        for _ in range(10_000):
            kw = {"ContinuationToken": token} if token else {}
            page = self._call("blobs/sha256/", self.client.list_objects_v2, Prefix=base, **kw)
            for obj in page.get("Contents", []):
                name = str(obj.get("Key", ""))[len(base):]
                if _BLOB_NAME.fullmatch(name):
                    found["sha256:" + name] = (int(obj.get("Size", 0)), obj["LastModified"].timestamp())
                else:
                    foreign += 1
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        return found, foreign

    def _update_index(self, change) -> None:
        """index.json's read-change-write as a compare-and-swap: PutObject with If-Match on the
        ETag read (If-None-Match: * when there was none), S3's conditional writes (AWS S3 user
        guide, "Add preconditions to S3 operations with conditional requests"); a publisher that
        loses the race (412, or 409 for two at once) reads the winner's index and applies its own
        change to that."""
        from botocore.exceptions import BotoCoreError, ClientError

        if not self._exists("oci-layout", len(LAYOUT_FILE)):
            self._upload("oci-layout", io.BytesIO(LAYOUT_FILE))
        key = self._key("index.json")
        give_up_at = time.monotonic() + INDEX_PATIENCE
        attempt = 0
        while True:
            try:
                head = self._call("index.json", self.client.get_object, Key=key)
            except NotFound:
                entries, condition = [], {"IfNoneMatch": "*"}
            else:
                try:
                    with self.transfer("index.json") as transfer:
                        data = oci.read_capped(transfer.paced(_Guarded(head["Body"], f"{self.url}: index.json")),
                                               MAX_INDEX, f"{self.url} index.json")
                finally:
                    head["Body"].close()
                entries = oci.parse_index(data, f"{self.url} index.json")
                etag = head.get("ETag")  # a store that gives none gets a plain write: the last one wins
                condition = {"IfMatch": etag} if isinstance(etag, str) and etag else {}
            body = oci.make_index(change(entries))
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                       ContentType="application/json", **condition)
                return
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    raise StoreUnreachable(f"{self.url}: cannot write index.json ({code or 'refused'})") from None
            except BotoCoreError as exc:
                raise StoreUnreachable(f"{self.url}: cannot write index.json ({type(exc).__name__})") from None
            # each lost race is another publisher's write landing, not a fault: wait (exponential,
            # full jitter) and read again until the patience is spent, however busy the store
            attempt += 1
            pause = random.uniform(0, min(INDEX_BACKOFF_CAP, 0.05 * 2 ** attempt))
            if time.monotonic() + pause > give_up_at:
                raise StoreUnreachable(f"{self.url}: index.json kept changing under this publish "
                                       f"(lost the race {attempt} times in {INDEX_PATIENCE:g} s)", "publish again")
            time.sleep(pause)
