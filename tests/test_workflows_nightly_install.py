"""workflows/nightly_install.py: the choice knows the packaged known-bad table and the
trusted stores' advisories, and the install switches `current` at once
without --gate and only through the gate's round with it.  The round against real builds is in
tests/e2e/test_bisect_nightlies.py; the command's output in tests/e2e/test_nightly_install.py."""

from __future__ import annotations

import os

from therock_tarballs import make_tarball

from rocforge_build import config
from rocforge_build.discover import known_bad
from rocforge_build.nightly import listing
from rocforge_build.nightly.selection import Listings, Wanted
from rocforge_build.rootfs import Root
from rocforge_build.workflows.nightly_install import GateAsked, InstallAsked, choose, install_chosen

GOOD = "7.14.0a20260601"
BAD = next(b for b in known_bad.table() if "gfx1151" in b.targets).first  # the packaged entry


def mirror(tmp_path, *versions: str) -> tuple[str, ...]:
    folder = tmp_path / "mirror"
    for v in versions:
        archive = make_tarball(tmp_path / "work", "gfx1151", v, ["gfx1151"])
        folder.mkdir(exist_ok=True)
        os.replace(archive, folder / archive.name)
    return (folder.as_uri() + "/",)


def asked(index, *, gate: GateAsked | None = None) -> InstallAsked:
    return InstallAsked(listings=Listings(index), wanted=Wanted(groups=tuple(listing.groups_for("gfx1151")),
                                                                target="gfx1151"),
                        progress=False, gate=gate)


def test_the_choice_leaves_out_the_packaged_known_bad_nightly(tmp_path):
    warned = []
    chosen = choose(asked(mirror(tmp_path, GOOD, BAD)), config.effective(), warned.append)
    assert chosen.top.version == GOOD
    assert chosen.skipped_known_bad == (known_bad.find(BAD, "gfx1151").describe(BAD),)
    assert warned == []  # one source, no store configured: nothing to warn about


def test_the_choice_leaves_out_what_a_trusted_stores_advisory_names(tmp_path):
    # the stores' advisories joined to the packaged table: a nightly no table entry covers is
    # left out because a store's signed advisory names it, and the reason says whose
    from rocforge_build.substitute import advisories, signing
    from rocforge_build.substitute.stores import open_store

    advised = "7.14.0a20260615"
    pair = signing.generate()
    store = f"file://{tmp_path / 'store'}"
    with open_store(store, timeout=5) as opened:
        advisories.publish(opened, advisories.make_document(advised, advised, ["gfx1151"],
                                                            "hangs in rocBLAS init", "test"), pair)
    cfg = {**config.effective(), "substitute": {"stores": [store], "timeout": 5.0,
                                                "trusted_keys": [pair.public.text]}}
    warned = []
    chosen = choose(asked(mirror(tmp_path, GOOD, advised)), cfg, warned.append)
    assert chosen.top.version == GOOD and warned == []
    assert len(chosen.skipped_known_bad) == 1
    assert chosen.skipped_known_bad[0].startswith(f"{advised} is a known-bad nightly")
    assert "hangs in rocBLAS init" in chosen.skipped_known_bad[0] and "advisory signed by" in chosen.reason
    assert choose(asked(mirror(tmp_path, GOOD, advised)), config.effective(), print).top.version == advised


def test_without_gate_current_points_at_the_install_at_once(tmp_path):
    cfg = config.effective()
    a = asked(mirror(tmp_path, GOOD))
    notes = []
    done = install_chosen(a, choose(a, cfg, print), tmp_path / "rocm", cfg, notes.append)
    assert done.round is None and done.result.previous is None
    assert os.readlink(tmp_path / "rocm" / "current") == done.result.path.name
    again = install_chosen(a, choose(a, cfg, print), tmp_path / "rocm", cfg, notes.append)
    assert again.result.reused and notes == [f"{done.result.path.name} was already installed; "
                                             "`current` points at it"]


def test_with_gate_the_round_switches_current_not_the_install(tmp_path):
    # the install goes in beside the others; with no build made against the old nightly the
    # round has nothing to gate and switches `current` itself, naming what it pointed at
    cfg = config.effective()
    first = asked(mirror(tmp_path, GOOD))
    old = install_chosen(first, choose(first, cfg, print), tmp_path / "rocm", cfg, print)
    gate = GateAsked(run=("/bin/false",), model=None, pct=5.0, rootfs=Root("/"), root_arg=None,
                     quiet=True)
    newer = "7.14.0a20260615"
    gated = asked(mirror(tmp_path, GOOD, newer), gate=gate)
    done = install_chosen(gated, choose(gated, cfg, print), tmp_path / "rocm", cfg, print)
    assert done.round is not None and done.round.outcomes == []
    assert (done.round.previous, done.round.new) == (old.result.path.name, done.result.path.name)
    assert done.round.switched and os.readlink(tmp_path / "rocm" / "current") == done.result.path.name
