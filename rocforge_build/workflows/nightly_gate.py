"""`rocforge nightly install --gate`: a new nightly becomes `current` only when every rocforge
build made against the current one still passes its gates when rebuilt against the new one.

The new nightly is installed beside the others (`install(..., switch_current=False)`).  Each
build whose manifest records the current nightly as its ROCm (`toolchain.rocm_path`, through the
`current` link or the version directory it points at) is upgraded with `ROCM_PATH` set to the
new tree (`forge.upgrade`: smoke test, `--run`, `--model` verify and bench).  The first refusal
stops the round: the builds already upgraded in it are rolled back (`upgrade.rollback`: the
build swapped back byte for byte), `current` stays, and the report names the build and the gate.
When all pass, `current` is switched (`install.use`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.workflows import upgrade


@dataclass
class Round:
    new: str  # the version directory installed
    previous: str | None  # what `current` pointed at
    outcomes: list[upgrade.Outcome] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    switched: bool = False

    @property
    def failed(self) -> upgrade.Outcome | None:
        return next((o for o in self.outcomes if not o.passed), None)

    def to_json(self) -> dict:
        bad = self.failed
        gate = next((g for g in bad.gates if g.verdict != "pass"), None) if bad else None
        return {"installed": self.new, "previous": self.previous, "switched": self.switched,
                "builds": [o.to_json() for o in self.outcomes],
                "failed_build": str(bad.prefix) if bad else None,
                "failed_gate": gate.name if gate else None, "rolled_back": self.rolled_back}


def builds_against(rocm: Path) -> list[Path]:
    """rocforge builds in the builds directory whose manifest names `rocm` as their ROCm."""
    base = paths.builds_prefix()
    if not base.is_dir():
        return []
    wanted = os.path.realpath(rocm)
    found = []
    for prefix in sorted(base.iterdir()):
        if prefix.name.startswith(".") or ".rocforge-" in prefix.name or prefix.is_symlink() \
                or not prefix.is_dir():
            continue
        m = read_manifest(prefix)
        tc = m.get("toolchain") if isinstance(m, dict) else None
        used = tc.get("rocm_path") if isinstance(tc, dict) else None
        if isinstance(used, str) and used and os.path.realpath(used) == wanted:
            found.append(prefix)
    return found


def gated_round(prefix: Path, new: Path, previous: str | None, rootfs, *,
                run: list[str] | None, model: str | None, pct: float,
                root_arg: str | None, quiet: bool) -> Round:
    """Upgrade every build made against `<prefix>/<previous>` to the tree `new`; switch `current`
    only if all pass, else undo the round."""
    from rocforge_build.nightly import install

    rnd = Round(new.name, previous)
    targets = builds_against(prefix / previous) if previous else []
    environ = {**os.environ, "ROCM_PATH": str(new)}
    for build in targets:
        path, manifest = upgrade.existing_build(build)
        req = upgrade.request_for(path, manifest, environ=environ)
        out = upgrade.upgrade(path, req, rootfs, run=run, model=model, pct=pct,
                              root_arg=root_arg, quiet=quiet)
        rnd.outcomes.append(out)
        if not out.passed:
            break
    if rnd.failed is not None:
        for out in rnd.outcomes:
            if out.status == "upgraded":
                upgrade.rollback(out.prefix)
                rnd.rolled_back.append(str(out.prefix))
        return rnd
    install.use(prefix, new.name)
    rnd.switched = True
    return rnd
