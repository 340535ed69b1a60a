#!/usr/bin/env python3
"""Regenerate the real-package fixture roots in this directory from Debian's own packages.

    python3 tests/data/realroots/regenerate.py [--cache DIR] [--keep-apt]

For each stack below it downloads the named package versions with `apt-get download` through
a temporary apt configuration (deb822 `.sources` for bookworm, trixie and sid, with the mirror
URI of this host's bookworm entry; the host's own apt setup is never touched), unpacks them
with `dpkg-deb -x`, writes a dpkg status file from their control data, and trims the tree so it
can be committed:

- directories, file names, symbolic links and modes are kept as packaged;
- ELF files become small valid ELF files carrying the original SONAME, NEEDED entries and
  the strings rocforge reads (ISA names `amdgcn-amd-amdhsa--gfx*`, LLVM paths and clang
  names); `readelf -d` / `strings` on them give the same answers as on the originals;
- scripts in bin/ (hipcc.pl, hipvars.pm, ...) and version headers keep their text; other
  files are emptied (names only);
- documentation and manual pages are dropped.

The mirror is a pinned snapshot, so the newer suites' Release files read as expired:
`Acquire::Check-Valid-Until "false"`.  Needs apt-get, dpkg-deb and network to the mirror;
~650 MB of downloads (rocBLAS and hipBLASLt), cached in --cache.  Tests never run this.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (packages as name=version, note). Versions as in the archive on 2026-11-23.
STACKS: dict[str, tuple[tuple[str, ...], str]] = {
    "bookworm": ((
        "hipcc=5.2.3-8", "libamdhip64-5=5.2.3-8", "libamdhip64-dev=5.2.3-8",
        "libhsa-runtime64-1=5.2.3-3", "rocm-device-libs=5.2.3-2", "clang-15=1:15.0.6-4+b1",
    ), "Debian 12: HIP 5.2.3, ROCr 5.2.3, clang-15, no rocBLAS"),
    "trixie": ((
        "hipcc=5.7.1-6+deb13u1", "libamdhip64-5=5.7.1-6+deb13u1", "libamdhip64-dev=5.7.1-6+deb13u1",
        "libhsa-runtime64-1=6.1.2-3", "rocm-device-libs-17=6.0+git20231212.5a852ed-2",
        "clang-17=1:17.0.6-22+b2", "librocblas0=5.5.1+dfsg-7", "librocblas-dev=5.5.1+dfsg-7",
    ), "Debian 13: HIP 5.7.1, ROCr 6.1.2, rocBLAS 5.5.1, LLVM 17"),
    "sid": ((
        "hipcc=7.0.2+dfsg-3", "libamdhip64-6=6.4.3-5", "libamdhip64-dev=6.4.3-5",
        "libhsa-runtime64-1=6.4.3+dfsg-5", "rocm-device-libs-21=7.0.2+dfsg-3",
        "clang-21=1:21.1.8-14", "clang-22=1:22.1.8-3", "librocblas4=6.4.4-4",
        "librocblas-dev=6.4.4-4", "libhipblaslt1=7.1.1+dfsg-4", "libhipblaslt-dev=7.1.1+dfsg-4",
    ), "Debian sid: hipcc 7.0.2, HIP 6.4.3, rocBLAS 6.4.4, hipBLASLt 7.1.1, LLVM 21 + clang-22"),
    "sid-runtime": ((
        "libamdhip64-6=6.4.3-5", "libhsa-runtime64-1=6.4.3+dfsg-5", "librocblas4=6.4.4-4",
        "libhipblaslt1=7.1.1+dfsg-4", "clang-22=1:22.1.8-3",
    ), "Debian sid runtime only: libamdhip64-6, ROCr, rocBLAS, hipBLASLt, an unrelated clang-22"),
}

_DROP = ("usr/share/doc/", "usr/share/man/", "usr/share/lintian/", "usr/share/bug/")
_KEEP_TEXT = re.compile(r"(^usr/bin/[^/]+$|version[^/]*\.h$|\.pc$)")
_STRING_RE = re.compile(rb"[\x20-\x7e]{4,}")
_WANTED = re.compile(rb"amdgcn-amd-amdhsa--gfx|llvm|clang")


def host_bookworm_uri() -> str:
    """The URI of this host's bookworm entry (deb822 .sources or one-line sources.list)."""
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in files:
        for stanza in f.read_text().split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if "bookworm" in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
    for f in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if f.exists():
            m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", f.read_text(), re.M)
            if m:
                return m.group(1)
    sys.exit("no bookworm entry in /etc/apt: cannot tell which mirror to use")


def apt_options(top: Path) -> list[str]:
    return [
        "-o", f"Dir::Etc={top}/etc", "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={top}/etc/sources.list.d",
        "-o", f"Dir::Etc::Parts={top}/etc/apt.conf.d",
        "-o", f"Dir::Etc::Preferences={top}/etc/preferences",
        "-o", f"Dir::Etc::PreferencesParts={top}/etc/preferences.d",
        "-o", f"Dir::State::Lists={top}/lists", "-o", f"Dir::Cache={top}/cache",
        "-o", "Dir::State::status=/dev/null", "-o", "Acquire::Check-Valid-Until=false",
        "-o", "APT::Architecture=amd64", "-o", "Acquire::Languages=none",
        "-o", "APT::Sandbox::User=root",
    ]


def apt_setup(top: Path, uri: str) -> list[str]:
    for d in ("etc/sources.list.d", "etc/apt.conf.d", "etc/preferences.d", "lists/partial",
              "cache/archives/partial"):
        (top / d).mkdir(parents=True, exist_ok=True)
    for suite in ("bookworm", "trixie", "sid"):
        (top / f"etc/sources.list.d/{suite}.sources").write_text(
            f"Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    opts = apt_options(top)
    subprocess.run(["apt-get", *opts, "update"], check=True)
    return opts


def download(opts: list[str], cache: Path, packages) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    missing = []
    for spec in packages:
        name, version = spec.split("=", 1)
        fname = f"{name}_{version.replace(':', '%3a')}_amd64.deb"
        if not (cache / fname).exists():
            missing.append(spec)
        out.append(cache / fname)
    if missing:
        subprocess.run(["apt-get", *opts, "download", *missing], cwd=cache, check=True)
    return out


# -- trimming ------------------------------------------------------------------------------------
def small_elf(soname: str | None, needed: list[str], strings: list[bytes]) -> bytes:
    """A valid little-endian ELF64 shared object: .dynstr, .dynamic (NEEDED, SONAME),
    .rodata (the kept strings), .shstrtab; one PT_LOAD and one PT_DYNAMIC."""
    dynstr = b"\0"
    offsets = {}
    for s in [*needed, *([soname] if soname else [])]:
        if s not in offsets:
            offsets[s] = len(dynstr)
            dynstr += s.encode() + b"\0"
    entries = [(1, offsets[n]) for n in needed]
    if soname:
        entries.append((14, offsets[soname]))
    entries.append((0, 0))
    dynamic = b"".join(struct.pack("<qQ", t, v) for t, v in entries)
    rodata = b"\0".join(strings) + b"\0"
    shstr = b"\0.dynstr\0.dynamic\0.rodata\0.shstrtab\0"
    ehsize, phsize, shsize = 64, 56, 64
    off_dynstr = ehsize + 2 * phsize
    off_dynamic = (off_dynstr + len(dynstr) + 7) & ~7
    off_rodata = off_dynamic + len(dynamic)
    off_shstr = off_rodata + len(rodata)
    off_sh = (off_shstr + len(shstr) + 7) & ~7
    body = bytearray(off_sh + 5 * shsize)
    body[0:ehsize] = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
                      + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, ehsize, off_sh, 0, ehsize,
                                    phsize, 2, shsize, 5, 4))
    end = off_sh
    body[ehsize:ehsize + phsize] = struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, end, end, 0x1000)
    body[ehsize + phsize:ehsize + 2 * phsize] = struct.pack(
        "<IIQQQQQQ", 2, 6, off_dynamic, off_dynamic, off_dynamic, len(dynamic), len(dynamic), 8)
    body[off_dynstr:off_dynstr + len(dynstr)] = dynstr
    body[off_dynamic:off_dynamic + len(dynamic)] = dynamic
    body[off_rodata:off_rodata + len(rodata)] = rodata
    body[off_shstr:off_shstr + len(shstr)] = shstr
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 3, 2, off_dynstr, off_dynstr, len(dynstr), 0, 0, 1, 0),
        (9, 6, 3, off_dynamic, off_dynamic, len(dynamic), 1, 0, 8, 16),
        (18, 1, 2, off_rodata, off_rodata, len(rodata), 0, 0, 1, 0),
        (26, 3, 0, 0, off_shstr, len(shstr), 0, 0, 1, 0),
    ]
    for i, s in enumerate(sections):
        body[off_sh + i * shsize:off_sh + (i + 1) * shsize] = struct.pack("<IIQQQQIIQQ", *s)
    return bytes(body)


def _readelf_dynamic(path: Path) -> tuple[str | None, list[str]]:
    out = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    m = re.search(r"\(SONAME\)\s+Library soname: \[(.+?)\]", out)
    return (m.group(1) if m else None), needed


def _wanted_strings(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return list(dict.fromkeys(s for s in _STRING_RE.findall(data) if _WANTED.search(s)
                              and len(s) < 200))


def trim(tree: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(tree):
        for name in filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(tree).as_posix()
            if p.is_symlink():
                continue
            if rel.startswith(_DROP):
                p.unlink()
                continue
            mode = stat.S_IMODE(p.lstat().st_mode)
            with open(p, "rb") as fh:
                head = fh.read(4)
            if head == b"\x7fELF":
                soname, needed = _readelf_dynamic(p)
                data = small_elf(soname, needed, _wanted_strings(p))
                p.write_bytes(data)
            elif _KEEP_TEXT.search(rel) and b"\0" not in p.read_bytes()[:8192]:
                pass
            else:
                p.write_bytes(b"")
            p.chmod(mode)
    for sub in _DROP:
        shutil.rmtree(tree / sub, ignore_errors=True)
    # Drop directories emptied by the above (usr/share/doc/<pkg>).
    for dirpath, _dirs, _files in sorted(os.walk(tree), key=lambda t: -len(t[0])):
        if not os.listdir(dirpath) and Path(dirpath) != tree:
            os.rmdir(dirpath)


def dpkg_status(debs: list[Path]) -> str:
    stanzas = []
    for deb in debs:
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True,
                                 check=True).stdout.rstrip("\n")
        lines = control.split("\n")
        lines.insert(1, "Status: install ok installed")
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas)


def build_stack(name: str, debs: list[Path], note: str, out: Path) -> None:
    tree = out / name
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    trim(tree)
    status = tree / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(dpkg_status(debs))
    (tree / "STACK").write_text(note + "\n" + "".join(f"{d.name}\n" for d in debs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path,
                    default=Path.home() / ".cache/rocforge-test/realroots-debs")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("stacks", nargs="*", default=list(STACKS))
    args = ap.parse_args(argv)
    uri = host_bookworm_uri()
    with tempfile.TemporaryDirectory(prefix="rocforge-apt-") as top:
        opts = apt_setup(Path(top), uri)
        for name in args.stacks:
            packages, note = STACKS[name]
            debs = download(opts, args.cache, packages)
            build_stack(name, debs, note, args.out)
            print(f"{name}: {len(debs)} packages -> {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
