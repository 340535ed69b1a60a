"""No import circles in rocforge_build (issue 32 item 6), and imports only run down (a shared
helper never imports a room: docs/layout.md), read from the source with `ast`.

A circle means two modules cannot be understood, tested or moved one without the other, so every
import counts: at module level, inside a function (deferred for start-up time, still a dependency)
and under `if TYPE_CHECKING:` (a type is a dependency too).  `from pkg import name` where `name`
is a submodule is an import of `pkg.name`.  A circle is a strongly connected component of more
than one module; the failure shows each as a path back to its start, so the arrow to cut is seen.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import rocforge_build

PACKAGE = Path(rocforge_build.__file__).parent


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> source file for every module of the package at `package_dir`."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module `from ... import` names, relative levels resolved against `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file (itself left out)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = package_modules(package_dir)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of `graph`, each sorted, those of more than one module only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def cycle_through(start: str, component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from `start` back to itself inside `component` (breadth first)."""
    members = set(component)
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for succ in sorted(graph[node] & members):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if succ not in came_from:
                came_from[succ] = node
                todo.append(succ)
    raise AssertionError(f"{start} is on no cycle of {component}")


def cycles(package_dir: Path) -> list[str]:
    """One line per circle: its members, and a path through it that returns to its start."""
    graph = import_graph(package_dir)
    return [f"{len(c)} modules ({', '.join(c)}): {' -> '.join(cycle_through(c[0], c, graph))}"
            for c in strongly_connected(graph)]


def test_rocforge_build_has_no_import_circles():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and graph["rocforge_build.cli"], "the walk is broken"
    found = cycles(PACKAGE)
    assert not found, ("import circles (put the shared fact in a lower module both import):\n"
                       + "\n".join(found))


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """pkg.a imports pkg.sub.b at module level; b imports a only inside a function: a circle.
    c imports b and is no part of it."""
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def later():\n    from pkg import a\n    return a\n",
        "pkg/c.py": "import pkg.sub.b\n",
    })
    assert cycles(pkg) == ["2 modules (pkg.a, pkg.sub.b): pkg.a -> pkg.sub.b -> pkg.a"]


def test_type_checking_and_relative_imports_count(tmp_path):
    """A type-only import (`if TYPE_CHECKING:`) and relative imports close a circle of three;
    an import of a name (not a submodule) from a package is an import of the package."""
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "VERSION = 1\n",
        "pkg/x.py": "from .y import thing\n",
        "pkg/y.py": "from . import z\nthing = 1\n",
        "pkg/z.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from pkg.x import Something\n"),
        "pkg/w.py": "from pkg import VERSION\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.w"] == {"pkg"}
    assert cycles(pkg) == ["3 modules (pkg.x, pkg.y, pkg.z): pkg.x -> pkg.y -> pkg.z -> pkg.x"]


def test_a_package_without_circles_passes(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "import os\n",
        "pkg/high.py": "from pkg import low\ndef f():\n    from pkg.low import os\n",
    })
    assert import_graph(pkg)["pkg.high"] == {"pkg.low"}
    assert cycles(pkg) == []


# -- imports only run down: the CLI uses the rooms, the rooms use the shared helpers ----------------

# docs/layout.md: the rooms, each at its level; a room imports only rooms of lower levels
LEVELS = {"discover": 1, "forge": 2, "nightly": 3, "ship": 3, "measure": 3, "kernels": 3, "serve": 4,
          "substitute": 4, "workflows": 5, "commands": 6}
ROOMS = tuple(LEVELS)
SHARED_SUBPACKAGES = ("emit",)  # subpackages docs/layout.md places with the shared helpers
CLI = ("cli", "__main__")  # on top of the rooms with commands/: they may import any room


def _room_of(module: str, package: str) -> str | None:
    """The room `module` belongs to (its subpackage), or None for a shared helper or the CLI."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == package and parts[1] in ROOMS else None


def upward_imports(package_dir: Path) -> list[str]:
    """One line per import of a room from a shared helper (the package's own modules outside the
    rooms, the CLI modules left out): each is a fact that belongs in a shared module instead."""
    package = package_dir.name
    found = []
    for module, imported in sorted(import_graph(package_dir).items()):
        if _room_of(module, package) is None and module.split(".")[-1] not in CLI:
            found += [f"{module} -> {name}" for name in sorted(imported)
                      if _room_of(name, package) is not None]
    return found


def test_rocforge_build_subpackages_are_rooms_or_shared():
    """A new subpackage must be placed (a room or shared) before the rule below can hold for it."""
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(ROOMS) | set(SHARED_SUBPACKAGES)


def test_no_shared_helper_imports_a_room():
    found = upward_imports(PACKAGE)
    assert not found, ("shared helpers importing rooms (move the shared fact into a shared module, "
                       "or pass it in from the room):\n" + "\n".join(found))


def test_an_upward_import_is_found_wherever_it_sits(tmp_path):
    """A shared module importing a room at module level, inside a function, under TYPE_CHECKING
    or relatively is caught, as is a shared subpackage (emit); a room importing a shared module
    or another room, and the CLI importing a room, are not."""
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/helper.py": "import os\n",
        "pkg/owner.py": "from pkg.discover.builds import check\n",
        "pkg/late.py": "def f():\n    from pkg.nightly import record\n    return record\n",
        "pkg/typed.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from pkg.forge.plan import Plan\n"),
        "pkg/emit/__init__.py": "",
        "pkg/emit/unit.py": "from ..measure import store\n",
        "pkg/discover/__init__.py": "",
        "pkg/discover/builds.py": "from pkg import helper\ncheck = helper\n",
        "pkg/nightly/__init__.py": "",
        "pkg/nightly/record.py": "from pkg.discover import builds\n",
        "pkg/forge/__init__.py": "",
        "pkg/forge/plan.py": "Plan = 1\n",
        "pkg/measure/__init__.py": "",
        "pkg/measure/store.py": "",
        "pkg/cli.py": "from pkg.forge import plan\n",
    })
    assert upward_imports(pkg) == [
        "pkg.emit.unit -> pkg.measure.store",
        "pkg.late -> pkg.nightly.record",
        "pkg.owner -> pkg.discover.builds",
        "pkg.typed -> pkg.forge.plan",
    ]


def room_order_breaches(package_dir: Path, levels: dict[str, int]) -> list[str]:
    """One line per import of a room from a room not above it (the same level or lower), wherever
    the import sits (module level, a function, TYPE_CHECKING): with the levels declared, two
    rooms can never import each other, and a package-level circle hidden by a function-level
    import (forge -> measure -> forge) shows as a breach."""
    found = []
    for module, imported in sorted(import_graph(package_dir).items()):
        parts = module.split(".")
        here = parts[1] if len(parts) > 1 and parts[1] in levels else None
        if here is None:
            continue
        for name in sorted(imported):
            there = name.split(".")[1] if len(name.split(".")) > 1 else None
            if there in levels and there != here and levels[there] >= levels[here]:
                found.append(f"{module} -> {name} ({here}, level {levels[here]}, imports {there}, "
                             f"level {levels[there]})")
    return found


def test_rooms_import_only_rooms_below_them():
    found = room_order_breaches(PACKAGE, LEVELS)
    assert not found, ("a room imports a room that is not below it (docs/layout.md: move the fact "
                       "down, or the workflow up):\n" + "\n".join(found))


def test_a_breach_of_the_room_order_is_found_wherever_it_sits(tmp_path):
    """forge importing measure inside a function, and measure importing its peer nightly, are
    breaches; measure importing forge, and a room importing itself, are not."""
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/forge/__init__.py": "",
        "pkg/forge/upgrade.py": "def gate():\n    from pkg.measure import verify\n    return verify\n",
        "pkg/forge/plan.py": "from pkg.forge import upgrade\n",
        "pkg/measure/__init__.py": "",
        "pkg/measure/verify.py": "from pkg.forge import plan\nfrom pkg.nightly import known_bad\n",
        "pkg/nightly/__init__.py": "",
        "pkg/nightly/known_bad.py": "",
    })
    assert room_order_breaches(pkg, {"forge": 2, "measure": 3, "nightly": 3}) == [
        "pkg.forge.upgrade -> pkg.measure.verify (forge, level 2, imports measure, level 3)",
        "pkg.measure.verify -> pkg.nightly.known_bad (measure, level 3, imports nightly, level 3)",
    ]
