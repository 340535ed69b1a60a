"""NumPy side of `rocforge kernels bench`: inputs for each kernel and the reference it is checked
against.  Also the Q4_0 format itself (ggml's `block_q4_0`), quantize and dequantize.

A case's `check(output)` returns the worst |gpu - reference| / tolerance over all elements: <= 1
passes.  Tolerances scale with what the sum could lose in fp32 (|A|·|B| for products), so a wrong
index or a wrong nibble (errors of the size of the result itself) fails by orders of magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

QK4_0 = 32
# ggml's block_q4_0: ggml_half d; uint8_t qs[QK4_0 / 2]  (18 bytes, no padding)
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK4_0 // 2,))])
assert BLOCK_Q4_0.itemsize == 18

_BIG = 1e30  # reported for a result that should be exact and is not


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """(..., nb) blocks -> (..., nb*32) float32 weights: byte j holds weight j (low nibble) and
    weight j+16 (high nibble); weight = (q - 8) * d."""
    qs = blocks["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32) - 8.0
    w = q * blocks["d"].astype(np.float32)[..., None]
    return w.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK4_0)


def quantize_q4_0(w: np.ndarray) -> np.ndarray:
    """float weights (..., k) -> Q4_0 blocks, as ggml's quantize_row_q4_0_ref does."""
    x = np.asarray(w, dtype=np.float32).reshape(*w.shape[:-1], w.shape[-1] // QK4_0, QK4_0)
    idx = np.abs(x).argmax(axis=-1)
    amax = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]  # signed value of largest |x|
    d = amax / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip((x * inv[..., None] + 8.5).astype(np.int32), 0, 15).astype(np.uint8)
    blocks = np.empty(x.shape[:-1], dtype=BLOCK_Q4_0)
    blocks["d"] = d.astype(np.float16)
    blocks["qs"] = q[..., : QK4_0 // 2] | (q[..., QK4_0 // 2:] << 4)
    return blocks


@dataclass
class Case:
    kernel: str
    shape: dict
    inputs: dict[str, np.ndarray]
    out_dtype: type
    bytes: int = 0  # memory traffic for the bandwidth figure
    flops: int = 0
    scalar: float | None = None
    _check: object = field(default=None, repr=False)

    def write_inputs(self, folder: Path) -> None:
        for name, array in self.inputs.items():
            np.ascontiguousarray(array).tofile(folder / f"{name}.bin")

    def check(self, output: np.ndarray) -> float:
        return float(self._check(output))


def _ratio(out: np.ndarray, ref: np.ndarray, tol: np.ndarray | float) -> float:
    if out.shape != ref.shape:
        return _BIG
    if not np.all(np.isfinite(out)):
        return _BIG
    err = np.abs(out.astype(np.float64) - ref)
    tol = np.asarray(tol, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(err == 0, 0.0, err / np.where(tol > 0, tol, 0.0))
    r = np.nan_to_num(r, nan=_BIG, posinf=_BIG)
    return float(min(r.max(initial=0.0), _BIG))


def make_case(entry: dict, rng: np.random.Generator) -> Case:
    kernel = entry["kernel"]
    maker = _MAKERS.get(kernel)
    if maker is None:
        raise ValueError(f"no reference for kernel {kernel!r}")
    return maker(entry, rng)


def _copy_case(entry: dict, rng: np.random.Generator) -> Case:
    n = int(entry["n"])
    a = rng.standard_normal(n, dtype=np.float32)
    return Case(entry["kernel"], {"n": n}, {"a": a}, np.float32, bytes=2 * 4 * n,
                _check=lambda out: 0.0 if np.array_equal(out, a) else _BIG)


def _triad_case(entry: dict, rng: np.random.Generator) -> Case:
    n = int(entry["n"])
    s = 3.0
    b = rng.standard_normal(n, dtype=np.float32)
    c = rng.standard_normal(n, dtype=np.float32)
    ref = b.astype(np.float64) + s * c.astype(np.float64)
    tol = 2.0 * np.finfo(np.float32).eps * (np.abs(b) + np.abs(s * c.astype(np.float64)))
    return Case("triad", {"n": n}, {"b": b, "c": c}, np.float32, bytes=3 * 4 * n, scalar=s,
                _check=lambda out: _ratio(out, ref, tol))


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (k float32) -> (xq int8 (k/32, 32), dx float32 (k/32)) the way the GPU does it before
    the GEMV (and llama.cpp before mul_mat_vec_q): dx = max|x| / 127, xq = rint(x * (1/dx)).
    Every step is one IEEE float32 operation, so NumPy and the GPU agree bit for bit."""
    xb = np.asarray(x, dtype=np.float32).reshape(-1, QK4_0)
    d = np.abs(xb).max(axis=1) / np.float32(127.0)
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d != 0)
    xq = np.rint(xb * inv[:, None]).astype(np.int8)
    return xq, d


def _gemv_case(entry: dict, rng: np.random.Generator) -> Case:
    m, k = int(entry["m"]), int(entry["k"])
    nb = k // QK4_0
    blocks = np.empty((m, nb), dtype=BLOCK_Q4_0)
    scale = rng.uniform(0.002, 0.02, size=(m, nb)) * rng.choice([-1.0, 1.0], size=(m, nb))
    blocks["d"] = scale.astype(np.float16)
    blocks["qs"] = rng.integers(0, 256, size=(m, nb, QK4_0 // 2), dtype=np.uint8)
    x = rng.standard_normal(k, dtype=np.float32)

    def check(out: np.ndarray) -> float:
        # the reference: W (dequantized exactly) times x as the kernel sees it (8-bit blocks)
        xq, dx = quantize_q8(x)
        xk = (xq.astype(np.float64) * dx.astype(np.float64)[:, None]).reshape(k)
        xabs = np.abs(xk).reshape(nb, QK4_0).sum(axis=1)
        ref = np.empty(m, dtype=np.float64)
        mag = np.empty(m, dtype=np.float64)
        step = max(1, (1 << 24) // k)
        for r0 in range(0, m, step):
            w = dequantize_q4_0(blocks[r0:r0 + step]).astype(np.float64)
            ref[r0:r0 + step] = w @ xk
            # what fp32 per-block scaling and summing can lose: |d| * 16 * sum|x| per block
            d = np.abs(blocks["d"][r0:r0 + step].astype(np.float64))
            mag[r0:r0 + step] = (d * 16.0) @ xabs
        return _ratio(out, ref, 2e-5 * mag + 1e-6)

    wbytes = m * nb * BLOCK_Q4_0.itemsize
    return Case("q4_0_gemv", {"m": m, "k": k}, {"w": blocks, "x": x}, np.float32,
                bytes=wbytes + 4 * k + 4 * m, _check=check)


def _gemm_case(entry: dict, rng: np.random.Generator) -> Case:
    m, n, k = int(entry["m"]), int(entry["n"]), int(entry["k"])
    a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float16)
    b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(np.float16)

    def check(out: np.ndarray) -> float:
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        ref = (a32 @ b32).astype(np.float64)
        mag = (np.abs(a32) @ np.abs(b32)).astype(np.float64)
        return _ratio(out.reshape(m, n), ref, 2e-5 * mag + 1e-6)

    return Case("gemm_f16", {"m": m, "n": n, "k": k}, {"a": a, "b": b}, np.float32,
                flops=2 * m * n * k, _check=check)


_MAKERS = {
    "memcpy": _copy_case,
    "copy": _copy_case,
    "triad": _triad_case,
    "q4_0_gemv": _gemv_case,
    "gemm_f16": _gemm_case,
}
