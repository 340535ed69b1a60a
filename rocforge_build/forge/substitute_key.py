"""A build's substitute key: exactly the inputs that decide its bytes, so the same plan on two
machines gives the same key and a store can hand one machine's build to the other.

The stamp (forge/context.py) answers another question, "does this prefix hold this build", and so
also covers what is local: the prefix, the cmake and ninja files, rocforge's own version.  The key
leaves those out, and the work dir, `-j`, the compiler cache and the host name, which change how a
build runs but not what it makes.  Its canonical JSON is the OCI artifact's config blob, so the
key's digest is that blob's digest."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build.download import sha256_file
from rocforge_build.forge.toolchains import Toolchain, _version_of
from rocforge_build.proc import which

SCHEMA = "rocforge.substitute-key/1"
TAG_PREFIX = "rocforge-"


@dataclass(frozen=True)
class SubstituteKey:
    """The key document (`fields`, canonical JSON in `document`) and its sha256 `digest`."""

    fields: dict
    document: bytes
    digest: str  # "sha256:<hex>" of `document`

    @classmethod
    def of_fields(cls, fields: dict) -> SubstituteKey:
        doc = canonical_json(fields)
        return cls(fields, doc, "sha256:" + hashlib.sha256(doc).hexdigest())

    @property
    def tag(self) -> str:
        """The tag a store keeps the build under: `rocforge-<hex>` (a valid OCI tag)."""
        return TAG_PREFIX + self.digest.removeprefix("sha256:")

    @property
    def short(self) -> str:
        return self.digest.removeprefix("sha256:")[:16]

    def to_json(self) -> dict:
        return {"digest": self.digest, "tag": self.tag, "fields": self.fields}

    def mismatch(self, other: dict) -> str | None:
        """The first field where a key document `other` (from a store) differs from this one,
        said for people ("target gfx1100 here, gfx1151 in the store"), or None."""
        for name in sorted(set(self.fields) | set(other)):
            if self.fields.get(name) != other.get(name):
                return (f"{name} {_brief(self.fields.get(name))} here, "
                        f"{_brief(other.get(name))} in the store")
        return None


def canonical_json(doc: object) -> bytes:
    """Sorted keys, no spaces, ASCII: one document, one digest, on every machine."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _brief(value) -> str:
    text = canonical_json(value).decode() if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


# what a user's environment changes in the compiled bytes (a subset of the stamp's BUILD_ENV:
# paths that only say where to find the same files are left to the toolchain's identity)
BYTES_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "HIPFLAGS")


def key_fields(*, recipe, source_kind: str, identity: str, target: str, backend: str,
               build_targets, toolchain: Toolchain, environ, cpu_flags, dependencies: list[dict]) -> dict:
    """The key document's fields: what decides the bytes, each by content or version."""
    patches_dir = recipe.patches_dir
    return {
        "schema": SCHEMA,
        "recipe": {"name": recipe.name, "sha256": hashlib.sha256(recipe.text.encode()).hexdigest()},
        "patches": {p.name: sha256_file(p) for p in sorted(patches_dir.glob("*.patch"))}
        if patches_dir.is_dir() else {},
        "source": {"kind": source_kind, "identity": identity},
        "target": target or "",
        "backend": backend,
        "build_targets": sorted(build_targets),
        "toolchain": toolchain_identity(toolchain, environ),
        "glibc": glibc_floor(),
        "machine": platform.machine(),
        # ggml's CPU code is compiled with -march=native (GGML_NATIVE): the host CPU's features
        # decide its instructions, so only a machine with the same features may take the bytes
        "cpu_flags_sha256": hashlib.sha256(" ".join(sorted(cpu_flags or ())).encode()).hexdigest(),
        "environ": {k: environ[k] for k in BYTES_ENV if environ.get(k)},
        "dependencies": dependencies,
    }


def toolchain_identity(toolchain: Toolchain, environ) -> dict:
    """The compiler and ROCm that decide the bytes, by version and content, never by path."""
    out: dict = {"kind": toolchain.kind}
    if toolchain.kind == "hip":
        out["rocm_version"] = toolchain.rocm_version or ""
        out["hip_compiler"] = _version_in(toolchain.info.get("hip_compiler", ""))
        out["rocm_digest"] = rocm_digest(Path(toolchain.env.get("ROCM_PATH", "") or "/nonexistent"))
    elif toolchain.kind == "vulkan":
        out["glslc"] = _version_in(toolchain.info.get("glslc", ""))
        out["vulkan_headers"] = _version_in(toolchain.info.get("vulkan_headers", ""))
    path = environ.get("PATH")
    for var, default in (("CC", "cc"), ("CXX", "c++")):
        exe = which(environ.get(var) or default, toolchain.path or path)
        out[var.lower()] = _version_of(exe) or "" if exe else ""
    return out


def _version_in(info: str) -> str:
    """`/opt/rocm/bin/clang (clang version 20.0.0git ...)` -> the part in parentheses."""
    start = info.find(" (")
    return info[start + 2:-1] if start >= 0 and info.endswith(")") else info


def rocm_digest(rocm: Path) -> str:
    """A digest of what a ROCm install compiles with, by content: its version files and the
    device libraries' names and sizes (the amdgcn bitcode that becomes the kernels' code)."""
    h = hashlib.sha256()
    for rel in (".info/version", ".info/version-dev", "share/doc/rocm/version"):
        p = rocm / rel
        if p.is_file() and p.stat().st_size < 4096:
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    for bitcode in (rocm / "amdgcn" / "bitcode", rocm / "lib" / "llvm" / "amdgcn" / "bitcode"):
        if bitcode.is_dir():
            for entry in sorted(os.scandir(bitcode), key=lambda e: e.name):
                if entry.name.endswith(".bc") and entry.is_file(follow_symlinks=False):
                    h.update(f"{entry.name}:{entry.stat().st_size}\n".encode())
    return h.hexdigest()


def glibc_floor() -> str:
    """The C library the build links against: a build runs only where the glibc is as new."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ""



@dataclass(frozen=True)
class SubstitutePolicy:
    """Where and how a build looks for a substitute before it compiles: the configuration's
    `substitute.*` keys and the request's --no-substitutes / --substitute-only, read once."""

    mode: str  # "auto" | "off" | "only"
    stores: tuple[str, ...]
    trusted_keys: tuple[str, ...]
    verify: str  # "quick" | "full" | "none"
    verify_model: str
    report_failures: bool
    signing_key: str
    max_layer_bytes: int
    timeout: float

    @property
    def asks(self) -> bool:
        return self.mode != "off" and bool(self.stores)

    def to_json(self) -> dict:
        return {"mode": self.mode, "stores": list(self.stores), "verify": self.verify,
                "verify_model": self.verify_model, "trusted_keys": len(self.trusted_keys)}

    @classmethod
    def from_settings(cls, mode: str, settings: Mapping[str, object]) -> SubstitutePolicy:
        """The policy of a request: its mode, and the `substitute.*` keys of its settings snapshot."""
        cfg = settings["substitute"]
        return cls(mode, tuple(cfg["stores"]), tuple(cfg["trusted_keys"]), cfg["verify"],
                   cfg["verify_model"], bool(cfg["report_failures"]), cfg["signing_key"],
                   int(cfg["max_layer_bytes"]), float(cfg["timeout"]))


@dataclass(frozen=True)
class SubstituteOutcome:
    """What asking the stores came to: a build `staged` (checked, verified here, in the staging
    tree with its manifest), or why not (one line per store asked, in order)."""

    staged: bool
    why: str = ""
    tried: tuple[str, ...] = ()
    record: dict = field(default_factory=dict)  # what the manifest records of where it came from
    advisory: str = ""  # a trusted advisory names this build bad: a compile makes the same bytes
    # what records the verify here for the installed build (results row, the verdict `env`
    # reads); the pipeline runs it after the swap, so it reads the new build, never the old one
    installed: Callable[[], None] | None = None
