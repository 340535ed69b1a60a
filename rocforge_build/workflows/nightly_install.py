"""`rocforge nightly install`: the nightly chosen with the known-bad ones left out, installed, and
with `--gate` made `current` only after the builds made against the old one pass on it.

Known-bad is the packaged table joined to the configured stores' trusted advisories
(`substitute.advisories`), which is why the choice is made here and not in nightly/; the gate
round is workflows/nightly_gate.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.nightly import install, selection
from rocforge_build.rootfs import Root
from rocforge_build.workflows import nightly_gate


@dataclass(frozen=True)
class GateAsked:
    """`--gate`'s own flags, checked: `--run`'s words, `--model`'s real path, `--threshold`'s
    percent; the root the builds are tested in (`root_arg`: `--root` as given, None on the
    host) and whether the round's progress is kept quiet (`--json`)."""
    run: tuple[str, ...] | None
    model: str | None
    pct: float
    rootfs: Root
    root_arg: str | None
    quiet: bool


@dataclass(frozen=True)
class InstallAsked:
    """One `nightly install` with every flag checked: where the listings are read, the nightly
    wanted, the expected sha256 of the top tarball, `--force`, whether a progress bar is drawn,
    and `--gate` (None: `current` is switched at once)."""
    listings: selection.Listings
    wanted: selection.Wanted
    sha256: str | None = None
    force: bool = False
    progress: bool = True
    gate: GateAsked | None = None


def choose(asked: InstallAsked, cfg: dict, warn: Callable[[str], None]) -> selection.Selection:
    """The nightly to install: the listings read (a source skipped is one `warn` line), then
    chosen with what the packaged table and the stores' advisories know to be bad (a store's
    problem is one `warn` line)."""
    from rocforge_build.substitute import advisories

    entries = selection.read(asked.listings, cfg, warn)
    known_bad = advisories.known_bad_finder(cfg.get("substitute") or {}, warn)
    return selection.select(entries, asked.wanted, known_bad)


@dataclass(frozen=True)
class Installation:
    """What an install did, and with `--gate` the round that decided `current`."""
    result: install.InstallResult
    round: nightly_gate.Round | None = None


def install_chosen(asked: InstallAsked, chosen: selection.Selection, prefix: Path, cfg: dict,
                   note: Callable[[str], None]) -> Installation:
    """The chosen layers installed into `prefix` (`note` hears what the install says); without
    `--gate` `current` points at them, with it only when the round passes."""
    result = install.install(list(chosen.layers), prefix, cfg=cfg, progress=asked.progress,
                             sha256=asked.sha256, force=asked.force,
                             switch_current=asked.gate is None)
    for line in result.notes:
        note(line)
    gate = asked.gate
    if gate is None:
        return Installation(result)
    rnd = nightly_gate.gated_round(prefix, result.path, result.previous, gate.rootfs,
                                   run=list(gate.run) if gate.run is not None else None,
                                   model=gate.model, pct=gate.pct, root_arg=gate.root_arg,
                                   quiet=gate.quiet)
    return Installation(result, rnd)
