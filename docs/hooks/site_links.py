"""MkDocs hook: the built site works opened from disk (`site/index.html`, no server).  Every local
`href` and `src` in the built pages must name a file that exists; a link to a directory (what
directory URLs make) shows a directory listing from disk, so it fails the build, as a missing file
and a site-absolute link do (404.html aside: only a web server shows it).  `broken_links` is also run by tests/test_docs_site.py."""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value and tag != "base":
                self.urls.append(value)


def _local(url: str) -> str | None:
    """The path part of a link inside the site (None: another site, a mail address, an anchor)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return unquote(parts.path)


def broken_links(site: Path) -> list[str]:
    """'page: link (why)' for each local link in the site's HTML that does not open a file."""
    out = []
    for page in sorted(site.rglob("*.html")):
        if page == site / "404.html":  # a server's answer for a missing page: only ever served
            continue
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        for url in parser.urls:
            path = _local(url)
            if path is None:
                continue
            if path.startswith("/"):
                out.append(f"{page.relative_to(site)}: {url} (absolute: from disk it leaves the site)")
                continue
            target = Path(os.path.normpath(page.parent / path))
            if target.is_dir() or path.endswith("/"):
                out.append(f"{page.relative_to(site)}: {url} (a directory: from disk a listing, not a page)")
            elif not target.is_file():
                out.append(f"{page.relative_to(site)}: {url} (no such file)")
    return out


def on_post_build(config, **kwargs) -> None:
    from mkdocs.exceptions import PluginError

    broken = broken_links(Path(config["site_dir"]))
    if broken:
        raise PluginError(f"{len(broken)} link(s) do not open from disk: " + "; ".join(broken[:10]))
