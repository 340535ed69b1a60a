"""forge/plan.py (and plan_text.py, the plan printed): `make_plan` of the fixture recipe on a read
tree, each rule decided from the target and the tree's own version and the install step chosen by
the request; and each reason's evidence beside it: `--dry-run --json` as an `evidence` list next to
the `reason` (options, outputs, patches, dependencies), `backend_evidence` next to
`backend_reason` and `env_evidence` next to `env_reasons`; the printed plan on an indented
`evidence:` line under the reason, one source or figure a line.  The plans of every packaged
recipe, byte for byte, are test_plans_unchanged.py's; plans of a source not yet fetched are
attack/test_trust_firsthour.py's."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from buildfixtures import RECIPE as FIXTURE_RECIPE
from buildfixtures import project_copy
from test_forge_recipes import MINIMAL
from test_forge_recipes_evidence import RELEASE_OPTION

from rocforge_build.cli import main
from rocforge_build.forge.locations import staging_dir
from rocforge_build.forge.plan import InstallStep, Plan, Request, plan_for
from rocforge_build.rootfs import Root

RECIPE = MINIMAL + """
[[default]]
backend = "cpu"
reason = "the host compilers build it everywhere"
evidence = ["owner/demo #7: the GPU path is broken on this tree"]
""" + RELEASE_OPTION + """
[[option]]
name = "CMAKE_INSTALL_LIBDIR"
value = "lib"
declared = false
reason = "one library directory everywhere"

[[env]]
name = "DEMO_LEVEL"
value = "3"
reason = "the level the project tunes for"
evidence = ["owner/demo PR #30: level 3 measured fastest"]

[[patch]]
evidence = ["owner/demo #41: the note is missing upstream"]
file = "add-note.patch"
reason = "the project needs the note file"

[[output]]
evidence = [
    "owner/demo README: fixture-hello is the entry point",
]
reason = "the program users run"
path = "bin/fixture-hello"
"""

PATCH = """diff --git a/ADDED-NOTE.txt b/ADDED-NOTE.txt
new file mode 100644
--- /dev/null
+++ b/ADDED-NOTE.txt
@@ -0,0 +1 @@
+a note
"""


def _dry_run(tmp_path: Path, *flags: str) -> str:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "recipes" / "demo.toml").write_text(RECIPE)
    (tmp_path / "patches" / "demo" / "add-note.patch").write_text(PATCH)
    src = project_copy(tmp_path / "src")
    (tmp_path / "root").mkdir()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--root", str(tmp_path / "root"), "build", str(tmp_path / "recipes" / "demo.toml"),
                     "--source", str(src), "--target", "gfx1100", "--dry-run", *flags])
    assert code == 0
    return out.getvalue()


def test_the_json_plan_carries_each_rules_evidence_beside_its_reason(tmp_path):
    plan = json.loads(_dry_run(tmp_path, "--json"))
    assert (plan["backend"], plan["backend_reason"]) == ("cpu", "the host compilers build it everywhere")
    assert plan["backend_evidence"] == ["owner/demo #7: the GPU path is broken on this tree"]
    options = {o["name"]: o for o in plan["options"]}
    assert options["CMAKE_BUILD_TYPE"]["reason"] == "debug builds are unusably slow"
    assert options["CMAKE_BUILD_TYPE"]["evidence"] == ["owner/demo #12: a debug build 10x slower",
                                                       "owner/other docs/build.md builds Release"]
    assert "evidence" not in options["CMAKE_INSTALL_LIBDIR"]  # a rule without any shows none
    assert plan["env_reasons"]["DEMO_LEVEL"] == "the level the project tunes for"
    assert plan["env_evidence"] == {"DEMO_LEVEL": ["owner/demo PR #30: level 3 measured fastest"]}
    (patch,) = plan["patches"]
    assert (patch["name"], patch["status"]) == ("add-note.patch", "would apply")
    assert patch["evidence"] == ["owner/demo #41: the note is missing upstream"]
    (output,) = plan["outputs"]
    assert output["evidence"] == ["owner/demo README: fixture-hello is the entry point"]


def test_the_printed_plan_shows_the_evidence_under_each_reason(tmp_path):
    lines = _dry_run(tmp_path).splitlines()
    at = lines.index("  -DCMAKE_BUILD_TYPE=Release")
    assert lines[at + 1:at + 4] == [
        "      debug builds are unusably slow [always]",
        "      evidence: owner/demo #12: a debug build 10x slower",
        "                owner/other docs/build.md builds Release",
    ]
    at = lines.index("  -DCMAKE_INSTALL_LIBDIR=lib")
    assert not lines[at + 2].lstrip().startswith("evidence:")  # a rule without any shows none
    at = lines.index("backend  cpu — the host compilers build it everywhere")
    assert lines[at + 1] == "  evidence: owner/demo #7: the GPU path is broken on this tree"
    at = lines.index("  DEMO_LEVEL=3  (the level the project tunes for)")
    assert lines[at + 1] == "      evidence: owner/demo PR #30: level 3 measured fastest"
    at = next(i for i, line in enumerate(lines) if line.startswith("  add-note.patch: would apply"))
    assert lines[at + 1] == "    evidence: owner/demo #41: the note is missing upstream"
    at = next(i for i, line in enumerate(lines) if line.startswith("expects    "))
    assert lines[at + 1] == "  evidence: owner/demo README: fixture-hello is the entry point"


def _fixture_plan(tmp_path: Path, target: str, **request) -> Plan:
    src = tmp_path / "src"
    if not src.exists():
        project_copy(src)
    (tmp_path / "root" / "usr" / "include").mkdir(parents=True, exist_ok=True)
    req = Request(recipe=str(FIXTURE_RECIPE), target=target, source=str(src),
                  prefix=str(tmp_path / "p"), jobs=2, **request)
    return plan_for(req, Root(tmp_path / "root"), fetch=False)


def test_a_read_trees_plan_decides_each_rule_from_the_target_and_the_trees_version(tmp_path):
    """tests/data/fixture-project/VERSION says 1.2.0; the fixture recipe's FIXTURE_LOUD holds for
    `gfx11*` targets of a source `>=1.0` (so for gfx1100, not gfx1030), the accel backend only for
    gfx1151 trees declaring FIXTURE_ACCEL (this one does not: cpu, "everything else").  A read
    tree leaves nothing for after the fetch; the prefix is the one asked for."""
    assert (project_copy(tmp_path / "src") / "VERSION").read_text().split()[0] == "1.2.0"
    loud, quiet = _fixture_plan(tmp_path, "gfx1100"), _fixture_plan(tmp_path, "gfx1030")
    assert loud.source_version == "1.2.0"
    assert "-DFIXTURE_LOUD=ON" in loud.configure  # a TOML true is CMake's ON
    assert not any(a.startswith("-DFIXTURE_LOUD=") for a in quiet.configure)
    assert (loud.backend, loud.backend_reason) == ("cpu", "everything else")
    assert loud.after_fetch == () and loud.dependencies == []
    assert loud.prefix == tmp_path / "p"
    assert loud.configure[:7] == ["cmake", "-S", str(loud.src_dir), "-B", str(loud.build_dir), "-G", "Ninja"]
    assert f"-DCMAKE_INSTALL_PREFIX={tmp_path / 'p'}" in loud.configure
    assert loud.build[:4] == ["ninja", "-C", str(loud.build_dir), "-j"]


def test_the_install_step_goes_to_the_staging_sibling_and_follows_the_cmake_targets(tmp_path):
    """Whole builds install with `cmake --install` into the prefix's staging sibling (never the
    prefix: the swap puts it there); a build of chosen CMake targets copies their artifacts."""
    whole = _fixture_plan(tmp_path, "gfx1030")
    staging = staging_dir(tmp_path / "p")
    assert staging.parent == (tmp_path / "p").parent and staging != tmp_path / "p"
    assert whole.install_step == InstallStep("cmake", staging, ("cmake", "--install", str(whole.build_dir),
                                                               "--prefix", str(staging)))
    some = _fixture_plan(tmp_path, "gfx1030", build_targets=("fixture-hello",))
    assert some.install_step.how == "artifacts" and some.install_step.cmake_targets == ("fixture-hello",)
    assert some.build[-1] == "fixture-hello" and some.install == [
        "(copy artifacts of)", "fixture-hello", "->", str(staging)]
