"""The nightly axis of `rocforge bisect --nightlies`: each step's ROCm is one TheRock nightly.

A version already installed in the nightly prefix (`rocforge nightly installed`) is used as it is;
any other is looked up in the configured sources before the search starts (a version no source
serves for the target is refused then, not after an hour of builds) and installed beside the
others when a step first needs it, the way `nightly install --gate` installs: `current` is never
moved, so a bisect leaves the user's environment as it was.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.nightly import install, listing


@dataclass
class Nightlies:
    prefix: Path
    target: str
    cfg: dict
    installed: dict[str, Path] = field(default_factory=dict)  # version -> tree
    to_install: dict[str, list[listing.Nightly]] = field(default_factory=dict)  # version -> layers

    def tree(self, version: str) -> Path:
        """The version's tree, installed beside the others now if it is not yet."""
        if version not in self.installed:
            result = install.install(self.to_install[version], self.prefix, cfg=self.cfg,
                                     progress=False, switch_current=False,
                                     log=lambda m: sys.stderr.write(f"rocforge: {m}\n"))
            self.installed[version] = result.path
        return self.installed[version]

    def describe(self, version: str) -> str:
        if version in self.installed:
            return f"TheRock {version} ({self.installed[version].name})"
        return f"TheRock {version} ({self.to_install[version][-1].name})"


def plan(versions: list[str], target: str, cfg: dict, prefix: Path) -> Nightlies:
    """Where each version comes from: installed, or the tarball to install; every version is
    checked here, before anything is built."""
    out = Nightlies(prefix, target, cfg)
    have = {i.version: i for i in install.installed(prefix) if not i.problem} \
        if prefix.is_dir() else {}
    missing = [v for v in versions if v not in have]
    for v in versions:
        if v in have:
            out.installed[v] = have[v].path
    if not missing:
        return out
    groups = listing.groups_for(target=target)
    try:
        entries = listing.list_nightlies(listing.configured_sources(cfg),
                                         platform=cfg["nightly"]["platform"],
                                         skip_variants=cfg["nightly"]["skip_variants"])
    except NetworkError as exc:
        raise NetworkError(f"--nightlies {', '.join(missing)} are not installed and the nightly "
                           f"listing could not be read: {exc.message}", exc.hint) from exc
    for v in missing:
        try:
            layers, _why = listing.layer_plan(entries, target, groups, v, None)
        except UsageError:
            raise UsageError(f"--nightlies {v}: no TheRock nightly {v} for {target} is installed "
                             f"in {prefix} or published by the configured sources",
                             f"see `rocforge nightly list --target {target}`") from None
        out.to_install[v] = layers
    return out
