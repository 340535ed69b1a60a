"""Store URLs to stores: `oci://HOST[:PORT]/REPO` (TLS), `oci+http://HOST:PORT/REPO` (plain
HTTP), `file:///DIR` (an OCI image layout), `s3://BUCKET/PREFIX` and `https://...` (an image
layout served over HTTPS, read-only).  A URL is data: parsed, never passed to a shell."""

from __future__ import annotations

from urllib.parse import urlsplit

from rocforge_build.errors import UsageError
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute.oci import Store

SCHEMES = ("oci", "oci+http", "file", "s3", "https")


def parse(url: str) -> tuple[str, str, str]:
    """(scheme, authority, path) of a store URL, or one UsageError line."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(ord(c) < 0x21 or ord(c) == 0x7f for c in url):
        raise UsageError(f"store URL {one_line(str(url))[:200]!r}: empty, too long or holds spaces "
                         "or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"store URL {one_line(url)[:200]!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise UsageError(f"store URL {one_line(url)[:200]!r}: the scheme must be one of "
                         + ", ".join(f"{s}://" for s in SCHEMES))
    if parts.query or parts.fragment:
        raise UsageError(f"store URL {one_line(url)[:200]!r}: no ?query or #fragment")
    return parts.scheme, parts.netloc, parts.path


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
