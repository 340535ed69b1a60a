"""The package's layout limits, checked with `ast` so they cannot regress (issue 24 item 4).

- No function (or method) over 80 lines, counted as `end_lineno - lineno + 1` (decorators
  excluded, docstring included): past that a function does several things in a row, and its
  steps want names of their own, each with the reason it exists.
- No module over 700 lines: a module that long holds more than one concern (forge/cache.py,
  discover/host.py, ship/bundle.py, ship/containers.py and download.py were split along their
  own seams into modules of 60-650 lines), and the margin over ~600 leaves room to grow before
  the next split is due.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rocforge_build

PACKAGE = Path(rocforge_build.__file__).parent
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 700


def long_functions(paths: list[Path]) -> list[str]:
    """`path:line name: N lines` for every function or method over the limit."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{path}:{node.lineno} {node.name}: {lines} lines")
    return out


def big_modules(paths: list[Path]) -> list[str]:
    """`path: N lines` for every module over the limit."""
    return [f"{p}: {n} lines" for p in paths
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]


def _package_modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"only {len(found)} modules under {PACKAGE}: the walk is broken"
    return found


def test_no_function_over_80_lines():
    found = long_functions(_package_modules())
    assert not found, "functions over 80 lines (split them along their steps):\n" + "\n".join(found)


def test_no_module_over_700_lines():
    found = big_modules(_package_modules())
    assert not found, "modules over 700 lines (split them where their concerns part):\n" + "\n".join(found)


def test_the_limits_are_exact(tmp_path):
    """A function of 80 lines and a module of 700 pass; 81 and 701 are reported (a check that
    cannot fail would pass a package full of long functions)."""
    def function(name: str, lines: int) -> str:
        return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))

    fits = tmp_path / "fits.py"
    fits.write_text(function("eighty", 80) + "\n" * (700 - 80))
    over = tmp_path / "over.py"
    over.write_text("class C:\n" + "".join("    " + ln + "\n" for ln in
                                           function("method", 81).splitlines())
                    + "\n" * (701 - 82))
    assert len(fits.read_text().splitlines()) == 700 and len(over.read_text().splitlines()) == 701
    assert long_functions([fits]) == [] and big_modules([fits]) == []
    assert long_functions([over]) == [f"{over}:2 method: 81 lines"]
    assert big_modules([over]) == [f"{over}: 701 lines"]
