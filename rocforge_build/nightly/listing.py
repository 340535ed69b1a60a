"""TheRock nightly tarballs: where they are listed (sources from configuration), how their names
parse, and which one serves a GPU target.

Names follow TheRock's `build_tools/install_rocm_from_artifacts.py` pattern
`therock-dist-<platform>-<group>-<version>.tar.gz` with versions `X.Y.ZaYYYYMMDD` (nightlies from
Oct 2025), `X.Y.ZrcYYYYMMDD` (nightlies before), `X.Y.ZrcN` (prereleases) and `X.Y.Z.dev0+<sha>`
(dev builds); `-tests` / `-hpc` variants (`build_tools/build_tarballs.py`) are not installs.

Listing formats (`kind` of a source):
- `cdn-index`: the page `build_tools/index_generation_s3_tar.py` writes. It holds no `<a href>`;
  the file list is `const files = [{"name": ..., "mtime": <epoch float>}, ...];` and each link is
  `encodeURIComponent(name)` relative to the page. A file:// directory without an index.html is
  listed directly (a local mirror).
- `s3`: anonymous `?list-type=2&prefix=` ListBucketResult XML, followed through continuation
  tokens.
- `github-release`: the GitHub API JSON of one release (`assets[]`), the pre-Jul-2025 hosting.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from rocforge_build import config
from rocforge_build.discover import targets
from rocforge_build.errors import ConfigError, NetworkError, UsageError

MULTIARCH = "multiarch"
KINDS = ("cdn-index", "s3", "github-release")
_VERSION = r"\d+\.\d+\.\d+(?:(?:a|rc)\d{8}|rc\d{1,7}|\.dev0\+[0-9a-f]+)?"
_DATED = re.compile(r"^\d+\.\d+\.\d+(a|rc)(\d{4})(\d{2})(\d{2})$")
_PRERELEASE = re.compile(r"^\d+\.\d+\.\d+rc\d{1,7}$")
_DEV = re.compile(r"^\d+\.\d+\.\d+\.dev0\+[0-9a-f]+$")
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True)
class Nightly:
    name: str
    url: str
    platform: str
    family: str  # TheRock target group: gfx1151, gfx115X-all, gfx110X-dgpu, multiarch, ...
    version: str
    variant: str | None = None  # tests / hpc / hpc-tests, or None for the install tarball
    mtime: float | None = None  # listing's LastModified (epoch)
    size: int | None = None
    source: str = ""

    @property
    def date(self) -> date | None:
        m = _DATED.match(self.version)
        if not m:
            return None
        try:
            return date(int(m.group(2)), int(m.group(3)), int(m.group(4)))
        except ValueError:
            return None

    @property
    def kind(self) -> str:
        if self.date is not None:
            return "nightly"
        if _PRERELEASE.match(self.version):
            return "prerelease"
        if _DEV.match(self.version):
            return "dev"
        return "release"

    def sort_key(self) -> tuple:
        """Newest first: the date in the version, then the listing's mtime."""
        d = self.date
        return (d.toordinal() if d else 0, self.mtime or 0.0)

    def to_json(self) -> dict:
        d = self.date
        return {
            "name": self.name, "url": self.url, "version": self.version, "family": self.family,
            "platform": self.platform, "date": d.isoformat() if d else None,
            "kind": self.kind, "variant": self.variant, "mtime": self.mtime, "size": self.size,
            "source": self.source,
        }


@dataclass(frozen=True)
class Source:
    name: str
    kind: str
    url: str
    prefix: str = ""


def name_pattern(variants: Iterable[str] = ("tests", "hpc", "hpc-tests")) -> re.Pattern[str]:
    alts = "|".join(re.escape(v) for v in sorted(variants, key=len, reverse=True))
    variant = f"(?:-(?P<variant>{alts}))?" if alts else "(?P<variant>)"
    return re.compile(
        r"^therock-dist-(?P<platform>[a-z0-9]+)-(?P<group>[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*?)"
        + variant + rf"-(?P<version>{_VERSION})\.tar\.gz$"
    )


def parse_name(name: str, url: str = "", *, mtime: float | None = None, size: int | None = None,
               source: str = "", pattern: re.Pattern[str] | None = None) -> Nightly | None:
    """A tarball name -> Nightly, or None when it is not a TheRock dist tarball."""
    m = (pattern or name_pattern()).match(name)
    if not m:
        return None
    return Nightly(name=name, url=url, platform=m.group("platform"), family=m.group("group"),
                   version=m.group("version"), variant=m.group("variant") or None,
                   mtime=mtime, size=size, source=source)


# -- sources ---------------------------------------------------------------------------------------

def configured_sources(cfg: dict | None = None) -> list[Source]:
    cfg = cfg or config.effective()
    table = cfg["nightly"]["sources"]
    out = []
    for name in cfg["nightly"]["use"]:
        if name not in table:
            raise ConfigError(
                f"nightly.use names source {name!r}, which is not defined",
                f"define it (rocforge config set nightly.sources.{name}.url URL) or choose from "
                f"{', '.join(sorted(table))}",
            )
        out.append(_source(name, table[name]))
    return out


def _source(name: str, entry: dict) -> Source:
    kind = entry.get("kind", "cdn-index")
    if kind not in KINDS:
        raise ConfigError(f"nightly.sources.{name}.kind is {kind!r}",
                          f"use one of {', '.join(KINDS)}")
    url = entry.get("url", "")
    if not url:
        raise ConfigError(f"nightly.sources.{name}.url is empty",
                          f"rocforge config set nightly.sources.{name}.url URL")
    return Source(name=name, kind=kind, url=url, prefix=entry.get("prefix", ""))


def source_for_url(url: str) -> Source:
    """A `--index URL` given on the command line: the kind is read from the URL."""
    parsed = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parsed.query)
    host = parsed.netloc.lower()
    if "list-type" in query or ".s3." in host or host.startswith("s3.") or host.endswith(
            "amazonaws.com"):
        base = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path or "/", "", ""))
        return Source(name=url, kind="s3", url=base, prefix=query.get("prefix", [""])[0])
    if host == "api.github.com":
        return Source(name=url, kind="github-release", url=url)
    return Source(name=url, kind="cdn-index", url=url)


def list_source(src: Source, *, platform: str | None = None, session=None,
                pattern: re.Pattern[str] | None = None) -> list[Nightly]:
    pattern = pattern or name_pattern()
    if src.kind == "s3":
        raw = _list_s3(src, session)
    elif src.kind == "github-release":
        raw = _list_github(src, session)
    else:
        raw = _list_cdn(src, session)
    out = []
    for name, url, mtime, size in raw:
        entry = parse_name(name.rsplit("/", 1)[-1], url, mtime=mtime, size=size,
                           source=src.name, pattern=pattern)
        if entry and (platform is None or entry.platform == platform):
            out.append(entry)
    return out


def list_nightlies(sources: list[Source], *, platform: str | None = "linux", session=None,
                   skip_variants: Iterable[str] = ("tests", "hpc", "hpc-tests"),
                   errors: list[str] | None = None) -> list[Nightly]:
    """Every install tarball the sources list, newest first, each name once (first source wins).

    A source that cannot be read is skipped and its error appended to `errors` when given (so a
    dead legacy host does not hide a live one); with no readable source at all, the last error
    is raised.
    """
    skip = set(skip_variants)
    pattern = name_pattern(skip)
    seen: dict[str, Nightly] = {}
    failures: list[NetworkError] = []
    for src in sources:
        try:
            entries = list_source(src, platform=platform, session=session, pattern=pattern)
        except NetworkError as exc:
            failures.append(exc)
            if errors is not None:
                errors.append(f"{src.name}: {exc.message}")
            continue
        for e in entries:
            if e.variant in skip:
                continue
            seen.setdefault(e.name, e)
    if failures and len(failures) == len(sources):
        raise failures[-1]  # the caller warned about each through `errors`
    return sort_newest(seen.values())


def sort_newest(entries: Iterable[Nightly]) -> list[Nightly]:
    return sorted(entries, key=lambda e: (e.sort_key(), e.name), reverse=True)


def _page_url(url: str) -> str:
    """Links on a CDN page are relative to it: a folder URL needs its trailing slash."""
    parsed = urllib.parse.urlsplit(url)
    last = parsed.path.rsplit("/", 1)[-1]
    if parsed.path and not parsed.path.endswith("/") and "." not in last:
        return urllib.parse.urlunsplit(parsed._replace(path=parsed.path + "/"))
    return url


def encode_uri_component(name: str) -> str:
    """JavaScript's encodeURIComponent(name).replace(/%2F/g, '/') as the CDN page does."""
    return urllib.parse.quote(name, safe="/!~*'()")


_PLAIN = re.compile(r"^[A-Za-z0-9_%!~*'()+-][A-Za-z0-9_.%!~*'()+-]*$")


def _relative(folder: str, base: str, href: str) -> str:
    """urljoin(base, href); a plain file name (the common case) is appended to the folder."""
    return folder + href if _PLAIN.match(href) else urllib.parse.urljoin(base, href)


def parse_cdn_index(text: str, page_url: str) -> list[tuple[str, str, float | None, int | None]]:
    marker = re.search(r"\bconst\s+files\s*=\s*", text)
    if not marker:
        if "<ListBucketResult" in text:
            names, _ = parse_s3_xml(text)
            return [(k, urllib.parse.urljoin(page_url, encode_uri_component(k)), m, s)
                    for k, m, s in names]
        raise NetworkError(
            f"{page_url} has no `const files = [...]` list: not a TheRock index page",
            "the hosting may have changed format; check the page in a browser and point "
            "rocforge at the new source with `rocforge config set nightly.sources.<name>.kind`",
        )
    try:
        files, _end = json.JSONDecoder().raw_decode(text, marker.end())
    except json.JSONDecodeError as exc:
        raise NetworkError(f"{page_url}: the embedded file list is not valid JSON ({exc.msg})",
                           "the page may be truncated; try again") from exc
    base = _page_url(page_url)
    folder = urllib.parse.urljoin(base, ".")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            continue
        mtime = f.get("mtime")
        size = f.get("size")
        out.append((f["name"], _relative(folder, base, encode_uri_component(f["name"])),
                    float(mtime) if isinstance(mtime, (int, float)) else None,
                    int(size) if isinstance(size, int) else None))
    return out


def _list_cdn(src: Source, session):
    from rocforge_build import download

    url = _page_url(src.url)
    if url.startswith("file:"):
        folder = download._file_url_path(url)
        if folder.is_dir() and not (folder / "index.html").exists():
            return _list_directory(folder)
    text = download.get_text(url, session=session)
    entries = parse_cdn_index(text, url)
    if src.prefix:
        entries = [e for e in entries if e[0].startswith(src.prefix)]
    return entries


def _list_directory(folder: Path):
    out = []
    for p in sorted(folder.glob("*.tar.gz")):
        st = p.stat()
        out.append((p.name, p.as_uri(), st.st_mtime, st.st_size))
    return out


def parse_s3_xml(text: str) -> tuple[list[tuple[str, float | None, int | None]], str | None]:
    """One ListBucketResult page -> ([(key, mtime, size)], next continuation token or None)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NetworkError(f"S3 listing is not valid XML: {exc}", "try again later") from exc
    ns = _S3_NS if root.tag.startswith(_S3_NS) else ""
    if root.tag != f"{ns}ListBucketResult":
        code = root.findtext("Code") or root.tag
        raise NetworkError(f"S3 answered {code} instead of a listing",
                           "the bucket may be private now; use the CDN source "
                           "(`rocforge config set nightly.use '[\"cdn\"]'`)")
    out = []
    for c in root.iter(f"{ns}Contents"):
        key = c.findtext(f"{ns}Key") or ""
        stamp = c.findtext(f"{ns}LastModified")
        size = c.findtext(f"{ns}Size")
        out.append((key, _iso_epoch(stamp), int(size) if size and size.isascii() and size.isdigit() else None))
    truncated = (root.findtext(f"{ns}IsTruncated") or "").strip().lower() == "true"
    token = root.findtext(f"{ns}NextContinuationToken") if truncated else None
    return out, token


def _iso_epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return None


def _list_s3(src: Source, session, max_pages: int = 1000):
    from rocforge_build import download

    base = src.url if src.url.endswith("/") else src.url + "/"
    out = []
    token = None
    for _ in range(max_pages):
        query = {"list-type": "2", "prefix": src.prefix}
        if token:
            query["continuation-token"] = token
        text = download.get_text(base + "?" + urllib.parse.urlencode(query), session=session)
        page, token = parse_s3_xml(text)
        for key, mtime, size in page:
            if not key.endswith(".tar.gz"):
                continue
            # only direct children of the prefix, as the CDN index does
            if "/" in key[len(src.prefix):]:
                continue
            out.append((key, base + urllib.parse.quote(key, safe="/~"), mtime, size))
        if not token:
            return out
    raise NetworkError(f"S3 listing of {base} did not end after {max_pages} pages",
                       "the listing keeps returning continuation tokens; try again later")


def _list_github(src: Source, session):
    from rocforge_build import download

    text = download.get_text(src.url, session=session)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NetworkError(f"{src.url} did not return release JSON", None) from exc
    out = []
    for a in data.get("assets", []) if isinstance(data, dict) else []:
        name = a.get("name", "")
        if not name.endswith(".tar.gz"):
            continue
        out.append((name, a.get("browser_download_url", ""), _iso_epoch(a.get("updated_at")),
                    a.get("size")))
    return out


# -- choosing --------------------------------------------------------------------------------------

def groups_for(target: str | None = None, family: str | None = None) -> list[str]:
    """TheRock groups that serve a target, most preferred first: the exact target, its families,
    their legacy spellings, then the multi-arch tarball."""
    if family:
        return [family]
    if target:
        return [*targets.get_target(target).therock_groups, MULTIARCH]
    return []


def for_groups(entries: Iterable[Nightly], groups: list[str]) -> list[Nightly]:
    """Entries of the given groups, newest first; on the same date the preferred group first."""
    if not groups:
        return sort_newest(entries)
    rank = {g: i for i, g in enumerate(groups)}
    chosen = [e for e in entries if e.family in rank]
    return sorted(chosen, key=lambda e: (-e.sort_key()[0], rank[e.family], -(e.mtime or 0.0),
                                         e.name))


@dataclass(frozen=True)
class Choice:
    entry: Nightly
    reason: str
    candidates: tuple[Nightly, ...]


def choose(entries: list[Nightly], groups: list[str], version: str | None = None) -> Choice:
    """The tarball to install: `version` (or the newest) from the most preferred group."""
    ranked = for_groups(entries, groups)
    want = None if version in (None, "", "latest") else urllib.parse.unquote(version)
    if want:
        ranked = [e for e in ranked if e.version == want]
    if not ranked:
        offered = sorted({e.family for e in entries})
        what = f"version {want}" if want else "any version"
        raise UsageError(
            f"no nightly of {what} for group(s) {', '.join(groups) or '(any)'}",
            f"the sources list groups: {', '.join(offered) or 'none'}; see `rocforge nightly "
            "list`" + ("" if want else "; or give --family"),
        )
    best = ranked[0]
    same_day = [e for e in ranked if e.sort_key()[0] == best.sort_key()[0]]
    others = sorted({e.family for e in same_day} - {best.family})
    why = (f"{best.version} is the " + ("requested version" if want else "newest")
           + (f" ({best.date.isoformat()})" if best.date else "")
           + f"; group {best.family}")
    if groups:
        pos = groups.index(best.family)
        why += f" is preference #{pos + 1} of {', '.join(groups)}"
        if others:
            why += f" (also published for {', '.join(others)})"
    return Choice(best, why, tuple(ranked))


def layer_plan(entries: list[Nightly], target: str | None, groups: list[str],
               version: str | None, base: str | None) -> tuple[list[Nightly], str]:
    """The tarballs of an install, base first: one, or with `base` two of the same version
    (lhl/strix-halo-testing: the gfx110X package first, then gfx1151 on top, for the faster gfx1100 kernels).

    `base` is "auto" (the target's `override_with` target from the target table), a target name
    or a group name."""
    if not base:
        c = choose(entries, groups, version)
        return [c.entry], c.reason
    if base == "auto":
        if not target:
            raise UsageError("--layer without a group needs --target",
                             "e.g. --target gfx1151 --layer, or --layer gfx110X-all")
        under = targets.get_target(target).override_with
        if not under:
            raise UsageError(f"{target} has no fallback target to layer under",
                             "name the base group: --layer GROUP")
        base_groups = [g for g in groups_for(under) if g != MULTIARCH]
    elif targets.known(base):
        base_groups = [g for g in groups_for(base) if g != MULTIARCH]
    else:
        base_groups = [base]
    top_ranked = choose(entries, groups, version).candidates
    base_ranked = for_groups(entries, base_groups)
    base_by_version: dict[str, Nightly] = {}
    for e in base_ranked:
        base_by_version.setdefault(e.version, e)
    for top in top_ranked:
        below = base_by_version.get(top.version)
        if below is not None and below.family != top.family:
            why = (f"{top.version}: {below.family} first, then {top.family} on top "
                   f"(layered; base groups {', '.join(base_groups)})")
            return [below, top], why
    raise UsageError(
        f"no version is published for both {', '.join(groups)} and {', '.join(base_groups)}",
        "see `rocforge nightly list --family GROUP` for each, or install without --layer",
    )


def pip_plan(target: str, route: str, pip_cfg: dict,
             exists: Callable[[str], bool] | None = None) -> tuple[str, str, str]:
    """(index URL, requirement, reason) for the wheel route.

    family route: the first group serving the target (exact, family, legacy) whose PEP 503 index
    `exists` (not probed when `exists` is None); multiarch route: one index for all targets."""
    if route == "multiarch":
        return (pip_cfg["multiarch_index"], pip_cfg["multiarch_requirement"].format(target=target),
                "multi-arch index: one package set, device libraries chosen by extra")
    if route != "family":
        raise ConfigError(f"nightly.pip.route is {route!r}", "use \"family\" or \"multiarch\"")
    groups = [g for g in groups_for(target) if g != MULTIARCH]
    tried = []
    for g in groups:
        url = pip_cfg["family_index"].format(family=g)
        if exists is None or exists(url):
            why = (f"group {g} (preference #{groups.index(g) + 1} of {', '.join(groups)})"
                   + (f"; no index for {', '.join(tried)}" if tried else ""))
            return url, pip_cfg["family_requirement"].format(target=target, family=g), why
        tried.append(g)
    raise NetworkError(
        f"no per-family wheel index found for {target} (tried {', '.join(tried)})",
        "use the multi-arch index: rocforge nightly pip --route multiarch",
    )
