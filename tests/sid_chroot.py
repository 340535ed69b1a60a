"""A real Debian sid system with today's Debian ROCm (hipcc 7.0.2, HIP 6.4.3, LLVM 21, rocBLAS
6.4.4), made with mmdebstrap from the mirror this machine already uses, for the real HIP compiles.

The chroot is cached under ~/.cache/rocforge-test (ROCFORGE_TEST_CHROOTS) in a directory named
after a hash of its package list: a changed list makes a new one.  The host's apt configuration
is never touched (mmdebstrap reads only the mirror URI of the host's bookworm entry).  Entering
it needs root (plain `chroot` inside a private mount namespace, `unshare -m`, so the bind
mounts vanish with the process); callers skip loudly when not root.

    python3 tests/sid_chroot.py          # make (or find) the chroot and print its path
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUITE = "sid"
# Debian's ROCm as it ships in sid (HIP 6.4.3 / hipcc 7.0.2 / LLVM 21), the build tools, ccache,
# and rocforge's own dependencies as Debian packages (rocforge runs inside from the checkout;
# `rocforge bundle` rewrites RUNPATHs with patchelf).
PACKAGES = (
    "hipcc", "clang-21", "llvm-21", "lld-21", "rocm-device-libs-21", "libamdhip64-dev",
    "librocblas-dev", "libhipblas-dev", "cmake", "ninja-build", "g++", "ccache", "git",
    "python3", "python3-requests", "python3-packaging", "python3-rich", "python3-tomlkit",
    "python3-platformdirs", "patchelf",
)
# the mirror is a pinned snapshot: sid's Release file reads as expired without this
APT_OPT = 'Acquire::Check-Valid-Until "false"'

SRC = "/rocforge"  # the checkout, read-only inside
WORK = "/work"  # a writable directory of the caller's
CCACHE = "/ccache"  # the shared compiler cache


class NoChroot(Exception):
    """Why the chroot cannot be made or entered here (the tests skip with it)."""


def cache_root() -> Path:
    return Path(os.environ.get("ROCFORGE_TEST_CHROOTS",
                               Path.home() / ".cache" / "rocforge-test" / "chroots"))


def ccache_dir() -> Path:
    """The chroot builds' compiler cache (ROCFORGE_TEST_CHROOT_CCACHE: another one, e.g. empty
    to time a cold build)."""
    return Path(os.environ.get("ROCFORGE_TEST_CHROOT_CCACHE", cache_root() / "ccache-sid"))


def key(packages=PACKAGES) -> str:
    text = "\n".join([SUITE, APT_OPT, *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def mirror_uri(apt_dir: Path = Path("/etc/apt")) -> str:
    """The URI of the host's Debian bookworm entry (deb822 .sources or one-line sources.list)."""
    files = sorted((apt_dir / "sources.list.d").glob("*.sources")) + [apt_dir / "sources.list"]
    files += sorted((apt_dir / "sources.list.d").glob("*.list"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.M))
            suites = fields.get("Suites", "").split()
            if "bookworm" in suites and "security" not in fields.get("URIs", ""):
                return fields["URIs"].split()[0]
        for line in text.splitlines():
            m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
            if m and "security" not in m.group(1):
                return m.group(1)
    raise NoChroot(f"no Debian bookworm entry in {apt_dir} to take the mirror URI from")


def _check_host() -> None:
    if os.geteuid() != 0:
        raise NoChroot("the sid chroot needs root (plain chroot + bind mounts); CI runs as root")
    for tool in ("mmdebstrap", "unshare", "chroot"):
        if not shutil.which(tool):
            raise NoChroot(f"{tool} missing: install the packages in .ci/apt-packages.txt")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise NoChroot(f"no private mount namespace here (unshare -m: {probe.stderr.strip()})")


def ensure(log=print, extra: tuple[str, ...] = ()) -> Path:
    """The cached chroot for PACKAGES (and `extra` ones: a chroot of its own), made when missing
    (~1.5 min, ~550 MiB downloaded)."""
    _check_host()
    packages = (*PACKAGES, *extra)
    root = cache_root() / f"{SUITE}-{key(packages)}"
    if (root / ".complete").is_file():
        return root
    tmp = root.with_name(root.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["mmdebstrap", "--variant=apt", f"--aptopt={APT_OPT}",
           f"--include={','.join(packages)}", SUITE, str(tmp), mirror_uri()]
    log("$ " + shlex.join(cmd))
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"mmdebstrap failed ({res.returncode}):\n{res.stderr[-4000:]}")
    seconds = time.monotonic() - start
    (tmp / ".complete").write_text(f"{seconds:.0f} s\n" + "\n".join(packages) + "\n")
    tmp.rename(root)
    log(f"sid chroot made in {seconds:.0f} s: {root}")
    return root


def run(root: Path, argv: list[str], *, work: Path, binds: dict[str, Path] | None = None,
        env: dict[str, str] | None = None, timeout: float | None = None,
        hide: list[str] = (),
        ) -> subprocess.CompletedProcess:
    """Run argv inside the chroot with the checkout at /rocforge (read-only), `work` at /work,
    the compiler cache at /ccache and `binds` (inside path -> host path), in a private mount
    namespace; rocforge is importable (PYTHONPATH) and its data dirs are under /work.
    `hide`: paths inside the chroot masked for this run only (a file by /dev/null mounted over
    it, a directory by an empty tmpfs), e.g. the system's ROCm libraries."""
    _check_host()
    checkout = Path(__file__).resolve().parent.parent
    mounts = {SRC: checkout, WORK: work, CCACHE: ccache_dir(), **(binds or {})}
    ccache_dir().mkdir(parents=True, exist_ok=True)
    script = [f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev"]
    for inside, host in mounts.items():
        script += [f"mkdir -p {shlex.quote(str(root) + inside)}",
                   f"mount --bind {shlex.quote(str(host))} {shlex.quote(str(root) + inside)}"]
    script.append(f"mount -o remount,bind,ro {shlex.quote(str(root) + SRC)}")
    for inside in hide:
        real = os.path.realpath(str(root) + inside)
        assert real.startswith(str(root) + "/"), f"{inside} leaves the chroot"
        how = "-t tmpfs none" if os.path.isdir(real) else "--bind /dev/null"
        script.append(f"mount {how} {shlex.quote(real)}")
    full_env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": f"{WORK}/home", "LANG": "C.UTF-8",
        "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1", "CCACHE_DIR": CCACHE,
        "ROCFORGE_CONFIG_DIR": f"{WORK}/config", "ROCFORGE_CACHE_DIR": f"{WORK}/cache",
        "ROCFORGE_DATA_DIR": f"{WORK}/data", **(env or {}),
    }
    envs = [f"{k}={v}" for k, v in full_env.items()]
    script.append("exec chroot " + shlex.quote(str(root)) + " /usr/bin/env -i "
                  + shlex.join(envs + argv))
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec",
                           "\n".join(script)], capture_output=True, text=True, timeout=timeout)


def rocforge(root: Path, *args: str, work: Path, **kw) -> subprocess.CompletedProcess:
    return run(root, ["python3", "-m", "rocforge_build", *args], work=work, **kw)


if __name__ == "__main__":
    try:
        print(ensure(log=lambda m: print(m, file=sys.stderr)))
    except NoChroot as exc:
        sys.exit(f"sid chroot: {exc}")
