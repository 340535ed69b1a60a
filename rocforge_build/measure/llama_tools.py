"""A llama.cpp build prefix as the measuring code sees it: its programs, the options its tree
has (read from each program's --help, since option names differ by era) and its manifest."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from rocforge_build import paths, proc
from rocforge_build.errors import RocforgeError, UsageError, reason

# the programs measuring needs, built by verify's reference and by tune (llama-server: what serve runs)
MEASURE_TARGETS = ("llama-bench", "llama-perplexity", "llama-cli", "llama-server")
_OPTION_RE = re.compile(r"(?:^|[\s,])(--?[A-Za-z][\w-]*)")


class BuildNotUsable(UsageError):
    """The prefix is not a llama.cpp build, or lacks a program measuring needs."""


def options_from_help(text: str) -> frozenset[str]:
    """Every option spelled in a program's usage text (`-d, --n-depth <n>` gives -d and --n-depth)."""
    found = set()
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("-"):
            head = stripped.split("  ")[0]  # the option column, before the description
            found.update(m.group(1) for m in _OPTION_RE.finditer(" " + head))
    return frozenset(found)


@dataclass
class LlamaBuild:
    prefix: Path
    _help: dict = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, prefix: str | Path) -> LlamaBuild:
        p = Path(prefix).expanduser().resolve()
        if not p.is_dir():
            raise BuildNotUsable(f"build prefix {p} does not exist", "give the prefix `rocforge build` printed")
        return cls(p)

    def program(self, name: str) -> Path:
        path = self.prefix / "bin" / name
        if not path.is_file():
            raise BuildNotUsable(f"{self.prefix} has no bin/{name}",
                                 f"rebuild with it: rocforge build ... --cmake-target {name} (or without --cmake-target)")
        return path

    def has(self, name: str) -> bool:
        return (self.prefix / "bin" / name).is_file()

    @cached_property
    def manifest(self) -> dict:
        # from discover.builds, not forge.plan: bench would import the whole planner for it
        from rocforge_build.discover.builds import read_manifest

        return read_manifest(self.prefix) or {}

    @property
    def backend(self) -> str:
        return str(self.manifest.get("backend") or "unknown")

    @property
    def stamp(self) -> str | None:
        return self.manifest.get("stamp")

    @property
    def runtime_env(self) -> dict[str, str]:
        env = self.manifest.get("runtime_env") or {}
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    @property
    def gpu(self) -> bool:
        return self.backend not in ("cpu", "unknown")

    def label(self) -> str:
        return f"{self.prefix.name} ({self.backend})"

    def help_text(self, program: str) -> str:
        """`program --help`, cached on disk by the binary's path, size and mtime: starting a GPU
        build's program initialises its backend, which costs more than the answer is worth."""
        if program not in self._help:
            exe = self.program(program)
            st = exe.stat()
            key = hashlib.sha256(f"{exe}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
            cached = paths.cache_dir() / "llama-help" / key
            try:
                self._help[program] = cached.read_text(encoding="utf-8")
                return self._help[program]
            except OSError:
                pass
            try:
                out = proc.run([str(exe), "--help"], check=False, timeout=60, stderr=subprocess.PIPE)
            except (RocforgeError, OSError) as exc:
                raise BuildNotUsable(f"{self.prefix}/bin/{program} does not start: {reason(exc)}") from None
            self._help[program] = out.stdout + out.stderr
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(self._help[program], encoding="utf-8")
            except OSError:
                pass
        return self._help[program]

    def options(self, program: str) -> frozenset[str]:
        """The options `program --help` lists."""
        return options_from_help(self.help_text(program))

    def fa_args(self, program: str, on: bool) -> list[str]:
        """Flash attention on or off as `program` spells it: `-fa on|off` in newer trees, a bare
        `-fa` switch (on; off is its absence) in older ones, nothing when it has no -fa."""
        if "-fa" not in self.options(program):
            return []
        if "on|off" in self.help_text(program):
            return ["-fa", "on" if on else "off"]
        return ["-fa"] if on else []

    def provenance(self) -> dict:
        """The parts of the manifest a result row carries."""
        m = self.manifest
        src = m.get("source", {}) if isinstance(m.get("source"), dict) else {}
        flags = m.get("flags", {}) if isinstance(m.get("flags"), dict) else {}
        tool = m.get("toolchain", {}) if isinstance(m.get("toolchain"), dict) else {}
        return {
            "prefix": str(self.prefix), "stamp": self.stamp, "backend": self.backend,
            "recipe": (m.get("recipe") or {}).get("name"), "target": m.get("target"),
            "source": {k: src.get(k) for k in ("kind", "location", "version", "commit", "identity", "sha256") if src.get(k)},
            "flags": flags.get("configure", []), "patches": m.get("patches", []),
            "toolchain": tool, "built_at": m.get("built_at"),
        }
