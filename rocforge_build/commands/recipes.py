"""`rocforge recipes [--json]`: the alias of `rocforge recipe list`, kept so that scripts
written against the shorter spelling go on working; the same arguments, output and exit codes."""

from __future__ import annotations

from rocforge_build.commands.recipe import add_list_arguments as add_arguments
from rocforge_build.commands.recipe import run_list as run

__all__ = ["add_arguments", "run"]
