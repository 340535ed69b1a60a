"""Git refs and container image references given on the command line or in a recipe, checked
before anything is fetched or written.

A ref becomes a `git` argument (one starting with `-` would be read as an option, e.g.
`--upload-pack=CMD`) and a word of a Containerfile `RUN` line; an image reference becomes a
`FROM` line.  Only what the two grammars allow gets through, so neither can carry an option, a
space, a quote or a line break.
"""

from __future__ import annotations

import re

from rocforge_build.errors import UsageError

# `git help check-ref-format`: the rules a ref name must follow (a one-level name such as a tag,
# branch or commit is fine: --allow-onelevel), plus "cannot start with a dash" (its --branch rule).
_REF_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
GIT_REF_HINT = ("a tag, branch or commit as `git check-ref-format` allows it: no spaces, control "
                "characters, `..`, `~^:?*[\\`, `@{`; not starting with `-` or `.`, not ending in "
                "`/`, `.` or `.lock`")


def git_ref_problem(ref: object) -> str | None:
    """Why `ref` is not a git ref name (`git check-ref-format --allow-onelevel`), or None."""
    if not isinstance(ref, str) or not ref:
        return "is empty"
    bad = _REF_BAD_CHARS.search(ref)
    if bad:
        return f"contains {bad.group()!r}"
    rules = (
        (ref.startswith("-"), "starts with '-' (git would read it as an option)"),
        (".." in ref, "contains '..'"),
        ("@{" in ref, "contains '@{'"),
        (ref == "@", "is '@'"),
        (ref.startswith("/") or ref.endswith("/") or "//" in ref,
         "starts or ends with '/', or has an empty component"),
        (ref.endswith("."), "ends with '.'"),
        (any(c.startswith(".") or c.endswith(".lock") for c in ref.split("/")),
         "has a component starting with '.' or ending in '.lock'"),
    )
    return next((why for broken, why in rules if broken), None)


def check_git_ref(ref: str, where: str = "--ref", error=UsageError) -> str:
    problem = git_ref_problem(ref)
    if problem:
        raise error(f"{where} {ref!r} is not a git ref: it {problem}", GIT_REF_HINT)
    return ref


# `git help git-fetch`, GIT URLS: scheme://..., the scp-like [user@]host:path (no '/' before the
# first ':'), a local path, and `<transport>::<address>` or an unknown scheme, which runs the
# remote helper git-remote-<transport>: `ext::` runs any command it is given (git's protocol.allow
# calls ext "known-dangerous").  A recipe may name only the transports below.
GIT_SCHEMES = ("https", "http", "ssh", "git", "file", "git+ssh", "ssh+git")  # the last two: ssh
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
GIT_URL_HINT = ("a git URL: https://, http://, ssh://, git:// or file://, the scp-like "
                "user@host:path, or a local path")


def git_url_problem(url: object) -> str | None:
    """Why `url` is not a git URL rocforge fetches from, or None."""
    if not isinstance(url, str) or not url:
        return "is empty"
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        return "contains a control character"
    if url.startswith("-"):
        return "starts with '-' (git would read it as an option)"
    m = _SCHEME.match(url)
    if m:
        scheme = m.group(1).lower()
        if scheme not in GIT_SCHEMES:
            return f"uses the {scheme}:// transport, which git hands to a helper program"
        host = url[m.end():].split("/", 1)[0].rpartition("@")[2]
        return "names a host starting with '-'" if host.startswith("-") else None
    head = url.split("/", 1)[0]
    if "::" in head:
        transport = head.partition("::")[0]
        return (f"uses the {transport}:: transport, which runs a helper program"
                + (" (ext:: runs any command it is given)" if transport.lower() == "ext" else ""))
    if ":" in head and head.rpartition("@")[2].startswith("-"):
        return "names a host starting with '-'"
    return None  # scp-like user@host:path, or a local path


def check_git_url(url: str, where: str, error=UsageError) -> str:
    problem = git_url_problem(url)
    if problem:
        raise error(f"{where} {url!r} is not a git URL rocforge fetches from: it {problem}",
                    GIT_URL_HINT)
    return url


# The image reference grammar of github.com/distribution/reference (regexp.go, reference.go):
#   reference := name [ ":" tag ] [ "@" digest ];  name := [domain "/"] path-component ["/" ...]
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?P<digest>@{_DIGEST})?", re.ASCII)
IMAGE_HINT = ("an image reference: [HOST[:PORT]/]NAME[:TAG][@ALGORITHM:HEX], NAME in lower case "
              "(e.g. docker.io/library/debian:12; the grammar of github.com/distribution/reference)")


def image_ref_problem(ref: object, *, digest: bool = True) -> str | None:
    """Why `ref` is not an image reference (a digest only where `digest`), or None."""
    m = _IMAGE.fullmatch(ref) if isinstance(ref, str) else None
    if m is None:
        return "is not an image reference"
    if len(m.group("name")) > 255:
        return "has a name longer than 255 characters"
    if m.group("digest") and not digest:
        return "has a digest (@...): an image is tagged by name[:tag]"
    return None


def check_image_ref(ref: str, where: str, *, digest: bool = True) -> str:
    problem = image_ref_problem(ref, digest=digest)
    if problem:
        raise UsageError(f"{where} {ref!r} {problem}", IMAGE_HINT)
    return ref
