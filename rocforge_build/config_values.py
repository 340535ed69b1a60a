"""The rules a configuration value of text (or a list of text) must follow, one function per key:
config.py applies the same rule when `rocforge config set` writes a value and whenever the user's
file is read, so a value every later command would refuse (`cache.launcher '$(touch x)'`) is
refused when it is set, and the file is left as it was.

Each rule answers None for a good value, else what is wrong with it (config.py words the error).
Numbers are bounded by config.BOUNDS; the names of nightly.use are checked against the sources
of the whole configuration (`problem_of_whole`)."""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on `rocforge env`'s path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# what `cache.launcher` may name: forge/cache.py find_launcher reads the same four
LAUNCHERS = ("auto", "ccache", "sccache", "none")
# the kinds of a nightly source: nightly/listing.py KINDS
SOURCE_KINDS = ("cdn-index", "s3", "github-release")
PIP_ROUTES = ("family", "multiarch")
# substitute/stores.py SCHEMES
STORE_SCHEMES = ("oci", "oci+http", "file", "s3", "https")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a platform, variant or source name
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_PORT = r"(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3})"
# distcc's DISTCC_HOSTS entry without options (distcc(1) "HOST SPECIFICATIONS"): HOST[:PORT][/JOBS]
_DISTCC_HOST = re.compile(rf"{_HOST}(?::{_PORT})?(?:/[1-9]\d{{0,3}})?")
_SCHEDULER = re.compile(rf"{_HOST}(?::{_PORT})?")  # icecream's scheduler: HOST[:PORT]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _plain(v: str) -> str | None:
    return "holds a control character (a newline, tab or escape)" if _CONTROL.search(v) else None


def _name(v: str) -> str | None:
    return None if _NAME.fullmatch(v) else "must be a name of letters, digits, '.', '_' or '-'"


def _names(v: list[str]) -> str | None:
    bad = [x for x in v if not _NAME.fullmatch(x)]
    return f"holds {bad[0]!r}, not a name of letters, digits, '.', '_' or '-'" if bad else None


def _suffixes(v: list[str]) -> str | None:
    bad = [x for x in v if not re.fullmatch(r"\.[A-Za-z0-9._-]+", x)]
    return f"holds {bad[0]!r}, not a file name suffix such as .sha256" if bad else None


def _url(schemes: tuple[str, ...], *, empty: bool = False) -> Callable[[str], str | None]:
    def rule(v: str) -> str | None:
        if not v:
            return None if empty else "is empty: give a URL"
        scheme = v.split("://", 1)[0].lower() if "://" in v else ""
        if scheme not in schemes or re.search(r"[\s\x00-\x1f\x7f]", v):
            return f"must be a URL ({', '.join(s + '://' for s in schemes)}) without spaces"
        return None
    return rule


def _template(fields: tuple[str, ...], url: bool) -> Callable[[str], str | None]:
    """A text formatted with `fields` (str.format), as nightly/listing.py formats it."""
    def rule(v: str) -> str | None:
        try:
            v.format(**dict.fromkeys(fields, "x"))
        except (KeyError, IndexError, ValueError, AttributeError):
            return (f"must be a text whose {{...}} fields are only "
                    f"{', '.join('{' + f + '}' for f in fields) or 'none'}")
        return _url(("http", "https", "file"))(v) if url else _plain(v)
    return rule


def _each(pattern: re.Pattern[str], what: str) -> Callable[[list[str]], str | None]:
    def rule(v: list[str]) -> str | None:
        bad = [x for x in v if not pattern.fullmatch(x)]
        return f"holds {bad[0]!r}, not {what}" if bad else None
    return rule


def _store_urls(v: list[str]) -> str | None:
    """Store URLs as substitute/stores.py judges them (credentials.py's rule): one holding
    credentials is named by its place in the list, never repeated."""
    from rocforge_build.credentials import credentials_hint, url_problem

    for index, url in enumerate(v):
        secret = url_problem(url)
        if secret:
            scheme = url.partition("://")[0] if "://" in url else ""
            return f"[{index}] {secret}; {credentials_hint(scheme)}"
        wrong = _url(STORE_SCHEMES)(url)
        if wrong:
            return f"holds {url!r}: {wrong}"
    return None


def _public_keys(v: list[str]) -> str | None:
    """Entries of minisign public keys, with their options (trusted_entry.py: a window, the key a
    rotation came through), as signing.py reads them, the point too: a small-order or
    non-canonical Ed25519 key is refused when it is set, not first when a pull trusts it."""
    from rocforge_build.trusted_entry import parse_all

    try:
        parse_all(v)
    except ValueError as exc:
        return str(exc)
    return None


_SOURCE_URL = _url(("http", "https", "file"))
RULES: dict[str, Callable[[Any], str | None]] = {
    "nightly.platform": _name,
    "nightly.use": _names,
    "nightly.prefix": _plain,
    "nightly.checksum_suffixes": _suffixes,
    "nightly.skip_variants": _names,
    "nightly.pip.family_index": _template(("family",), url=True),
    "nightly.pip.family_requirement": _template(("target", "family"), url=False),
    "nightly.pip.multiarch_index": _template((), url=True),
    "nightly.pip.multiarch_requirement": _template(("target",), url=False),
    "nightly.pip.route": _one_of(PIP_ROUTES),
    "cache.launcher": _one_of(LAUNCHERS),
    # a scheme the launcher does not speak is left out at build time with a note (forge/cache.py)
    "cache.remote": lambda v: "holds a space or control character" if re.search(
        r"[\s\x00-\x1f\x7f]", v) else None,
    "build.distcc_hosts": _each(_DISTCC_HOST, "HOST[:PORT][/JOBS]"),
    "build.icecc_scheduler": lambda v: None if not v or _SCHEDULER.fullmatch(v) else (
        "must be HOST[:PORT]"),
    "substitute.stores": lambda v: _store_urls(v),
    "substitute.trusted_keys": lambda v: _public_keys(v),
    "substitute.signing_key": _plain,
    "substitute.verify": _one_of(("quick", "full", "none")),
    "substitute.verify_model": _plain,
}
# the fields of every nightly.sources.NAME table
SOURCE_RULES: dict[str, Callable[[Any], str | None]] = {
    "kind": _one_of(SOURCE_KINDS), "url": _SOURCE_URL, "prefix": _plain}


def problem(key: str, value: Any) -> str | None:
    """What is wrong with `value` for `key` (None: nothing, or a key without a rule of text)."""
    if key.startswith("nightly.sources."):
        name, _, field = key.removeprefix("nightly.sources.").rpartition(".")
        if not _NAME.fullmatch(name):
            return f"names source {name!r}: a source's name is letters, digits, '.', '_' or '-'"
        rule = SOURCE_RULES.get(field)
    else:
        rule = RULES.get(key)
    return rule(value) if rule is not None else None


def problem_of_whole(cfg: dict) -> tuple[str, str] | None:
    """(key, what is wrong) for a rule between keys: every name of nightly.use is a source."""
    sources = cfg["nightly"]["sources"]
    missing = [n for n in cfg["nightly"]["use"] if n not in sources]
    if missing:
        return "nightly.use", (f"names source {missing[0]!r}, which is not defined (sources: "
                               f"{', '.join(sorted(sources))})")
    return None
