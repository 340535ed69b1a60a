"""Read the device code objects of a HIP binary without rocforge: the `.hip_fatbin` section of
an ELF file holds one clang offload bundle per translation unit, each starting with the magic
`__CLANG_OFFLOAD_BUNDLE__` (format: clang/lib/Driver/OffloadBundler.cpp, llvm-project; the
linker pads bundles to 4096 bytes).  Bundles compressed by `--offload-compress` start with
`CCOB` instead; they are reported as such (the callers unbundle those with clang-offload-bundler).
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"


def section(path: Path, name: str) -> bytes:
    """The bytes of one section of a 64-bit little-endian ELF file (b"" when absent)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not ELF64 LE"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int):
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for i in range(shnum):
        h = header(i)
        if names[h[0]:names.index(b"\0", h[0])].decode() == name:
            return data[h[4]:h[4] + h[5]]
    return b""


def bundles(fatbin: bytes) -> list[dict[str, bytes]]:
    """Every uncompressed bundle in a .hip_fatbin: {entry id: code object}; a compressed one is
    returned as {"<compressed>": its bytes}."""
    out = []
    pos = 0
    while pos < len(fatbin):
        if fatbin.startswith(COMPRESSED, pos):
            nxt = _next(fatbin, pos + 4)
            out.append({"<compressed>": fatbin[pos:nxt]})
            pos = nxt
            continue
        if not fatbin.startswith(MAGIC, pos):
            pos = _next(fatbin, pos + 1)
            continue
        count, = struct.unpack_from("<Q", fatbin, pos + len(MAGIC))
        at, entries, end = pos + len(MAGIC) + 8, {}, pos
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", fatbin, at)
            entry_id = fatbin[at + 24:at + 24 + id_len].decode()
            entries[entry_id] = fatbin[pos + offset:pos + offset + size]
            at += 24 + id_len
            end = max(end, pos + offset + size)
        out.append(entries)
        pos = max(end, pos + 1)
    return out


def _next(data: bytes, start: int) -> int:
    hits = [i for i in (data.find(MAGIC, start), data.find(COMPRESSED, start)) if i >= 0]
    return min(hits) if hits else len(data)


def device_targets(path: Path) -> dict[str, int]:
    """Device entry ids (e.g. hipv4-amdgcn-amd-amdhsa--gfx1151) -> how many bundles carry one
    with code; host entries (host-x86_64-...) are left out."""
    counts: dict[str, int] = {}
    for b in bundles(section(path, ".hip_fatbin")):
        for entry_id, blob in b.items():
            if not entry_id.startswith("host-") and blob:
                counts[entry_id] = counts.get(entry_id, 0) + 1
    return counts


def code_objects(path: Path) -> list[tuple[str, bytes]]:
    """(entry id, ELF code object) for every device entry of every bundle."""
    return [(entry_id, blob) for b in bundles(section(path, ".hip_fatbin"))
            for entry_id, blob in b.items() if not entry_id.startswith("host-") and blob]
