"""What rocforge built: install prefixes under `paths.builds_prefix()` (`<recipe>-<target>-<backend>`),
each described by the `rocforge-manifest.toml` the build pipeline wrote at its root (its format:
`manifest_schema.py`).

`rocforge env` reads them on every shell start-up (through its cache), so this is stdlib only:
tomllib, no rich, no packaging.  Every path goes through `Root` and is recorded for the env cache
(`envcache.touch`): the builds directory itself (a new or replaced prefix changes its mtime), each
manifest and each expected output, so a new build, a rebuild or a deleted kernel file invalidates
the cached answer.  The resolver decides what to do with them (`resolver.resolve`).
"""

from __future__ import annotations

import os

from rocforge_build.discover.watched_reads import watch
from rocforge_build.errors import ConfigError
from rocforge_build.manifest_schema import MANIFEST, MANIFEST_HINT, MANIFEST_MAX, checked_manifest
from rocforge_build.records import FRESH, Record, fresh, init
from rocforge_build.rootfs import Root, inner_join, inner_path, open_regular
from rocforge_build.toml_subset import tomllib_loads


class Build(Record):
    __slots__ = ("prefix", "recipe", "target", "backend", "version", "commit", "built_at",
                 "export_env", "export_reasons", "outputs", "missing", "lib_dir", "bin_dir", "stamp",
                 "toolchain")

    def __init__(self, prefix: str,  # inner path, as lib_dir and bin_dir
                 recipe: str, target: str, backend: str, version: str | None,
                 commit: str | None, built_at: str | None,
                 export_env: dict[str, str] = FRESH,  # values re-based onto `prefix`
                 export_reasons: dict[str, str] = FRESH,
                 outputs: tuple[str, ...] = (),  # expected files (globs) relative to the prefix
                 missing: tuple[str, ...] = (),  # expected files no longer there
                 lib_dir: str | None = None,
                 bin_dir: str | None = None,  # what `rocforge env` may put on PATH
                 stamp: str | None = None,  # the manifest's build stamp (a rebuild changes it)
                 toolchain: str = "hip"):  # hip | vulkan | host: what the build ran on
        init(self, prefix, recipe, target, backend, version, commit, built_at, fresh(export_env),
             fresh(export_reasons), outputs, missing, lib_dir, bin_dir, stamp, toolchain)

    @property
    def needs_rocm(self) -> bool:
        """A HIP build runs on a ROCm and one GPU target; a host (CPU) or Vulkan build on neither."""
        return self.toolchain not in ("host", "vulkan")

    def describe(self) -> str:
        what = f"{self.recipe} {self.version}" if self.version else self.recipe
        return f"{what} ({self.backend}) built for {self.target or 'no GPU target'} at {self.prefix}"

    def to_json(self) -> dict:
        return {
            "prefix": self.prefix, "recipe": self.recipe, "target": self.target,
            "backend": self.backend, "version": self.version, "commit": self.commit,
            "built_at": self.built_at, "export_env": dict(self.export_env),
            "outputs": list(self.outputs), "missing": list(self.missing),
        }


def as_inner(root: Root, host) -> str:
    """A host path of rocforge's own (data dir, builds) as an inner path: a directory inside
    `--root` maps into it, one outside stays as it is."""
    if root.is_host:
        return inner_path(host)
    try:
        return root.inner_str(host)
    except ValueError:
        return inner_path(host)


def builds_dir(root: Root) -> str:
    """The builds directory as an inner path (a data dir inside `--root` maps into it)."""
    from rocforge_build import paths

    return as_inner(root, paths.builds_prefix_str())


def _rebase(value: str, recorded: str, prefix: str) -> str:
    """Paths under the prefix the build recorded, moved onto the prefix as found now."""
    if recorded and (value == recorded or value.startswith(recorded.rstrip("/") + "/")):
        return prefix + value[len(recorded.rstrip("/")):]
    return value


def read_manifest(prefix: str | os.PathLike[str]) -> dict | None:
    """The manifest of the build in `prefix`, checked (`checked_manifest`: a ConfigError names
    the field that is wrong); None when there is none, it is unreadable, not TOML or not a
    regular file (a FIFO under that name is refused, not waited on)."""
    path = os.path.join(prefix, MANIFEST)
    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            text = fh.read(MANIFEST_MAX + 1)  # bounded: a manifest is a few kB
        data = tomllib_loads(text) if len(text) <= MANIFEST_MAX else None
    except (OSError, ValueError):
        return None
    return None if data is None else checked_manifest(data, path)


def read(root: Root, prefix: str) -> Build | None:
    """The build at `prefix`, or None when it has no manifest; a manifest that is there but cannot
    be read, is not UTF-8 or not TOML is a ConfigError naming the file, as a schema error is (so
    `scan_builds` warns for it: a build never drops out of `env` and `doctor` unsaid)."""
    manifest = inner_join(prefix, MANIFEST)
    watch(root, manifest)
    host = root.host_str(manifest)
    try:
        with open_regular(host, "rb") as fh:
            text = fh.read(MANIFEST_MAX + 1)  # bounded: never a huge file held in memory
        if len(text) > MANIFEST_MAX:
            raise ConfigError(f"{host}: the manifest is larger than {MANIFEST_MAX >> 20} MiB, "
                              "not one rocforge wrote", MANIFEST_HINT)
        text = text.decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeError:
        raise ConfigError(f"{host}: the manifest is not UTF-8 text", MANIFEST_HINT) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{host}: the manifest cannot be read ({getattr(exc, 'strerror', None) or exc})",
                          MANIFEST_HINT) from None
    data = tomllib_loads(text)
    if data is None:
        raise ConfigError(f"{host}: the manifest is not TOML", MANIFEST_HINT)
    data = checked_manifest(data, host)
    recorded = data["prefix"] or ""
    exported, reasons = data["export_env"], data["export_env_reasons"]
    outputs = tuple(data["outputs"])
    missing = []
    for out in outputs:
        expected = inner_join(prefix, out)
        if any(c in out for c in "*?["):
            watch(root, os.path.dirname(expected))
            if not root.glob_str(prefix, out):
                missing.append(out)
        else:
            watch(root, expected)
            if not root.exists(expected):
                missing.append(out)
    lib = inner_join(prefix, "lib")
    watch(root, lib)
    bin_dir = inner_join(prefix, "bin")
    watch(root, bin_dir)
    source, tool = data["source"], data["toolchain"]
    return Build(
        prefix=prefix, recipe=data["recipe"]["name"], target=data["target"],
        backend=data["backend"], version=source.get("version") or None,
        commit=source.get("commit"), built_at=data.get("built_at"),
        export_env={str(k): _rebase(str(v), recorded, prefix) for k, v in exported.items()},
        export_reasons=dict(reasons),
        outputs=outputs, missing=tuple(missing), lib_dir=lib if root.is_dir(lib) else None,
        bin_dir=bin_dir if root.is_dir(bin_dir) else None,
        stamp=data["stamp"], toolchain=tool.get("kind") or "hip",
    )


def find_builds(root: Root) -> list[Build]:
    """Every build under the builds directory with a sound manifest, by prefix name."""
    return scan_builds(root)[0]


def scan_builds(root: Root) -> tuple[list[Build], list[str]]:
    """Every build under the builds directory, by prefix name, and one line for each prefix left
    out because its manifest breaks the schema: one damaged build must not take the environment
    of every other build (and every shell that evaluates `rocforge env`) down with it."""
    base = builds_dir(root)
    watch(root, base)
    if not root.is_dir(base):
        return [], []
    found, refused = [], []
    for name in sorted(root.listdir(base)):
        if name.startswith(".") or name.endswith((".rocforge-new", ".rocforge-old", ".rocforge-destdir",
                                                  ".rocforge-previous", ".deleting")):
            continue
        prefix = inner_join(base, name)
        if root.is_dir(prefix):
            try:
                build = read(root, prefix)
            except ConfigError as e:
                refused.append(f"{e.message}: build left out")
                continue
            if build is not None:
                found.append(build)
    return found, refused
