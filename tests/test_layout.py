"""The package's shape, read from the source with `ast` (circles: tests/test_import_graph.py).

- No module over 700 lines: a module that long holds more than one concern, which no diff shows
  as it grows a line at a time; past the limit it is split where its concerns part.
- The CLI is a thin layer on top: `cli.py` and `commands/` use only the subsystems' public names
  (no `_name` of forge/, measure/, nightly/, ... by import or attribute), so a subsystem can
  change its insides without the CLI; and no subsystem imports the CLI, so nothing a command
  does is a hidden input of a build or a measurement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rocforge_build

PACKAGE = Path(rocforge_build.__file__).parent
MAX_MODULE_LINES = 700
CLI = ("rocforge_build.cli", "rocforge_build.commands")


def big_modules(paths: list[Path]) -> list[str]:
    """`path: N lines` for every module over the limit."""
    return [f"{p}: {n} lines" for p in paths
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]


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


def test_no_module_over_700_lines():
    found = big_modules(_package_modules())
    assert not found, "modules over 700 lines (split them where their concerns part):\n" + "\n".join(found)


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


def test_the_module_limit_is_exact(tmp_path):
    """A module of 700 lines passes, one of 701 is reported."""
    fits, over = tmp_path / "fits.py", tmp_path / "over.py"
    fits.write_text("x = 1\n" * 700)
    over.write_text("x = 1\n" * 701)
    assert big_modules([fits]) == []
    assert big_modules([over]) == [f"{over}: 701 lines"]


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
