"""The package's shape, read from the source with `ast` (circles: tests/test_import_graph.py).

- The CLI is a thin layer on top: `cli.py` and `commands/` use only the subsystems' public names
  (no `_name` of forge/, measure/, nightly/, ... by import or attribute), so a subsystem can
  change its insides without the CLI; and no subsystem imports the CLI, so nothing a command
  does is a hidden input of a build or a measurement.
- Tests a contributor can find: a unit test in tests/ is named after what it tests (a subpackage
  or root module of rocforge_build, or one of NOT_A_MODULE); hostile-input tests live in
  tests/attack/, real builds end to end in tests/e2e/, a user's whole path through the CLI (one
  module per story) in tests/journeys/, and helpers and data/ in tests/ alone.  The core modules
  (CORE_MODULES) each have their file at the name the naming gives them, importing them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rocforge_build

PACKAGE = Path(rocforge_build.__file__).parent
TESTS = Path(__file__).resolve().parent
TEST_FOLDERS = ("attack", "e2e", "journeys")  # beside data/, which holds files the tests read
# what a test file directly in tests/ may be named after when it tests no one module
NOT_A_MODULE = (
    "docs",             # the documentation site and the pages it is built from
    "suite",            # the test suite's own promises and its helpers
    "layout",           # this file: the package's shape
    "import_graph",     # no import circles
    "output_hygiene",   # what a person reads, across every command
    "public_sources",   # user-facing text cites what users can look up
    "plans_unchanged",  # every recipe's dry-run plan, byte for byte
)
CLI = ("rocforge_build.cli", "rocforge_build.commands")


def _package_modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"only {len(found)} modules under {PACKAGE}: the walk is broken"
    return found


def _in_cli(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in CLI)


def _private(dotted: str) -> str | None:
    """The first `_name` (not a dunder) among the parts of a dotted name, else None."""
    return next((p for p in dotted.split(".") if p.startswith("_") and not p.endswith("__")), None)


def private_uses(path: Path) -> list[str]:
    """`path:line name` for every private name of a rocforge_build module outside the CLI that
    the file at `path` imports, or reaches as an attribute of something it imported from one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[int, str]] = []
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if f"{alias.name}.".startswith("rocforge_build.") and not _in_cli(alias.name):
                    imported.add(alias.asname or "rocforge_build")
                    if _private(alias.name):
                        found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rocforge_build"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _in_cli(dotted):
                    continue
                imported.add(alias.asname or alias.name)
                if _private(dotted):
                    found.append((node.lineno, dotted))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in imported:
                found.append((node.lineno, ast.unparse(node)))
    return [f"{path}:{line} {name}" for line, name in sorted(found)]


def cli_imports(path: Path) -> list[str]:
    """`path:line module` for every import of the CLI (cli.py, commands/) in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [f"{path}:{node.lineno} {name}" for name in names if _in_cli(name)]
    return sorted(set(found))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_cli_uses_no_private_name_of_a_subsystem():
    files = [p for p in _package_modules() if _in_cli(_module_name(p))]
    assert PACKAGE / "cli.py" in files and len(files) > 20, "the walk is broken"
    found = [use for path in files for use in private_uses(path)]
    assert not found, ("the CLI reaches into a subsystem (make the name public there, or move the "
                       "logic into the subsystem):\n" + "\n".join(found))


def test_no_subsystem_imports_the_cli():
    files = [p for p in _package_modules()
             if not _in_cli(_module_name(p)) and p != PACKAGE / "__main__.py"]
    assert PACKAGE / "forge" / "pipeline.py" in files, "the walk is broken"
    found = [use for path in files for use in cli_imports(path)]
    assert not found, "a subsystem imports the CLI (pass what it needs as arguments):\n" + "\n".join(found)


def test_private_uses_are_found(tmp_path):
    """Each way a command could reach a subsystem's insides is reported; public names, the
    CLI's own helpers and other libraries' private names (argparse's) are not."""
    cmd = tmp_path / "cmd.py"
    cmd.write_text(
        "import argparse\n"
        "import rocforge_build.forge._internal\n"                     # 2: a private module
        "from rocforge_build.forge import sources, plan as p\n"
        "from rocforge_build.forge.sources import _git_resolve\n"     # 4: a private function
        "from rocforge_build.commands.build import _target\n"         # the CLI's own: allowed
        "from rocforge_build.forge.recipes import load\n"
        "def run(args):\n"
        "    sources._unpinned.clear()\n"                             # 8: a private global
        "    p.Plan._fields\n"                                        # 9: through a class
        "    rocforge_build.discover.installs._scan()\n"              # 10: through the package
        "    args._private, argparse._SubParsersAction, _target(args)\n"
        "    return load(args.name).__class__, sources.fetch(args)\n")
    assert private_uses(cmd) == [
        f"{cmd}:2 rocforge_build.forge._internal",
        f"{cmd}:4 rocforge_build.forge.sources._git_resolve",
        f"{cmd}:8 sources._unpinned",
        f"{cmd}:9 p.Plan._fields",
        f"{cmd}:10 rocforge_build.discover.installs._scan",
    ]


def test_cli_imports_are_found(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text(
        "from rocforge_build import cli\n"
        "import rocforge_build.commands.build\n"
        "from rocforge_build.forge import plan\n"
        "def later():\n"
        "    from rocforge_build.commands.recipe import run_list\n")
    assert cli_imports(module) == [
        f"{module}:1 rocforge_build.cli",
        f"{module}:2 rocforge_build.commands.build",
        f"{module}:5 rocforge_build.commands.recipe",
        f"{module}:5 rocforge_build.commands.recipe.run_list",
    ]


def unlisted_modules(modules: list[Path], layout_text: str) -> list[str]:
    """The modules (but `__init__.py`) whose file name the code map never mentions."""
    return [str(p.relative_to(PACKAGE)) for p in modules
            if p.name != "__init__.py" and f"{p.name}`" not in layout_text]


def test_the_code_map_names_every_module():
    """docs/layout.md is where a contributor finds a module: each one is named there."""
    text = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    assert unlisted_modules(_package_modules(), text) == []


def test_unlisted_modules_are_found():
    mods = [PACKAGE / name for name in ("__init__.py", "named.py", "forgotten.py")]
    assert unlisted_modules(mods, "| `named.py` | ... |") == ["forgotten.py"]


def module_names(package: Path) -> set[str]:
    """The subpackages and root modules of `package`: what a unit test's file is named after."""
    modules = {p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def misnamed_tests(tests: Path, names: set[str]) -> list[str]:
    """The `test_*.py` files directly in `tests` named after none of `names` (`test_forge.py`
    and `test_forge_plan.py` are named after `forge`; `test_forgery.py` is not)."""
    return sorted(p.name for p in tests.glob("test_*.py")
                  if not any(p.stem[5:] == n or p.stem[5:].startswith(n + "_") for n in names))


def stray_test_files(tests: Path) -> list[str]:
    """Folders of `tests` other than TEST_FOLDERS and data/, and files in TEST_FOLDERS that are
    not `test_*.py` (a helper there would be one only its folder finds)."""
    folders = [p for p in tests.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")]
    stray = [f"{p.name}/" for p in folders if p.name not in TEST_FOLDERS]
    stray += [str(f.relative_to(tests)) for p in folders if p.name in TEST_FOLDERS
              for f in p.iterdir() if f.name != "__pycache__" and not
              (f.is_file() and f.name.startswith("test_") and f.suffix == ".py")]
    return sorted(stray)


def test_unit_tests_are_named_after_what_they_test():
    """A contributor finds a module's tests by its name: tests/test_forge_conditions.py for
    forge/conditions.py, tests/test_commands_<command>.py for a command's."""
    names = module_names(PACKAGE) | set(NOT_A_MODULE)
    assert {"forge", "commands", "cli", "paths"} <= names, "the walk is broken"
    assert len(list(TESTS.glob("test_*.py"))) > 50, "the walk is broken"
    assert misnamed_tests(TESTS, names) == [], (
        "name a unit test tests/test_<subpackage or root module>_<what>.py (a test of no one "
        "module: a prefix in NOT_A_MODULE; hostile inputs: tests/attack/; real builds: tests/e2e/)")


# the modules a maintainer looks for first, each with its own test file at the name the naming
# gives it (a room's module: tests/test_<room>_<module>.py; a root module: tests/test_<module>.py)
CORE_MODULES = ("forge/plan.py", "substitute/pull.py", "substitute/publish.py", "measure/verify.py",
                "measure/store.py", "replace.py", "ownership.py", "proc.py")


def expected_test_file(module: str) -> str:
    """The test file the naming gives `module` (a path below rocforge_build/)."""
    return "test_" + module.removesuffix(".py").replace("/", "_") + ".py"


def unfound_tests(tests: Path, modules: tuple[str, ...]) -> list[str]:
    """`module -> tests/test_...py` for each of `modules` whose test file is missing or never
    imports it (by its dotted name, or `from <room> import <module>`)."""
    missing = []
    for module in modules:
        path = tests / expected_test_file(module)
        dotted = "rocforge_build." + module.removesuffix(".py").replace("/", ".")
        room, _, name = dotted.rpartition(".")
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        tree = ast.parse(text) if text else ast.Module(body=[], type_ignores=[])
        imported = any(
            (isinstance(n, ast.Import) and any(a.name == dotted for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module == dotted or (
                n.module == room and any(a.name == name for a in n.names))))
            for n in ast.walk(tree))
        if not imported:
            missing.append(f"{module} -> tests/{path.name}")
    return missing


def test_the_core_modules_have_their_tests_where_the_naming_says():
    """A maintainer finds forge/plan.py's tests in tests/test_forge_plan.py, proc.py's in
    tests/test_proc.py (docs/developing.md, Where the tests are)."""
    assert all((PACKAGE / m).is_file() for m in CORE_MODULES), "a core module moved: update CORE_MODULES"
    assert unfound_tests(TESTS, CORE_MODULES) == []


def test_unfound_tests_are_found(tmp_path):
    (tmp_path / "test_proc.py").write_text("from rocforge_build import proc\n")
    (tmp_path / "test_forge_plan.py").write_text("from rocforge_build.forge.plan import make_plan\n")
    (tmp_path / "test_replace.py").write_text("import rocforge_build.replace\n")
    (tmp_path / "test_ownership.py").write_text("from rocforge_build import proc  # not ownership\n")
    assert unfound_tests(tmp_path, ("proc.py", "forge/plan.py", "replace.py", "ownership.py",
                                    "measure/store.py")) == [
        "ownership.py -> tests/test_ownership.py", "measure/store.py -> tests/test_measure_store.py"]


def test_attack_and_end_to_end_tests_have_their_folders():
    assert all((TESTS / folder).is_dir() for folder in TEST_FOLDERS)
    assert stray_test_files(TESTS) == []


def test_misnamed_and_stray_tests_are_found(tmp_path):
    for name in ("test_forge.py", "test_forge_plan.py", "test_docs_site.py", "test_forgery.py",
                 "test_conditions.py", "buildfixtures.py"):
        (tmp_path / name).write_text("")
    assert misnamed_tests(tmp_path, {"forge", "docs"}) == ["test_conditions.py", "test_forgery.py"]
    for path in ("attack/test_x.py", "attack/helpers.py", "e2e/test_y.py", "e2e/notes.txt",
                 "unit/test_z.py", "data/anything.json"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("")
    assert stray_test_files(tmp_path) == ["attack/helpers.py", "e2e/notes.txt", "unit/"]


def repeated_test_names(tests: Path) -> list[str]:
    """`test_*.py` base names that appear in more than one of tests/ and its TEST_FOLDERS: pytest
    imports a test file by its base name (rootdir-relative prepend mode), so the second one of a
    name is not collected ("import file mismatch") and the whole run stops."""
    seen: dict[str, list[str]] = {}
    for folder in (tests, *(tests / f for f in TEST_FOLDERS)):
        for p in folder.glob("test_*.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    return sorted(", ".join(sorted(places)) for places in seen.values() if len(places) > 1)


def test_every_test_file_name_is_used_once():
    """tests/test_serve_canary.py beside tests/e2e/test_serve_canary.py stopped a whole run."""
    assert repeated_test_names(TESTS) == []


def test_repeated_test_names_are_found(tmp_path):
    for name in ("test_a.py", "e2e/test_a.py", "journeys/test_b.py", "attack/test_c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert repeated_test_names(tmp_path) == ["e2e/test_a.py, test_a.py"]
