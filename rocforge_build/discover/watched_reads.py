"""Small readers of a tree under `--root` (an install, dpkg's status): each records the paths it
consulted for the env cache (`envcache.touch`), so a change to any of them re-runs discovery.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
import re

from rocforge_build.discover.envcache import touch
from rocforge_build.rootfs import Root, inner_join, open_regular


def watch(root: Root, inner: str) -> None:
    """Record `inner` for the env cache: the path as named (a link is stamped itself) and the
    file it resolves to."""
    touch(os.path.join(root.base_str, str(inner).lstrip("/")))
    touch(root.host_str(inner))


def read(root: Root, inner: str, limit: int = 1 << 20) -> str | None:
    watch(root, inner)
    try:
        with open_regular(root.host_str(inner), "r", encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def glob(root: Root, base: str, pattern: str) -> list[str]:
    """Existing inner paths for a relative pattern (globs allowed); newest-looking last."""
    if not any(c in pattern for c in "*?["):
        p = inner_join(base, pattern)
        watch(root, p)
        return [p] if root.exists(p) else []
    static = []
    for part in pattern.split("/"):
        if any(c in part for c in "*?["):
            break
        static.append(part)
    watch(root, inner_join(base, *static))
    found = root.glob_str(base, pattern)
    return sorted(found, key=natural)


def natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def first(root: Root, base: str, patterns, want_dir: bool = True) -> str | None:
    for pattern in patterns:
        hits = [h for h in glob(root, base, pattern) if not want_dir or root.is_dir(h)]
        if hits:
            return hits[-1]
    return None


def all_dirs(root: Root, base: str, patterns) -> tuple[str, ...]:
    out: list[str] = []
    for pattern in patterns:
        for hit in glob(root, base, pattern):
            if root.is_dir(hit) and hit not in out:
                out.append(hit)
    return tuple(out)
