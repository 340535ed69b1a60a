"""Nightly benchmarks, measured side by side in one run:

1. listing parse: a 5,000-entry CDN index page (TheRock's `const files = [...]` format) and the
   same 5,000 keys as five S3 ListObjectsV2 pages, parsed, name-matched and sorted; plus the
   whole `list_nightlies` over loopback HTTP.
2. install throughput: `rocforge nightly install` (download with sha256 + safe extraction +
   record + atomic switch) of a generated TheRock tarball versus `curl -s URL | tar xzf -` of the
   same file from the same 127.0.0.1 server, alternating runs, medians reported.

    python benchmarks/bench_nightly.py [--size-mb 96] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from http_fixture import LocalHttpServer, cdn_index_html, s3_list_xml  # noqa: E402
from therock_tarballs import Mirror, make_tree, pack  # noqa: E402

from rocforge_build import config, download, extract  # noqa: E402
from rocforge_build.nightly import install as nightly_install  # noqa: E402
from rocforge_build.nightly import listing as nightlies  # noqa: E402

GROUPS = ["gfx1151", "gfx115X-all", "gfx110X-all", "gfx110X-dgpu", "gfx94X-dcgpu", "gfx120X-all",
          "gfx103X-dgpu", "gfx950-dcgpu", "multiarch", "gfx90X-dcgpu"]


def listing(n: int) -> list[tuple[str, float]]:
    out = []
    for i in range(n):
        g = GROUPS[i % len(GROUPS)]
        k = i // len(GROUPS)  # unique per group: a date, then a minor version
        day = 20250101 + k % 28 + 100 * ((k // 28) % 12)
        ver = f"7.{10 + k // 336}.0a{day}" if i % 7 else f"7.10.0.dev0+{i:040x}"
        variant = "-tests" if i % 11 == 0 else ""
        out.append((f"therock-dist-linux-{g}{variant}-{ver}.tar.gz", 1.76e9 + i))
    return out


def timeit(fn, repeat: int) -> float:
    best = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t)
    return statistics.median(best)


def bench_listing(n: int = 5000, repeat: int = 7) -> None:
    files = listing(n)
    page = cdn_index_html(files)
    url = "https://rocm.nightlies.amd.com/tarball/"
    pattern = nightlies.name_pattern(["tests", "hpc", "hpc-tests"])

    def parse_cdn():
        raw = nightlies.parse_cdn_index(page, url)
        entries = [nightlies.parse_name(nm, u, mtime=m, pattern=pattern) for nm, u, m, _s in raw]
        ranked = nightlies.for_groups([e for e in entries if e and not e.variant],
                                      nightlies.groups_for("gfx1151"))
        assert ranked

    objects = {name: (b"", m) for name, m in files}
    keys = sorted(objects)
    pages = [s3_list_xml("therock-nightly-tarball", "", keys[i:i + 1000], objects, 1000, None,
                         "t" if i + 1000 < n else None) for i in range(0, n, 1000)]

    def parse_s3():
        entries = []
        for p in pages:
            got, _tok = nightlies.parse_s3_xml(p)
            entries += [nightlies.parse_name(k, k, mtime=m, size=s, pattern=pattern)
                        for k, m, s in got]
        assert len(entries) == n

    t_cdn = timeit(parse_cdn, repeat)
    t_s3 = timeit(parse_s3, repeat)
    server = LocalHttpServer()
    try:
        server.add("/tarball/", page)
        src = nightlies.Source("cdn", "cdn-index", server.url("/tarball/"))
        t_http = timeit(lambda: nightlies.list_nightlies([src]), repeat)
        bucket = server.add_s3_bucket("/bucket", objects, max_keys=1000)
        s3src = nightlies.Source("s3", "s3", bucket)
        t_s3_http = timeit(lambda: nightlies.list_nightlies([s3src]), repeat)
    finally:
        server.close()
    print(f"listing parse, {n} entries (median of {repeat}):")
    print(f"  CDN index.html  parse+match+rank   {t_cdn * 1e3:8.1f} ms  ({t_cdn / n * 1e6:.1f} us/entry)")
    print(f"  S3 XML, 5 pages parse+match        {t_s3 * 1e3:8.1f} ms  ({t_s3 / n * 1e6:.1f} us/entry)")
    print(f"  CDN over loopback HTTP, end to end {t_http * 1e3:8.1f} ms")
    print(f"  S3 over loopback HTTP, 5 requests  {t_s3_http * 1e3:8.1f} ms")


def make_big_tree(dest: Path, size_mb: int) -> Path:
    """A TheRock tree whose bulk compresses like real libraries (~3x): repetitive runs
    interleaved with random bytes, in 4 MB files."""
    tree = make_tree(dest, "7.10.0a20251101", ["gfx1151"])
    rnd = os.urandom(1 << 20)
    block = (rnd[:300_000] + bytes(range(256)) * 2900)[: 1 << 20]
    for i in range(size_mb // 4):
        with open(tree / "lib" / f"libbulk{i}.so", "wb") as fh:
            for j in range(4):
                fh.write(block[j * 7:] + block[: j * 7])
    return tree


def bench_install(size_mb: int, runs: int) -> None:
    if not shutil.which("curl") or not shutil.which("tar"):
        print("install throughput: skipped (needs curl and tar)")
        return
    work = Path(tempfile.mkdtemp(prefix="rocforge-bench-"))
    os.environ["ROCFORGE_CONFIG_DIR"] = str(work / "config")
    server = LocalHttpServer()
    try:
        tree = make_big_tree(work / "tree", size_mb)
        arch = pack(tree, work / "therock-dist-linux-gfx1151-7.10.0a20251101.tar.gz")
        shutil.rmtree(tree)
        mirror = Mirror(server, "/tarball/")
        url = mirror.add_file(arch, 1.7619e9)
        cfg = config.effective()
        cfg["nightly"]["sources"]["cdn"]["url"] = mirror.url
        cfg["nightly"]["use"] = ["cdn"]
        t_curl, t_rf, t_co, t_dl, t_tar, t_ex = [], [], [], [], [], []
        for i in range(runs):
            # parts: download alone, unpack alone
            t = time.perf_counter()
            subprocess.run(["curl", "-s", "-o", str(work / "c.tar.gz"), url], check=True)
            t_co.append(time.perf_counter() - t)
            t = time.perf_counter()
            download.download(url, work / "d.tar.gz", progress=False)
            t_dl.append(time.perf_counter() - t)
            for d in ("x1", "x2"):
                (work / d).mkdir()
            t = time.perf_counter()
            subprocess.run(["tar", "xzf", str(work / "c.tar.gz"), "-C", str(work / "x1")], check=True)
            t_tar.append(time.perf_counter() - t)
            t = time.perf_counter()
            extract.safe_extract(work / "d.tar.gz", work / "x2")
            t_ex.append(time.perf_counter() - t)
            for d in ("x1", "x2", "c.tar.gz", "d.tar.gz"):
                p = work / d
                shutil.rmtree(p) if p.is_dir() else p.unlink()

            out = work / f"curl{i}"
            out.mkdir()
            t = time.perf_counter()
            subprocess.run(f"curl -s {url} | tar xzf - -C {out}", shell=True, check=True)
            t_curl.append(time.perf_counter() - t)
            shutil.rmtree(out)

            prefix = work / f"rocm{i}"
            t = time.perf_counter()
            entries = nightlies.list_nightlies(nightlies.configured_sources(cfg))
            layers, _ = nightlies.layer_plan(entries, "gfx1151", ["gfx1151"], None, None)
            nightly_install.install(layers, prefix, cfg=cfg, progress=False, log=lambda m: None)
            t_rf.append(time.perf_counter() - t)
            shutil.rmtree(prefix)
        c, r = statistics.median(t_curl), statistics.median(t_rf)
        mb = arch.stat().st_size / 1e6
        print(f"install throughput, {mb:.0f} MB tarball ({size_mb} MB unpacked), loopback, "
              f"median of {runs} alternating runs:")
        print(f"  curl -s | tar xzf -                {c:6.2f} s  {mb / c:7.1f} MB/s")
        print(f"  rocforge nightly install           {r:6.2f} s  {mb / r:7.1f} MB/s"
              "  (list + download + sha256 + safe extract + record + switch)")
        print(f"  ratio rocforge / curl|tar          {r / c:6.2f}x time")
        med = statistics.median
        print(f"  parts: curl -o {med(t_co):.2f} s vs download() {med(t_dl):.2f} s (with sha256); "
              f"tar xzf {med(t_tar):.2f} s vs safe_extract() {med(t_ex):.2f} s")
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    bench_listing()
    bench_install(args.size_mb, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
