"""The documentation site works opened from disk, as the README says (`site/index.html`, no
server): every local link of the built pages opens a file (issue 30, item 11: with MkDocs'
directory URLs every link showed a directory listing).  docs/hooks/site_links.py fails
`mkdocs build` on such a link; here its check runs on pages with each kind of link, and on the
real site where MkDocs is installed (`nox -s docs` installs it; the test session need not)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from docs_hooks import load_hook

ROOT = Path(__file__).resolve().parent.parent


def test_links_that_do_not_open_a_file_from_disk_are_named(tmp_path):
    site = tmp_path / "site"
    (site / "guides" / "dir-page").mkdir(parents=True)
    (site / "guides" / "dir-page" / "index.html").write_text("<p>a page as a directory URL makes it</p>")
    (site / "guides" / "file-page.html").write_text('<a href="../index.html#top">up</a>')
    (site / "404.html").write_text('<a href="/index.html">served only by a server</a>')
    (site / "index.html").write_text(
        '<link href="guides/file-page.html"><a href="guides/file-page.html#part">ok</a>'
        '<a href="guides/dir-page/">dir</a><a href="guides/dir-page">dir, no slash</a>'
        '<a href="missing.html">gone</a><a href="/install.html">absolute</a>'
        '<a href="https://github.com/ROCm/TheRock">another site</a><a href="#anchor">here</a>'
        '<a href="mailto:x@example.org">mail</a><img src="assets/logo.png">')
    assert load_hook("site_links").broken_links(site) == [
        "index.html: guides/dir-page/ (a directory: from disk a listing, not a page)",
        "index.html: guides/dir-page (a directory: from disk a listing, not a page)",
        "index.html: missing.html (no such file)",
        "index.html: /install.html (absolute: from disk it leaves the site)",
        "index.html: assets/logo.png (no such file)",
    ]


def test_the_built_site_opens_from_disk(tmp_path):
    """The real site, built strictly with the project's mkdocs.yml (its hook checks the links)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("[optional] MkDocs is installed by `nox -s docs`, which CI runs and checks this")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert load_hook("site_links").broken_links(site) == []
    index = (site / "index.html").read_text()
    assert 'href="install.html"' in index and (site / "install.html").is_file()
    assert 'href="guides/strix-halo.html"' in index and (site / "guides" / "strix-halo.html").is_file()
