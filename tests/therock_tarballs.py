"""Generated TheRock dist tarballs for tests: trees from fixtures_roots (brief §3 "Extracted
layout"), packed the way TheRock's build_tools/build_tarballs.py packs them (`tar cfz <name> .` inside the tree,
so member names start with `./`), plus hostile archives built member by member."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from fixtures_roots import make_therock_tree

from rocforge_build.nightly.listing import encode_uri_component


def make_tree(root: Path, version: str, targets: list[str], *, payload: int = 0,
              **tree) -> Path:
    """A TheRock tree at `root` (fixtures_roots.make_therock_tree, the foundation's builder in
    the real layout), plus `payload` random bytes in lib/ for archives of some size."""
    make_therock_tree(root, version, tuple(targets), inner="/", **tree)
    if payload:
        (root / "lib/libpayload.so").write_bytes(os.urandom(payload))
    return root


def pack(tree: Path, dest: Path) -> Path:
    """`cd tree && tar cfz dest .`"""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        tar.add(tree, arcname=".")
    return dest


def tarball_name(group: str, version: str, platform: str = "linux", variant: str = "") -> str:
    mid = f"{group}-{variant}" if variant else group
    return f"therock-dist-{platform}-{mid}-{version}.tar.gz"


def make_tarball(workdir: Path, group: str, version: str, targets: list[str], **kw) -> Path:
    name = tarball_name(group, version)
    tree = make_tree(workdir / f"tree-{group}-{version}", version, targets, **kw)
    return pack(tree, workdir / "out" / name)


def hostile(dest: Path, members: list[tuple]) -> Path:
    """A .tar.gz built member by member: ("file", name, data) / ("dir", name) /
    ("symlink", name, target) / ("hardlink", name, target) / ("chr"|"fifo", name)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for kind, name, *rest in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = rest[0] if rest else b"x"
                info.size = len(data)
                info.mode = 0o644
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = rest[0]
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = rest[0]
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return dest


class Mirror:
    """A TheRock hosting on the local HTTP server: a CDN folder (`index.html` with the embedded
    file list, tarballs beside it) and optionally an S3 bucket holding the same keys."""

    def __init__(self, server, path: str = "/tarball/"):
        self.server = server
        self.path = path
        self.files: dict[str, tuple[bytes, float]] = {}

    @property
    def url(self) -> str:
        return self.server.url(self.path)

    def add(self, name: str, data: bytes, mtime: float) -> str:
        self.files[name] = (data, mtime)
        url = self.server.add(self.path + encode_uri_component(name), data)
        self.publish()
        return url

    def add_file(self, archive: Path, mtime: float) -> str:
        return self.add(archive.name, archive.read_bytes(), mtime)

    def publish(self) -> None:
        from http_fixture import cdn_index_html

        self.server.add(self.path, cdn_index_html([(n, m) for n, (_d, m) in self.files.items()]))
