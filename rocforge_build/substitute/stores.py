"""Store URLs to stores: `oci://HOST[:PORT]/REPO` (TLS), `oci+http://HOST:PORT/REPO` (plain
HTTP), `file:///DIR` (an OCI image layout), `s3://BUCKET/PREFIX` and `https://...` (an image
layout served over HTTPS, read-only).  A URL is data: parsed, never passed to a shell.

`parse` is the one parse of a store URL of any kind (--to and `store URL` on the command line,
the configured stores as each is opened); its refusal of a URL holding credentials is
credentials.py's `url_refusal`, the rule `config set`, every read of the config and the registry
store's own parse apply too."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rocforge_build.credentials import redact, url_refusal
from rocforge_build.errors import UsageError
from rocforge_build.shellsafe import one_line

if TYPE_CHECKING:
    from rocforge_build.substitute.oci import Store

SCHEMES = ("oci", "oci+http", "file", "s3", "https")


def parse(url: str) -> tuple[str, str, str]:
    """(scheme, authority, path) of a store URL, or one UsageError line."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(ord(c) < 0x21 or ord(c) == 0x7f for c in url):
        raise UsageError(f"store URL {redact(one_line(str(url)))[:200]!r}: empty, too long or holds "
                         "spaces or control characters")
    refused = url_refusal(url)  # credentials.py: the one rule for a URL that holds credentials
    if refused:
        raise UsageError(*refused)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"store URL {one_line(url)[:200]!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise UsageError(f"store URL {one_line(url)[:200]!r}: the scheme must be one of "
                         + ", ".join(f"{s}://" for s in SCHEMES))
    return parts.scheme, parts.netloc, parts.path


def problem(url: str) -> str | None:
    """`parse`'s verdict as words (config_values' rule for substitute.stores), or None."""
    try:
        parse(url)
    except UsageError as exc:
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return None


def open_store(url: str, *, timeout: float = 30.0, policy=None) -> Store:
    """The store at `url`; its reads follow `policy` (download_policy.RetryPolicy: the whole
    deadlines and least rate), None: the configuration's [download]."""
    scheme, _, _ = parse(url)
    if scheme in ("oci", "oci+http"):
        from rocforge_build.substitute.store_registry import RegistryStore

        return RegistryStore(url, timeout=timeout, policy=policy)
    from rocforge_build.substitute import layout_store

    store = layout_store.open_layout(url, timeout=timeout)
    store.policy = policy
    return store
