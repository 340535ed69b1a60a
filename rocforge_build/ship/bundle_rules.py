"""What a bundle leaves to the system and which kernel files it keeps: the rules of
`data/bundle.toml` (each with its reason), and the GPU targets named in kernel file names, so a
kernel directory is trimmed to the target's own files (plus those of the target table's
`override_with` target when the target's own are missing: the choice `rocforge env` makes with
HSA_OVERRIDE_GFX_VERSION).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.discover.resolver import Decision
from rocforge_build.errors import (
    ConfigError,
)
from rocforge_build.resources import load_toml, package_data

_GFX_TOKEN = re.compile(r"(?<![0-9A-Za-z])gfx([0-9]+[0-9a-f]*)(X|-generic)?(?![0-9a-z])")

# -- rules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    patterns: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Rules:
    system: tuple[Rule, ...]
    kernels: tuple[Rule, ...]

    def system_rule(self, name: str) -> Rule | None:
        return next((r for r in self.system if any(fnmatch.fnmatch(name, p) for p in r.patterns)), None)

    def kernel_rule(self, rel_dir: str) -> Rule | None:
        return next((r for r in self.kernels if any(fnmatch.fnmatch(rel_dir, p) for p in r.patterns)), None)


def load_rules(path: Path | None = None) -> Rules:
    path = path or package_data("bundle.toml")
    data = load_toml(path, "bundle rules")

    def rules(kind: str, key: str) -> tuple[Rule, ...]:
        out = []
        for i, raw in enumerate(data.get(kind, [])):
            if set(raw) != {key, "why"}:
                raise ConfigError(f"{path}: [[{kind}]] {i + 1} needs exactly `{key}` and `why`")
            pats = raw[key] if isinstance(raw[key], list) else [raw[key]]
            out.append(Rule(tuple(pats), raw["why"]))
        return tuple(out)

    return Rules(rules("system", "library"), rules("kernels", "dir"))


# -- GPU targets in kernel file names -------------------------------------------------------------
def gfx_tokens(name: str) -> list[str]:
    """The GPU targets a kernel file name names: `gfx1100`, a family `gfx110X`, `gfx11-generic`
    (an `-xnack+`/`:sramecc-` feature suffix belongs to the target before it)."""
    return [f"gfx{m.group(1)}{m.group(2) or ''}" for m in _GFX_TOKEN.finditer(name)]


def token_serves(token: str, target: str) -> bool:
    """Whether a file named for `token` holds code the GPU `target` runs."""
    from rocforge_build.discover import targets

    if token == target:
        return True
    if token.endswith("X"):  # a TheRock family (gfx110X: gfx1100..gfx110f)
        return target.startswith(token[:-1]) and len(target) == len(token)
    if token.endswith("-generic") and targets.known(target):
        return targets.get_target(target).generic == token
    return False


@dataclass(frozen=True)
class Trim:
    """The decision for one kernel directory."""

    dir: str
    keep: tuple[str, ...]  # file names kept
    drop: tuple[str, ...]
    served: tuple[str, ...]  # the targets whose files are kept
    reason: str

    def to_json(self) -> dict:
        return {"dir": self.dir, "kept": len(self.keep), "dropped": len(self.drop),
                "targets": list(self.served), "reason": self.reason}


def trim_names(names: list[str], keep_targets: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Split a kernel directory's file names: files naming no target are shared (kept); a file
    naming targets is kept when one of them serves one of `keep_targets`."""
    keep, drop = [], []
    for n in sorted(names):
        toks = gfx_tokens(n)
        if not toks or any(token_serves(t, k) for t in toks for k in keep_targets):
            keep.append(n)
        else:
            drop.append(n)
    return keep, drop


def has_files_for(names: list[str], target: str) -> bool:
    return any(token_serves(t, target) for n in names for t in gfx_tokens(n))


def kernel_targets(target: str, dirs: dict[str, list[str]]) -> tuple[tuple[str, ...], Decision | None]:
    """Which targets' kernel files a bundle for `target` keeps: its own, plus its override
    fallback's when some kernel directory has none of its own but the fallback's (then the
    process runs with HSA_OVERRIDE_GFX_VERSION, and every library must find the fallback's)."""
    from rocforge_build.discover import targets

    tgt = targets.get_target(target)
    lacking = sorted(d for d, names in dirs.items() if names and not has_files_for(names, tgt.name))
    if not lacking:
        return (tgt.name,), None
    fallback = tgt.override_with
    if fallback and any(has_files_for(dirs[d], fallback) for d in lacking):
        over = targets.get_target(fallback)
        why = (f"{', '.join(lacking)} has no {tgt.name} files but {fallback}'s, the target table's "
               f"override_with: kept both, and the launcher sets HSA_OVERRIDE_GFX_VERSION="
               f"{over.hsa_version} (as `rocforge env` does when the libraries lack a GPU's kernels)")
        return (tgt.name, fallback), Decision("HSA_OVERRIDE_GFX_VERSION", over.hsa_version, why)
    return (tgt.name,), None
