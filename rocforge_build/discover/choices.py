"""Two small records that decide which rocforge build of a recipe goes on `PATH`:

- `<data>/use.toml`: the build the user chose per recipe (`rocforge use PREFIX`), by prefix name
  under the builds directory, with the date it was chosen.
- `<data>/verified/<prefix name>.toml`: the last `rocforge verify` of that build: passed or
  not, when, and the build's manifest `stamp` it judged (a rebuild changes the stamp, so a
  rebuilt prefix is not "verified" until verify runs again).

Why files and not the results store: `rocforge env` runs on every shell start-up and must not
open sqlite; it already reads each build's manifest, so one more tiny TOML file per build costs
one stat and one read.  The results store keeps the full verify rows; these files are only the
verdict.  Both are written whole (`paths.write_whole`: a reader sees the old file or the new
one), and every path read is recorded for the env cache (`watched_reads.watch`), so a `use` or a
verify invalidates the cached answer.

Read side: stdlib only (tomllib), inner paths as strings (no pathlib on `rocforge env`'s path).
Strings are written as JSON strings, which TOML reads alike.
"""

from __future__ import annotations

from rocforge_build.rootfs import Root, inner_join

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

USE_FILE = "use.toml"
VERIFIED_DIR = "verified"


def data_dir(root: Root) -> str:
    """rocforge's data directory as an inner path (inside `--root` when it lies there)."""
    from rocforge_build import paths
    from rocforge_build.discover.builds import as_inner

    return as_inner(root, paths.data_dir_str())


def _read_toml(root: Root, inner: str) -> dict:
    from rocforge_build.discover.watched_reads import watch

    watch(root, inner)
    try:
        text = root.read_text(inner)
    except (OSError, ValueError, UnicodeError):
        return {}
    from rocforge_build.toml_subset import tomllib_loads

    data = tomllib_loads(text)
    return data if isinstance(data, dict) else {}


def chosen(root: Root) -> dict[str, tuple[str, str]]:
    """recipe -> (prefix name, date chosen), from `rocforge use`; a damaged file chooses nothing."""
    table = _read_toml(root, inner_join(data_dir(root), USE_FILE)).get("choices")
    out = {}
    for recipe, entry in (table.items() if isinstance(table, dict) else ()):
        if isinstance(entry, dict) and isinstance(entry.get("prefix"), str):
            out[str(recipe)] = (entry["prefix"], str(entry.get("at", "")))
    return out


def verdict(root: Root, name: str, stamp: str | None) -> tuple[str, bool] | None:
    """(the date, whether as rocforge's reference itself) of the build `name` (manifest `stamp`)
    passing verify, or None: never verified, its last verify failed, or it was rebuilt since
    (another stamp).  As the reference: a CPU build of the default plan, nothing compared, whose
    record names its own prefix as the reference."""
    record = _read_toml(root, inner_join(data_dir(root), VERIFIED_DIR, f"{name}.toml"))
    if not stamp or record.get("stamp") != stamp or record.get("passed") is not True:
        return None
    reference = record.get("reference")
    itself = isinstance(reference, str) and reference.rstrip("/").rsplit("/", 1)[-1] == name
    return str(record.get("at", "")) or "date unknown", itself


def verified(root: Root, name: str, stamp: str | None) -> str | None:
    """The date of `verdict`, or None."""
    found = verdict(root, name, stamp)
    return found[0] if found else None


def now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _toml(values: dict) -> str:
    """`key = value` lines: booleans as TOML booleans, everything else as a string."""
    import json  # the write side: never on `rocforge env`'s path

    lines = []
    for key, value in values.items():
        lines.append(f"{key} = {'true' if value is True else 'false' if value is False else json.dumps(str(value))}")
    return "\n".join(lines) + "\n"


def write_chosen(choices: dict[str, tuple[str, str]], root: Root) -> Path:
    """Write the whole choice table where `chosen(root)` reads it, atomically."""
    import json

    from rocforge_build import paths

    path = root.host(inner_join(data_dir(root), USE_FILE))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# Written by `rocforge use`: the build of each recipe that `rocforge env` puts on PATH.\n"
    for recipe, (name, at) in sorted(choices.items()):
        text += f"\n[choices.{json.dumps(recipe)}]\n" + _toml({"prefix": name, "at": at})
    paths.write_whole(path, text)
    return path


def record_verify(prefix: Path, stamp: str | None, passed: bool, *, model: str = "",
                  reference: str = "", builds: Path | None = None) -> Path | None:
    """Record a verify verdict for a build in the builds directory `builds` (default: the data
    dir's; the only builds `rocforge env` considers) beside it, in `<data>/verified/`.  Other
    prefixes, or an unwritable data dir, record nothing (None): verify's own result stands."""
    from rocforge_build import paths

    builds = builds or paths.builds_prefix()
    try:
        if prefix.resolve().parent != builds.resolve() or not stamp:
            return None
        path = builds.parent / VERIFIED_DIR / f"{prefix.resolve().name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(path, "# Written by `rocforge verify`: its last verdict on this build.\n"
                          + _toml({"stamp": stamp, "passed": passed, "at": now(),
                                   "model": model, "reference": reference}))
    except OSError:
        return None
    return path
