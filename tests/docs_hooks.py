"""The documentation site's MkDocs hooks (docs/hooks/*.py) loaded as modules, so that their tests
run without MkDocs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

HOOKS = Path(__file__).resolve().parent.parent / "docs" / "hooks"


def load_hook(name: str) -> ModuleType:
    """docs/hooks/NAME.py, imported as a module named docs_hook_NAME."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
