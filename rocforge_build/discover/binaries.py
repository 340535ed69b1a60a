"""What rocforge reads from installed binaries: an ELF's NEEDED entries, the ISA names a HIP
runtime knows, and which clang a hipcc will call.  Reads only the bytes it needs (section
headers, `.dynamic`, `.dynstr`, `.rodata`), never a whole 1 GB librocblas.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
import re
import struct

from rocforge_build.records import Record, init
from rocforge_build.rootfs import Root, inner_join, open_regular

# ROCr's ISA registry names every agent ISA it can run as `amdgcn-amd-amdhsa--gfxNNNN`
# (ROCR-Runtime src/core/runtime/isa.cpp); a GPU whose ISA is not in that table is not
# served by this runtime, whatever bitcode the compiler has.
_ISA_NAME_RE = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9]+[0-9a-f]*)(?![0-9a-z-])")
_SHT_DYNAMIC = 6
_DT_NEEDED = 1
_DT_SONAME = 14
_DATA_SECTIONS = (".rodata", ".data.rel.ro", ".data")


class ElfInfo(Record):
    __slots__ = ("needed", "soname", "data")

    def __init__(self, needed: tuple[str, ...], soname: str | None,
                 data: bytes):  # .rodata, .data.rel.ro and .data: where strings and blobs live
        init(self, needed, soname, data)


def _sections(fh, head: bytes):
    """[(name, type, offset, size, link)] of a 64- or 32-bit little/big-endian ELF."""
    is64 = head[4] == 2
    end = "<" if head[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 0x3A)
        fmt, fields = end + "IIQQQQIIQQ", (0, 1, 4, 5, 6)
    else:
        shoff, = struct.unpack_from(end + "I", head, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 0x2E)
        fmt, fields = end + "IIIIIIIIII", (0, 1, 4, 5, 6)
    if not shoff or not shnum or shnum > 4096:
        return [], end, is64
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    raw = []
    for i in range(shnum):
        entry = struct.unpack_from(fmt, table, i * shentsize)
        raw.append(tuple(entry[f] for f in fields))
    names = b""
    if shstrndx < len(raw):
        fh.seek(raw[shstrndx][2])
        names = fh.read(min(raw[shstrndx][3], 1 << 20))
    out = []
    for name_off, typ, off, size, link in raw:
        name = names[name_off:names.find(b"\0", name_off)].decode("ascii", "replace")
        out.append((name, typ, off, size, link))
    return out, end, is64


def read_elf(path) -> ElfInfo | None:
    """NEEDED/SONAME and the data sections of an ELF file; None when it is no readable ELF."""
    try:
        with open_regular(path) as fh:
            head = fh.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return None
            sections, end, is64 = _sections(fh, head)
            needed: list[str] = []
            soname = None
            data: list[bytes] = []
            for name, typ, off, size, link in sections:
                if typ == _SHT_DYNAMIC and link < len(sections):
                    fh.seek(off)
                    dyn = fh.read(min(size, 1 << 20))
                    _, _, str_off, str_size, _ = sections[link]
                    fh.seek(str_off)
                    strtab = fh.read(min(str_size, 4 << 20))
                    fmt = end + ("qQ" if is64 else "iI")
                    step = struct.calcsize(fmt)
                    for i in range(0, len(dyn) - step + 1, step):
                        tag, val = struct.unpack_from(fmt, dyn, i)
                        if tag == 0:
                            break
                        if tag in (_DT_NEEDED, _DT_SONAME):
                            text = strtab[val:strtab.find(b"\0", val)].decode("ascii", "replace")
                            if tag == _DT_NEEDED:
                                needed.append(text)
                            else:
                                soname = text
                elif name in _DATA_SECTIONS:
                    fh.seek(off)
                    data.append(fh.read(min(size, 64 << 20)))
            return ElfInfo(tuple(needed), soname, b"\0".join(data))
    except (OSError, struct.error):
        return None


def isa_names(data: bytes) -> tuple[str, ...]:
    """The gfx names of every `amdgcn-amd-amdhsa--gfx*` ISA string in `data`."""
    return tuple(dict.fromkeys(m.group(1).decode() for m in _ISA_NAME_RE.finditer(data)))


class RuntimeIsas(Record):
    __slots__ = ("library", "isas")

    def __init__(self, library: str,  # inner path of the library the table was read from
                 isas: tuple[str, ...]):
        init(self, library, isas)


def runtime_isas(root: Root, candidates) -> RuntimeIsas | None:
    """The ISA table of the first runtime library (libhsa-runtime64, libamdhip64) in
    `candidates` that carries one; None when none does (an empty or stripped file tells
    nothing, so the caller falls back on other evidence)."""
    for inner in candidates:
        info = read_elf(root.host_str(inner))
        if info is None:
            continue
        names = isa_names(info.data)
        if names:
            return RuntimeIsas(inner, names)
    return None


# -- hipcc ---------------------------------------------------------------------------------------
# The perl hipcc (HIP <= 6.x; Debian bookworm/trixie) runs `$HIP_CLANG_PATH/clang++[-N]`
# (hipcc.pl) with HIP_CLANG_PATH defaulting to `$ROCM_PATH/llvm/bin` when that exists, else
# `$ROCM_PATH/bin` (hipvars.pm).  The C++ hipcc (ROCm/llvm-project amd/hipcc; Debian sid 7.0.2)
# runs `$HIP_CLANG_PATH/clang++` with a default compiled in, e.g. `lib/llvm-21/bin` under
# ROCM_PATH on Debian.
# patterns for `re`'s functions (compiled on first use: only layouts that read hipcc need them)
_PERL_CALL = r"\$HIP_CLANG_PATH/(clang\+\+(?:-\d+)?)"
_PERL_DEFAULTS = ("llvm/bin", "bin")
_CXX_DEFAULT = rb"(?<![\w/.-])((?:lib/)?llvm(?:-\d+)?/bin)(?![\w/-])"
_LLVM_MAJOR = r"(?:llvm-|clang\+\+-|clang-)(\d+)"


class Hipcc(Record):
    __slots__ = ("path", "flavour", "calls", "default_dirs", "evidence")

    def __init__(self, path: str,  # inner paths, as default_dirs
                 flavour: str,  # "perl" | "c++"
                 calls: str,  # the program name it runs in HIP_CLANG_PATH
                 default_dirs: tuple[str, ...],  # HIP_CLANG_PATH defaults, in hipcc's order
                 evidence: str):
        init(self, path, flavour, calls, default_dirs, evidence)

    @property
    def llvm_major(self) -> int | None:
        for text in (self.calls, *self.default_dirs):
            m = re.search(_LLVM_MAJOR, text)
            if m:
                return int(m.group(1))
        return None


def read_hipcc(root: Root, base: str) -> Hipcc | None:
    """Which clang the hipcc of install `base` runs, read from hipcc itself; None when there
    is no hipcc or it tells nothing (then the layout's defaults apply)."""
    hipcc = inner_join(base, "bin/hipcc")
    if not root.is_file(hipcc):
        return None
    try:
        with open_regular(root.host_str(hipcc)) as fh:
            head = fh.read(4)
    except OSError:
        return None
    if head == b"\x7fELF":
        info = read_elf(root.host_str(hipcc))
        if info is None:
            return None
        dirs = tuple(dict.fromkeys(m.group(1).decode() for m in re.finditer(_CXX_DEFAULT, info.data)))
        if not dirs:
            return None
        return Hipcc(hipcc, "c++", "clang++", tuple(inner_join(base, d) for d in dirs),
                     f"{hipcc} (C++ hipcc) runs $HIP_CLANG_PATH/clang++, default "
                     + " or ".join(f"$ROCM_PATH/{d}" for d in dirs))
    for script in (inner_join(base, "bin/hipcc.pl"), hipcc):
        if not root.is_file(script):
            continue
        try:
            text = root.read_text(script)
        except OSError:
            continue
        m = re.search(_PERL_CALL, text)
        if m:
            return Hipcc(hipcc, "perl", m.group(1), tuple(inner_join(base, d) for d in _PERL_DEFAULTS),
                         f"{os.path.basename(script)} (perl hipcc) runs $HIP_CLANG_PATH/{m.group(1)}, default "
                         "$ROCM_PATH/llvm/bin if present, else $ROCM_PATH/bin (hipvars.pm)")
    return None


# -- kernel packs --------------------------------------------------------------------------------
# TheRock's multi-arch builds move device code out of fat binaries and kernel databases into
# per-arch kernel packs: `<root>/.kpack/<artifact>_<component>_<gfx>.kpack` (e.g.
# `blas_lib_gfx1100.kpack`; ROCm/TheRock RELEASES.md, artifact_builder.py) beside a
# `<artifact>_<component>.kpm` manifest.  A .kpack file (stellaraccident/rocm-kpack, kpack.py)
# starts with "KPAK", a uint32 format version and a uint64 offset of a MessagePack table of
# contents {format_version, group_name, gfx_arch_family, gfx_arches: [...], toc, ...}.
KPACK_MAGIC = b"KPAK"
_KPACK_NAME = r"(?i)^(?P<group>.+?)_(?P<gfx>gfx[0-9]+[0-9a-fx]*)\.kpack$"  # for re.match


class KernelPack(Record):
    __slots__ = ("path", "group", "arches", "evidence")

    def __init__(self, path: str, group: str, arches: tuple[str, ...],  # path: inner
                 evidence: str):  # "toc" (read from the file) or "name" (the file name only)
        init(self, path, group, arches, evidence)


class _Unpack:
    """Just enough MessagePack to read a kpack TOC's leading keys (stdlib only)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def _int(self, n: int, signed: bool = False) -> int:
        return int.from_bytes(self._take(n), "big", signed=signed)

    def value(self):  # noqa: C901 - one branch per MessagePack type
        b = self._take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self._map(b & 0x0F)
        if 0x90 <= b <= 0x9F:
            return [self.value() for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self._take(b & 0x1F).decode("utf-8", "replace")
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        sizes = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
        if b in sizes:
            return self._int(sizes[b])
        ssizes = {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
        if b in ssizes:
            return self._int(ssizes[b], signed=True)
        if b in (0xCA, 0xCB):
            return struct.unpack(">f" if b == 0xCA else ">d", self._take(4 if b == 0xCA else 8))[0]
        strs = {0xD9: 1, 0xDA: 2, 0xDB: 4}
        if b in strs:
            return self._take(self._int(strs[b])).decode("utf-8", "replace")
        bins = {0xC4: 1, 0xC5: 2, 0xC6: 4}
        if b in bins:
            return self._take(self._int(bins[b]))
        if b in (0xDC, 0xDD):
            return [self.value() for _ in range(self._int(2 if b == 0xDC else 4))]
        if b in (0xDE, 0xDF):
            return self._map(self._int(2 if b == 0xDE else 4))
        raise ValueError(f"unsupported MessagePack type 0x{b:02x}")

    def _map(self, n: int) -> dict:
        out = {}
        for _ in range(n):
            key = self.value()
            out[key] = self.value()
        return out


def read_kpack(root: Root, inner: str) -> KernelPack | None:
    """The architectures a .kpack file carries: its TOC's `gfx_arches`, else its file name."""
    name = os.path.basename(inner)
    m = re.match(_KPACK_NAME, name)
    named = (m.group("gfx").lower(),) if m else ()
    group = m.group("group") if m else os.path.splitext(name)[0]
    try:
        with open_regular(root.host_str(inner)) as fh:
            head = fh.read(16)
            if len(head) == 16 and head[:4] == KPACK_MAGIC:
                _, toc_offset = struct.unpack("<IQ", head[4:])
                fh.seek(toc_offset)
                toc = _Unpack(fh.read(64 << 20)).value()
                arches = toc.get("gfx_arches") if isinstance(toc, dict) else None
                if isinstance(arches, list) and arches:
                    return KernelPack(inner, str(toc.get("group_name") or group),
                                      tuple(str(a) for a in arches), "toc")
    except (OSError, ValueError, struct.error):
        pass
    return KernelPack(inner, group, named, "name") if named else None
