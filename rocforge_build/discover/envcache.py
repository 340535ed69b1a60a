"""A validated cache for `rocforge env` output, so shell start-up pays for `os` and a few stats.

A full `rocforge env` run records every path GPU and ROCm discovery consulted (`touch`): sysfs
files by content, everything else by `lstat` (mtime, size, inode, link target), missing paths as
missing.  The rendered script is stored with those stamps, keyed by the command line, the
environment variables discovery and rendering read, and the stamps of rocforge's own code and
data.  The header's second line holds the sizes of the stamps and of the output, and the output's
CRC-32: a cut or damaged entry is a miss.  `lookup` (called by the CLI before argparse is even
imported) returns the stored output only when the key matches, the output is whole and every
stamp is unchanged; otherwise the full run happens and refreshes the entry.  A new install
under /opt, a `rocforge nightly use` (the `current` link), a kernel library added to rocBLAS, a
changed sysfs node, another ROCM_PATH, a `rocforge use` choice (data dir use.toml) or a
verify verdict (data dir verified/) all invalidate it.

Read side: `os`, `sys` and `zlib` only.  `ROCFORGE_NO_CACHE=1` bypasses it.
"""

from __future__ import annotations

import os
import sys

MAGIC = "rocforge-envcache 2"
_ENV_KEYS = ("PATH", "ROCM_PATH", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
             "ROCBLAS_USE_HIPBLASLT", "SHELL", "HOME", "USER", "XDG_DATA_HOME", "XDG_CACHE_HOME",
             "XDG_CONFIG_HOME", "ROCFORGE_ROOT", "ROCFORGE_DATA_DIR", "ROCFORGE_CONFIG_DIR")
_LIST_KEYS = ("LD_LIBRARY_PATH", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH")
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # rocforge_build/
_CODE = ("discover/resolver.py", "discover/installs.py", "discover/gpus.py",
         "discover/envscript.py", "discover/envcache.py", "discover/targets.py", "rootfs.py",
         "discover/rocm_version.py", "discover/watched_reads.py", "discover/layouts.py",
         "paths.py", "config.py", "data/defaults.toml", "cli.py", "commands/env.py",
         "data/targets.toml", "data/layouts.toml", "discover/builds.py", "discover/shell.py",
         "discover/envwarnings.py", "discover/host.py",
         "data/host.toml", "discover/binaries.py", "resources.py", "shellsafe.py",
         "discover/choices.py", "records.py", "toml_subset.py", "schema.py",
         "manifest_schema.py")

_touched: dict[str, bool] | None = None  # host path -> stamp by content


def touch(path, content: bool = False) -> None:
    """Record a host path that discovery consulted (no-op unless recording)."""
    if _touched is not None:
        p = os.fspath(path)
        _touched[p] = _touched.get(p, False) or content


def start_recording() -> None:
    global _touched
    _touched = {}


def stop_recording() -> dict[str, bool]:
    global _touched
    recorded, _touched = _touched or {}, None
    return recorded


# -- stamps -------------------------------------------------------------------------------------
def _stamp(path: str, content: bool) -> str:
    if content:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never blocks
            try:
                if (os.fstat(fd).st_mode & 0o170000) != 0o100000:
                    return "n"  # not a regular file: never read
                return "c" + os.read(fd, 65536).hex()
            finally:
                os.close(fd)
        except OSError as exc:
            return f"e{exc.errno}"
    try:
        st = os.lstat(path)
    except OSError:
        return "-"
    s = f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}:{st.st_mode}"
    if (st.st_mode & 0o170000) == 0o120000:
        try:
            s += ":" + os.readlink(path)
        except OSError:
            pass
    return s


def _crc(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8", "surrogateescape"))


def _hex(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").hex()


def _parse(argv: list[str], environ) -> tuple | None:
    """(root, shell, target, rocm) for a plain `rocforge [--root R] env [...]`, else None."""
    got = plain_env(argv, environ)
    if got is None:
        return None
    root, opts = got
    from rocforge_build.discover.shell import calling_shell

    shell = opts["--shell"] or calling_shell(environ)  # the answer depends on who is asking
    return os.path.abspath(root), shell, opts["--target"], opts["--rocm"]


def plain_env(argv: list[str], environ) -> tuple[str, dict] | None:
    """(root as given, {--shell, --target, --rocm: value or None}) for a plain
    `rocforge [--root R] env [--shell S] [--target GFX] [--rocm PATH]` (each `--opt V` or
    `--opt=V`), else None: --json, --help, abbreviations and anything else are argparse's."""
    root = environ.get("ROCFORGE_ROOT", "/")
    opts = {"--shell": None, "--target": None, "--rocm": None}
    i, seen_env = 0, False
    while i < len(argv):
        tok = argv[i]
        name, eq, value = tok.partition("=")
        if not seen_env and tok == "env":
            seen_env = True
        elif not seen_env and name == "--root":
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            root = value
        elif seen_env and name in opts:
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            opts[name] = value
        else:
            return None  # --help, unknown options: let argparse handle it
        i += 1
    if not seen_env:
        return None
    return root, opts


def _cache_file(key: str, environ) -> str:
    import zlib

    base = environ.get("ROCFORGE_CACHE_DIR")
    if not base:  # platformdirs.user_cache_dir("rocforge") on Linux, without importing it
        xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "rocforge")
    return os.path.join(base, "env", f"{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}.sh")


def _key(parsed: tuple, environ) -> str:
    root, shell, target, rocm = parsed
    keys = _ENV_KEYS + (_LIST_KEYS if shell in ("json", "dotenv") else ())
    env = [(k, environ.get(k)) for k in keys]
    env += sorted((k, v) for k, v in environ.items() if k.startswith("HSA_OVERRIDE_GFX_VERSION"))
    code = [(c, _stamp(os.path.join(_PKG, c), False)) for c in _CODE]
    return repr((MAGIC, sys.executable, parsed, tuple(env), tuple(code)))


def lookup(argv: list[str], environ=os.environ) -> str | None:
    """The cached output for this command line, or None (miss, stale, or not cacheable)."""
    try:
        return _lookup(argv, environ)
    except (OSError, ValueError, UnicodeError):  # a damaged entry is a miss
        return None


def _lookup(argv: list[str], environ) -> str | None:
    if environ.get("ROCFORGE_NO_CACHE"):
        return None
    parsed = _parse(argv, environ)
    if parsed is None:
        return None
    key = _key(parsed, environ)
    try:
        with open(_cache_file(key, environ), encoding="utf-8", errors="surrogateescape") as fh:
            data = fh.read()
    except OSError:
        return None
    head, sep, rest = data.partition("\n")
    if head != MAGIC or not sep:
        return None
    sizes, _, rest = rest.partition("\n")
    fields = sizes.split(" ")
    if len(fields) != 3 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    size, length, crc = (int(f) for f in fields)
    header, output = rest[:size], rest[size:]
    if len(output) != length or _crc(output) != crc:
        return None  # a cut or damaged entry: the full run writes it again
    lines = header.split("\n")
    if not lines or lines[0] != _hex(key):
        return None
    for line in lines[1:]:
        if not line:
            continue
        kind, hpath, hstamp = line.split(" ", 2)
        path = bytes.fromhex(hpath).decode("utf-8", "surrogateescape")
        if _hex(_stamp(path, kind == "c")) != hstamp:
            return None
    return output


def store(argv: list[str], output: str, recorded: dict[str, bool], environ=os.environ) -> None:
    """Write the entry atomically; any failure only means no cache."""
    if environ.get("ROCFORGE_NO_CACHE"):
        return
    parsed = _parse(argv, environ)
    if parsed is None:
        return
    key = _key(parsed, environ)
    lines = [_hex(key)]
    for path, content in sorted(recorded.items()):
        lines.append(f"{'c' if content else 's'} {_hex(path)} {_hex(_stamp(path, content))}")
    header = "\n".join(lines) + "\n"
    target = _cache_file(key, environ)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(f"{MAGIC}\n{len(header)} {len(output)} {_crc(output)}\n{header}{output}")
        os.replace(tmp, target)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
