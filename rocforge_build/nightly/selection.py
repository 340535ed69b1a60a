"""Which nightly `rocforge nightly install` takes: the listings read from the sources asked for,
and the choice among them with the known-bad nightlies left out.

Without `--version` the newest nightly serving the target that nothing known-bad covers is
chosen, and the known-bad ones newer than it are named in the reason; a pinned `--version` is
taken as asked, with the known-bad entry that covers it said as a warning.  What counts as
known-bad is handed in (`known_bad`): the packaged table joined to the configured stores'
advisories is workflows/nightly_install.py's, since this room reads no store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rocforge_build.discover.known_bad import KnownBad
from rocforge_build.discover.rocm_version import version_key
from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.nightly import listing
from rocforge_build.nightly.listing import Nightly

# (version, target, family) -> the known-bad entry covering it, or None
KnownBadFinder = Callable[[str, "str | None", "str | None"], "KnownBad | None"]


@dataclass(frozen=True)
class Listings:
    """Where the nightlies are listed: the `--index` URLs (a CDN index page, an S3 bucket URL, a
    file:// mirror), else the configured sources; for `platform` (None: `nightly.platform`)."""
    index: tuple[str, ...] = ()
    platform: str | None = None


def read(listings: Listings, cfg: dict, warn: Callable[[str], None]) -> list[Nightly]:
    """Every nightly the sources list.  Of several sources, one that cannot be read is skipped
    with one `warn` line each (docs/concepts/nightlies.md); all of them failing is one error."""
    sources = ([listing.source_for_url(u) for u in listings.index] if listings.index
               else listing.configured_sources(cfg))
    errors: list[str] = []
    try:
        return listing.list_nightlies(
            sources, platform=listings.platform or cfg["nightly"]["platform"],
            skip_variants=cfg["nightly"]["skip_variants"], errors=errors)
    except NetworkError as exc:
        if len(sources) > 1:  # every source failed: each is named above, summed up in one line
            raise NetworkError(f"none of the {len(sources)} nightly sources could be read "
                               "(each is named above)", exc.hint) from exc
        raise
    finally:
        if len(sources) > 1:
            for e in errors:
                warn(f"source skipped: {e}")


@dataclass(frozen=True)
class Wanted:
    """The nightly asked for: the target (None with `--family`) and the groups serving it in
    order of preference, the version (`latest`, or one pinned) and `--layer`'s base (None: one
    layer; "auto": the target's fallback group)."""
    groups: tuple[str, ...]
    target: str | None = None
    version: str = "latest"
    layer: str | None = None

    @property
    def latest(self) -> bool:
        return self.version in ("", "latest")


@dataclass(frozen=True)
class Selection:
    """The layers to install (base first), why they were chosen, the known-bad nightlies left
    out (each described), and the known-bad entry covering the chosen one (only a pinned
    version can be one)."""
    layers: tuple[Nightly, ...]
    reason: str
    skipped_known_bad: tuple[str, ...] = ()
    pinned_known_bad: str | None = None

    @property
    def top(self) -> Nightly:
        return self.layers[-1]


def select(entries: list[Nightly], wanted: Wanted, known_bad: KnownBadFinder) -> Selection:
    """The nightly to install from `entries`: without a pinned version, none that `known_bad`
    covers for the target (all of them covered is an error naming each)."""
    groups = list(wanted.groups)
    skipped: dict[str, str] = {}
    if wanted.latest:  # a pinned version is installed as asked
        keep = []
        for e in entries:
            bad = known_bad(e.version, wanted.target, e.family) if e.family in groups else None
            if bad is None:
                keep.append(e)
            else:
                skipped.setdefault(e.version, bad.describe(e.version))
        if skipped and not any(e.family in groups for e in keep):
            raise UsageError("every nightly published for this target is known-bad: "
                             + "; ".join(skipped.values()),
                             "install one anyway with --version VERSION")
        entries = keep
    layers, reason = listing.layer_plan(entries, wanted.target, groups, wanted.version, wanted.layer)
    newer = [why for v, why in skipped.items() if version_key(v) > version_key(layers[-1].version)]
    if newer:
        reason += "; skipped " + "; ".join(newer)
    pinned = known_bad(layers[-1].version, wanted.target, layers[-1].family)
    return Selection(tuple(layers), reason, tuple(skipped.values()),
                     pinned.describe(layers[-1].version) if pinned is not None else None)
