"""Check that a model file is a whole GGUF file before any llama.cpp program gets it.

Reads the header (magic, version, key/value metadata, tensor table) and checks that every tensor's
data lies inside the file, so a download that stopped half way is one clear line rather than a
crash deep inside llama-bench.  Format: ggml-org/ggml docs/gguf.md.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build.errors import UsageError, reason

MAGIC = b"GGUF"
# value type -> struct format of a scalar (8 = string, 9 = array are read by hand)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type -> (elements per block, bytes per block): ggml/include/ggml.h and ggml-common.h
_TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
# general.file_type -> name (llama.cpp's llama_ftype)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16", 38: "MXFP4"}


class ModelError(UsageError):
    """The model file is missing, not GGUF, or cut short."""


# Limits of ggml's own reader (ggml/src/gguf.cpp, gguf_init_from_file_impl): a tensor has at most
# GGML_MAX_DIMS = 4 dimensions, `general.alignment` is a u32 power of 2, and an array's items are
# never arrays ("invalid GGUF type"), so a crafted file cannot make rocforge recurse at all.
MAX_DIMS = 4


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (ne0)
    nbytes: int | None  # None: a ggml type this table does not know

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass(frozen=True)
class PerToken:
    """What one token costs in weights: the basis of the bandwidth and GEMM ceilings."""
    bytes: int | None  # weight bytes read per generated token
    parameters: int | None  # matrix parameters multiplied per token (FLOP ~ 2x this)
    note: str  # how it was counted, or why it cannot be


@dataclass(frozen=True)
class Model:
    path: Path
    size: int
    version: int
    metadata: dict = field(repr=False)
    n_tensors: int = 0
    array_lengths: dict = field(default_factory=dict, repr=False)  # array keys (read past) -> length
    tensors: tuple[Tensor, ...] = field(default=(), repr=False)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name") or self.path.stem)

    @property
    def file_type(self) -> str:
        ft = self.metadata.get("general.file_type")
        return FILE_TYPES.get(ft, str(ft)) if ft is not None else "unknown"

    @property
    def n_vocab(self) -> int | None:
        return self.array_lengths.get("tokenizer.ggml.tokens")

    @property
    def n_ctx_train(self) -> int | None:
        value = self.metadata.get(f"{self.arch}.context_length")
        return int(value) if isinstance(value, int) else None

    def per_token(self) -> PerToken:
        """Weight bytes and matrix parameters one token goes through (see `per_token`)."""
        return per_token(self)


EXPERT_SUFFIX = "_exps.weight"  # llama.cpp's merged expert tensors: blk.N.ffn_{gate,up,down}_exps


def per_token(m: Model) -> PerToken:
    """Weights a token reads and multiplies, counted from the tensor table.

    Every tensor is read whole, except:
    - `token_embd.weight` is a row lookup (ggml_get_rows in llama.cpp's build_inp_embd), one row a
      token, and stays in host memory at any -ngl (llama.cpp src/llama-model.cpp, `dev_input`:
      "there is very little benefit to offloading the input layer, so always keep it on the
      CPU"); it is read whole only when the model has no `output.weight` and llama.cpp loads it
      a second time as the output matrix (tied embeddings, TENSOR_DUPLICATED);
    - expert tensors (`*_exps`) of a mixture-of-experts model: a token goes through
      `{arch}.expert_used_count` of `{arch}.expert_count` experts, so that share of them.
    Parameters count matrices only (2-D and up: the norms' elementwise weights are no GEMM)."""
    names = {t.name for t in m.tensors}
    if not m.tensors:
        return PerToken(None, None, "the model has no tensors")
    if any(t.nbytes is None for t in m.tensors):
        unknown = next(t.name for t in m.tensors if t.nbytes is None)
        return PerToken(None, None, f"tensor {unknown} has a ggml type rocforge does not know")
    experts = [t for t in m.tensors if t.name.endswith(EXPERT_SUFFIX)]
    share = 1.0
    how = "dense: every weight once per token"
    if experts:
        n_expert = m.metadata.get(f"{m.arch}.expert_count")
        n_used = m.metadata.get(f"{m.arch}.expert_used_count")
        if not (isinstance(n_expert, int) and isinstance(n_used, int) and 0 < n_used <= n_expert):
            return PerToken(None, None, f"a mixture of experts without a usable {m.arch}.expert_count "
                                        f"/ {m.arch}.expert_used_count: the share of experts read is not known")
        share = n_used / n_expert
        how = f"mixture of experts: {n_used} of {n_expert} experts per token"
    tied = "output.weight" not in names
    nbytes = params = 0.0
    for t in m.tensors:
        part = share if t.name.endswith(EXPERT_SUFFIX) else 1.0
        if t.name == "token_embd.weight" and not tied:
            rows = max(t.dims[-1], 1) if len(t.dims) > 1 else 1  # an empty table: no row
            nbytes += t.nbytes / rows  # one row, for the lookup
            continue
        nbytes += t.nbytes * part
        if len(t.dims) >= 2:
            params += t.elements * part
    return PerToken(round(nbytes), round(params), how + ("; token_embd is the output matrix (tied)"
                                                         if tied else ""))


_U64 = struct.Struct("<Q")


class _Reader:
    """The header, read from a memory map: a real model's header holds ~150k token strings and as
    many merges, which one read call each would take a good part of a second to walk."""

    def __init__(self, buf, path: Path, size: int):
        self.buf, self.path, self.size, self.off = buf, path, size, 0

    def _truncated(self) -> ModelError:
        return ModelError(f"{self.path} is truncated: its GGUF header runs past the end of the file "
                          f"({self.size} bytes)", "download the model again (the file was cut short)")

    def take(self, n: int) -> bytes:
        end = self.off + n
        if end > self.size:
            raise self._truncated()
        data, self.off = self.buf[self.off:end], end
        return data

    def scalar(self, fmt: str):
        s = _STRUCTS[fmt]
        if self.off + s.size > self.size:
            raise self._truncated()
        value = s.unpack_from(self.buf, self.off)[0]
        self.off += s.size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > self.size:
            raise ModelError(f"{self.path} is not a valid GGUF file (a string of {n} bytes in its header)")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Past `count` strings (u64 length + bytes each) without decoding them."""
        buf, off, size, unpack = self.buf, self.off, self.size, _U64.unpack_from
        for _ in range(count):
            if off + 8 > size:
                raise self._truncated()
            off += 8 + unpack(buf, off)[0]
        if off > size:
            raise self._truncated()
        self.off = off

    def invalid(self, what: str) -> ModelError:
        return ModelError(f"{self.path} is not a valid GGUF file ({what})",
                          "download the model again, or convert it again with llama.cpp's tools")

    def count(self, what: str, item_bytes: int) -> int:
        """A u64 count of items of at least `item_bytes` each, refused when they could not fit
        in the rest of the file (so no loop runs 2**64 times over a few bytes)."""
        n = self.scalar("<Q")
        if n * item_bytes > self.size - self.off:
            raise ModelError(f"{self.path} is truncated or not a valid GGUF file: its header counts "
                             f"{n} {what}, more than the {self.size - self.off} bytes left could hold",
                             "download the model again (the file was cut short or damaged)")
        return n

    def value(self, vtype: int):
        """A scalar or string value; arrays (token lists, scores) are read past and give None."""
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype = self.scalar("<I")
            if itype == 9:
                raise self.invalid("an array of arrays, which llama.cpp's reader refuses")
            if itype not in _SCALARS and itype != 8:
                raise self.invalid(f"an array of unknown value type {itype}")
            width = _STRUCTS[_SCALARS[itype]].size if itype in _SCALARS else 8  # a string: >= 8
            count = self.count("array items", width)
            self.last_count = count
            if itype == 8:
                self.skip_strings(count)
            else:  # numeric arrays: one jump
                self.take(count * width)
            return None
        raise self.invalid(f"unknown value type {vtype}")


_STRUCTS = {fmt: struct.Struct(fmt) for fmt in set(_SCALARS.values()) | {"<I", "<Q"}}


def _open_regular(p: Path) -> int:
    """A read-only descriptor of the model, refused unless it is a regular file.  Opened with
    O_NONBLOCK and checked with fstat on that descriptor: a FIFO at the path (or one swapped in
    after a look) is never waited on, a directory or a device never read as a model."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ModelError(f"model file {p} does not exist") from None
    except OSError as exc:
        raise ModelError(f"model file {p} cannot be read: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device or special file")
        raise ModelError(f"model file {p} is {kind}, not a regular file", "give the .gguf file itself")
    os.set_blocking(fd, True)
    return fd


def _alignment(r: _Reader, metadata: dict, types: dict) -> int:
    """`general.alignment`: a u32 power of 2 (docs/gguf.md; ggml's gguf.cpp refuses anything
    else), 32 when absent."""
    if "general.alignment" not in metadata:
        return 32
    value, vtype = metadata["general.alignment"], types["general.alignment"]
    if vtype != 4:  # GGUF_TYPE_UINT32
        raise r.invalid(f"general.alignment is of GGUF type {vtype}, not uint32")
    if value <= 0 or value & (value - 1):
        raise r.invalid(f"general.alignment {value} is not a power of 2")
    return value


def check(path: str | os.PathLike[str]) -> Model:
    """The model's header, or ModelError naming what is wrong with the file."""
    p = Path(path)
    fd = _open_regular(p)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size < 24 or fh.read(4) != MAGIC:
            raise ModelError(f"{p} is not a GGUF model (no GGUF magic at its start)",
                             "llama.cpp reads GGUF files; convert other formats with convert_hf_to_gguf.py")
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # a file that cannot be mapped
            raise ModelError(f"model file {p} cannot be read: {reason(exc)}") from None
    with buf:
        r = _Reader(buf, p, size)
        r.off = 4
        version = r.scalar("<I")
        if version == 1:  # 32-bit lengths and counts; llama.cpp's gguf.cpp refuses it as well
            raise ModelError(f"{p} is a GGUF version 1 file, which llama.cpp no longer reads",
                             "download or convert the model again (GGUF v2 or v3)")
        if version not in (2, 3):
            raise ModelError(f"{p} has GGUF version {version}, which this rocforge does not know")
        wide = "<Q"
        # a tensor-table entry is >= 8 + 4 + 4 + 8 bytes (name, n_dims, type, offset), a
        # key/value >= 8 + 4 + 1 (key, type, a one-byte value)
        n_tensors = r.count("tensors", 24)
        n_kv = r.count("key/value pairs", 13)
        metadata, lengths, types = {}, {}, {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("<I")
            metadata[key] = r.value(vtype)
            types[key] = vtype
            if vtype == 9:
                lengths[key] = r.last_count
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if n_dims > MAX_DIMS:
                raise r.invalid(f"a tensor of {n_dims} dimensions; ggml has at most {MAX_DIMS}")
            dims = [r.scalar(wide) for _ in range(n_dims)]
            ttype, offset = r.scalar("<I"), r.scalar("<Q")
            tensors.append((name, dims, ttype, offset))
        align = _alignment(r, metadata, types)
        start = -(-r.off // align) * align
    end = start
    table = []
    for name, dims, ttype, offset in tensors:
        n = 1
        for d in dims:
            n *= d
        block, nbytes = _TYPE_SIZES.get(ttype, (1, 0))
        end = max(end, start + offset + n // block * nbytes)
        table.append(Tensor(name, tuple(dims), n // block * nbytes if ttype in _TYPE_SIZES else None))
    if end > size:
        raise ModelError(f"{p} is truncated: its tensors need {end} bytes, the file has {size}",
                         "download the model again (the file was cut short)")
    return Model(path=p, size=size, version=version, metadata=metadata, n_tensors=n_tensors,
                 array_lengths=lengths, tensors=tuple(table))
