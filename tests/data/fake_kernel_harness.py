"""A stand-in for the compiled `rocforge-kernels` harness, for machines without a GPU.

It speaks the harness's protocol (argv, raw files in --dir, one JSON line) and computes each
kernel with NumPy, decoding Q4_0 byte by byte from the raw file (independently of
rocforge_build.kernels.reference).  FAKE_HARNESS_BREAK=<kernel> makes that kernel wrong on purpose.
"""

import json
import os
import sys
import time

import numpy as np


def arg(argv, name, cast, default=None):
    return cast(argv[argv.index(name) + 1]) if name in argv else default


def q8(x):
    """8-bit blocks of 32, written out longhand: scale max|x|/127, round half to even."""
    out = np.empty(len(x), dtype=np.float64)
    for b in range(len(x) // 32):
        xb = x[32 * b:32 * b + 32]
        d = np.float32(np.float32(np.abs(xb).max()) / np.float32(127))
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        out[32 * b:32 * b + 32] = np.rint(xb * inv).astype(np.float64) * np.float64(d)
    return out


def gemv(raw, m, k, x):
    rows = raw.reshape(m, k // 32, 18)
    d = rows[:, :, 0:2].copy().view("<f2")[:, :, 0].astype(np.float64)
    qs = rows[:, :, 2:].astype(np.int64)
    lo, hi = (qs & 15) - 8, (qs >> 4) - 8
    if os.environ.get("FAKE_HARNESS_BREAK") == "q4_0_gemv":
        lo, hi = hi, lo  # the classic mistake: nibbles swapped
    xb = q8(x).reshape(k // 32, 32)
    per_block = (lo * xb[None, :, :16]).sum(-1) + (hi * xb[None, :, 16:]).sum(-1)
    return (d * per_block).sum(1)


def main(argv):
    if argv[1] == "info":
        print(json.dumps({"ok": True, "platform": "fake", "device": "NumPy", "arch": os.environ.get("FAKE_HARNESS_ARCH", "gfx1151"),
                          "compute_units": 1, "warp_size": 32, "device_wave_size": 32,
                          "gemm_path": 0, "memory_bytes": 0, "runtime_version": 0}))
        return 0
    kernel, folder = argv[2], arg(argv, "--dir", str)
    iters = arg(argv, "--iters", int, 1)
    p = lambda name: os.path.join(folder, name)  # noqa: E731
    t0 = time.perf_counter()
    if kernel in ("memcpy", "copy"):
        out = np.fromfile(p("a.bin"), dtype=np.float32)
    elif kernel == "triad":
        s = np.float32(arg(argv, "--scalar", float))
        out = np.fromfile(p("b.bin"), np.float32) + s * np.fromfile(p("c.bin"), np.float32)
    elif kernel == "q4_0_gemv":
        m, k = arg(argv, "--m", int), arg(argv, "--k", int)
        raw = np.fromfile(p("w.bin"), dtype=np.uint8)
        out = gemv(raw, m, k, np.fromfile(p("x.bin"), np.float32)).astype(np.float32)
    elif kernel == "gemm_f16":
        m, n, k = arg(argv, "--m", int), arg(argv, "--n", int), arg(argv, "--k", int)
        a = np.fromfile(p("a.bin"), np.float16).reshape(m, k).astype(np.float32)
        b = np.fromfile(p("b.bin"), np.float16).reshape(k, n).astype(np.float32)
        out = a @ b
    else:
        print(json.dumps({"ok": False, "error": f"unknown kernel: {kernel}"}))
        return 2
    if os.environ.get("FAKE_HARNESS_BREAK") == kernel and kernel != "q4_0_gemv":
        out = out.copy()
        out.flat[len(out.flat) // 2] += 1.0
    ms = (time.perf_counter() - t0) * 1e3
    np.ascontiguousarray(out, dtype=np.float32).tofile(p("out.bin"))
    print(json.dumps({"ok": True, "kernel": kernel, "ms": [ms] * iters}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
