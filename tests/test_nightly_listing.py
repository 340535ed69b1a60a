"""Listing parsing (CDN page, S3 XML with pagination, GitHub release, file:// mirror), the name
pattern, group choice and layering, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from therock_tarballs import Mirror, tarball_name

from rocforge_build import cli, config
from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.nightly import listing

DEV_SHA = "8f6cdfc0d95845f4ca5a46de59d58894972a29a9"
# (name, mtime): a hosting as it looks after the Oct 2025 switch from rc to a dates
LISTING = [
    (tarball_name("gfx1151", "7.10.0a20251021"), 1761030000.0),
    (tarball_name("gfx115X-all", "7.10.0a20251021"), 1761030100.0),
    (tarball_name("gfx115X-all", "7.10.0a20251101"), 1761980000.0),
    (tarball_name("gfx110X-all", "7.10.0a20251101"), 1761980100.0),
    (tarball_name("gfx110X-all", "7.10.0a20251021"), 1761030200.0),
    (tarball_name("gfx110X-dgpu", "6.5.0rc20250610"), 1749540000.0),
    (tarball_name("gfx110X-all", "7.10.0a20251101", variant="tests"), 1761980200.0),
    (tarball_name("gfx115X-all", "7.10.0a20251101", variant="hpc"), 1761980300.0),
    (tarball_name("gfx1151", "7.10.0a20251101", platform="windows"), 1761980400.0),
    (tarball_name("gfx1151", f"7.10.0.dev0+{DEV_SHA}"), 1761500000.0),
    (tarball_name("gfx1151", "7.9.0rc1"), 1758000000.0),
    ("README.txt", 1700000000.0),
]


@pytest.fixture
def cdn(http_server):
    m = Mirror(http_server, "/tarball/")
    for name, mtime in LISTING:
        m.add(name, b"not a real tarball", mtime)
    return m


@pytest.mark.parametrize("name,group,version,variant,kind", [
    ("therock-dist-linux-gfx1151-7.10.0a20251021.tar.gz", "gfx1151", "7.10.0a20251021", None, "nightly"),
    ("therock-dist-linux-gfx110X-dgpu-6.5.0rc20250610.tar.gz", "gfx110X-dgpu", "6.5.0rc20250610", None, "nightly"),
    ("therock-dist-linux-gfx94X-dcgpu-6.4.0.dev0+8f6cdfc0d9.tar.gz", "gfx94X-dcgpu", "6.4.0.dev0+8f6cdfc0d9", None, "dev"),
    ("therock-dist-linux-gfx120X-all-7.0.0rc2.tar.gz", "gfx120X-all", "7.0.0rc2", None, "prerelease"),
    ("therock-dist-linux-gfx110X-all-tests-7.10.0a20251021.tar.gz", "gfx110X-all", "7.10.0a20251021", "tests", "nightly"),
    ("therock-dist-linux-multiarch-hpc-tests-7.13.0a20260301.tar.gz", "multiarch", "7.13.0a20260301", "hpc-tests", "nightly"),
    ("therock-dist-windows-gfx1151-7.10.0a20251021.tar.gz", "gfx1151", "7.10.0a20251021", None, "nightly"),
    ("therock-dist-linux-gfx1151-7.10.0.tar.gz", "gfx1151", "7.10.0", None, "release"),
])
def test_name_pattern(name, group, version, variant, kind):
    e = listing.parse_name(name)
    assert (e.family, e.version, e.variant, e.kind) == (group, version, variant, kind)


@pytest.mark.parametrize("name", [
    "therock-dist-linux-gfx1151-7.10.tar.gz", "therock-dist-linux-gfx1151-7.10.0a2025102.tar.gz",
    "rocm-7.10.0.tar.gz", "therock-dist-linux-gfx1151-7.10.0a20251021.tar.xz",
    "therock-dist-linux-gfx1151-7.10.0.dev0+XYZ.tar.gz",
])
def test_not_dist_tarballs(name):
    assert listing.parse_name(name) is None


def test_date_of_rc_and_a_versions():
    assert str(listing.parse_name(LISTING[5][0]).date) == "2025-06-10"
    assert str(listing.parse_name(LISTING[0][0]).date) == "2025-10-21"


def test_cdn_index_page_links_are_relative_and_encoded(cdn):
    src = listing.Source("cdn", "cdn-index", cdn.url)
    entries = listing.list_nightlies([src])
    names = [e.name for e in entries]
    # tests / hpc variants, windows and non-tarballs are left out
    assert len(entries) == 8 and "README.txt" not in names
    assert not any("tests" in n or "hpc" in n or "windows" in n for n in names)
    dev = next(e for e in entries if e.kind == "dev")
    assert dev.url == cdn.url + f"therock-dist-linux-gfx1151-7.10.0.dev0%2B{DEV_SHA}.tar.gz"
    # every URL is fetchable as given
    import requests

    assert requests.get(dev.url, timeout=5).status_code == 200
    # newest first: date in the version, then mtime
    assert [e.version for e in entries[:3]] == ["7.10.0a20251101"] * 2 + ["7.10.0a20251021"]
    assert entries[0].mtime >= entries[1].mtime


def test_page_url_without_trailing_slash(cdn):
    src = listing.Source("cdn", "cdn-index", cdn.url.rstrip("/"))
    e = listing.list_nightlies([src])[0]
    assert e.url.startswith(cdn.url) and e.url.count("/tarball/") == 1


def test_page_without_file_list_is_a_clear_error(http_server):
    url = http_server.add("/moved/", "<html><a href='x.tar.gz'>x</a></html>")
    with pytest.raises(NetworkError, match="no `const files") as exc:
        listing.list_nightlies([listing.Source("cdn", "cdn-index", url)])
    assert "config set" in exc.value.hint


def test_s3_listing_follows_continuation_tokens(http_server):
    objects = {name: (b"x" * (i + 1), mtime) for i, (name, mtime) in enumerate(LISTING)}
    objects["v4/tarball/" + tarball_name("multiarch", "7.11.0a20260105")] = (b"m" * 7, 1767600000.0)
    objects["v4/tarball/sub/" + tarball_name("multiarch", "7.11.0a20260106")] = (b"m", 1767700000.0)
    url = http_server.add_s3_bucket("/bucket", objects, max_keys=3)
    root = listing.list_nightlies([listing.Source("s3", "s3", url)])
    assert {e.family for e in root} >= {"gfx1151", "gfx115X-all", "gfx110X-dgpu"}
    assert all("multiarch" not in e.name for e in root)  # only direct children of the prefix
    listings = [h for m, p, h in http_server.requests if p == "/bucket/"]
    assert len(listings) == 5  # 14 keys under the prefix "", 3 per page
    sized = next(e for e in root if e.name == LISTING[0][0])
    assert sized.size == 1 and sized.mtime == LISTING[0][1]
    multi = listing.list_nightlies([listing.Source("s3m", "s3", url, prefix="v4/tarball/")])
    assert [e.family for e in multi] == ["multiarch"] and multi[0].size == 7
    assert multi[0].url == url + "v4/tarball/therock-dist-linux-multiarch-7.11.0a20260105.tar.gz"


def test_index_url_kinds():
    s = listing.source_for_url("https://therock-nightly-tarball.s3.us-east-2.amazonaws.com/?list-type=2&prefix=v4/tarball/")
    assert (s.kind, s.prefix, s.url) == ("s3", "v4/tarball/", "https://therock-nightly-tarball.s3.us-east-2.amazonaws.com/")
    assert listing.source_for_url("https://rocm.nightlies.amd.com/tarball/").kind == "cdn-index"
    assert listing.source_for_url("https://api.github.com/repos/ROCm/TheRock/releases/tags/nightly-tarball").kind == "github-release"


def test_github_release_listing(http_server):
    assets = [{"name": n, "browser_download_url": f"https://github.com/ROCm/TheRock/releases/download/nightly-tarball/{urllib.parse.quote(n)}",
               "size": 10, "updated_at": "2025-06-10T07:29:39Z"} for n, _ in LISTING[5:6]]
    url = http_server.add("/repos/ROCm/TheRock/releases/tags/nightly-tarball",
                          json.dumps({"tag_name": "nightly-tarball", "assets": assets}))
    e = listing.list_nightlies([listing.Source("gh", "github-release", url)])
    assert [x.version for x in e] == ["6.5.0rc20250610"] and e[0].size == 10


def test_file_mirror_directory(tmp_path):
    for name, _ in LISTING[:3]:
        (tmp_path / name).write_bytes(b"x")
    e = listing.list_nightlies([listing.Source("m", "cdn-index", tmp_path.as_uri() + "/")])
    assert len(e) == 3 and all(x.url.startswith("file://") for x in e)


def test_groups_in_order_of_preference():
    assert listing.groups_for("gfx1151") == ["gfx1151", "gfx115X-all", "multiarch"]
    assert listing.groups_for("gfx1100") == ["gfx1100", "gfx110X-all", "gfx110X-dgpu", "multiarch"]
    assert listing.groups_for(family="gfx110X-all") == ["gfx110X-all"]


def test_choose_newest_then_preferred_group(cdn):
    entries = listing.list_nightlies([listing.Source("cdn", "cdn-index", cdn.url)])
    groups = listing.groups_for("gfx1151")
    c = listing.choose(entries, groups)
    # the exact target stopped on 10-21, the family went on: the newest wins
    assert (c.entry.family, c.entry.version) == ("gfx115X-all", "7.10.0a20251101")
    c = listing.choose(entries, groups, "7.10.0a20251021")
    assert c.entry.family == "gfx1151" and "also published for gfx115X-all" in c.reason
    dev = listing.choose(entries, groups, f"7.10.0.dev0%2B{DEV_SHA}")
    assert dev.entry.kind == "dev"
    legacy = listing.choose(entries, listing.groups_for("gfx1100"), "6.5.0rc20250610")
    assert legacy.entry.family == "gfx110X-dgpu"
    with pytest.raises(UsageError, match="no nightly of version 1.2.3"):
        listing.choose(entries, groups, "1.2.3")


def test_layer_plan_seed_004(cdn):
    entries = listing.list_nightlies([listing.Source("cdn", "cdn-index", cdn.url)])
    layers, why = listing.layer_plan(entries, "gfx1151", listing.groups_for("gfx1151"),
                                       None, "auto")
    assert [(e.family, e.version) for e in layers] == [
        ("gfx110X-all", "7.10.0a20251101"), ("gfx115X-all", "7.10.0a20251101")]
    assert "on top" in why
    layers, _ = listing.layer_plan(entries, "gfx1151", ["gfx1151"], None, "gfx110X-all")
    assert [e.family for e in layers] == ["gfx110X-all", "gfx1151"]
    assert layers[0].version == layers[1].version == "7.10.0a20251021"
    with pytest.raises(UsageError, match="no version is published for both"):
        listing.layer_plan(entries, "gfx1151", ["gfx1151"], None, "gfx94X-dcgpu")


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_list_json_follows_a_hosting_move_with_config_set(cdn, http_server, capsys):
    # the configured default host is unreachable here; one `config set` moves rocforge
    rc, _, _ = _cli(capsys, "config", "set", "nightly.sources.cdn.url", cdn.url)
    assert rc == 0
    rc, _, _ = _cli(capsys, "config", "set", "nightly.use", '["cdn"]')
    rc, out, err = _cli(capsys, "nightly", "list", "--target", "gfx1151", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert {"name", "url", "version", "family", "platform", "date"} <= set(data[0])
    assert {d["family"] for d in data} == {"gfx1151", "gfx115X-all"}
    assert data[0]["date"] == "2025-11-01" and data[0]["platform"] == "linux"
    rc, out, _ = _cli(capsys, "nightly", "list", "--family", "gfx110X-dgpu")
    assert rc == 0 and "6.5.0rc20250610" in out and "7.10" not in out


def test_cli_list_limit_0_is_all_and_n_is_the_first_n(cdn, capsys):
    """--limit N shows the newest N; 0 shows all (as --json does); a negative N is refused while
    parsing (it used to drop the last entry)."""
    full = json.loads(_cli(capsys, "nightly", "list", "--index", cdn.url, "--target", "gfx1151",
                           "--json")[1])
    assert len(full) > 1
    for limit, want in (("0", full), ("1", full[:1]), ("10000", full)):
        rc, out, err = _cli(capsys, "nightly", "list", "--index", cdn.url, "--target", "gfx1151",
                            "--json", "--limit", limit)
        assert rc == 0 and json.loads(out) == want, err
    with pytest.raises(SystemExit) as refused:  # past the documented range: refused while parsing
        _cli(capsys, "nightly", "list", "--index", cdn.url, "--limit", str(10 ** 24))
    assert refused.value.code == 2
    assert "is above 10000" in capsys.readouterr().err
    rc, out, _ = _cli(capsys, "nightly", "list", "--index", cdn.url, "--target", "gfx1151",
                      "--limit", "0")
    assert rc == 0 and all(e["version"] in out for e in full)


def test_cli_index_overrides_and_dead_source_is_skipped(cdn, http_server, capsys):
    dead = http_server.url("/gone/")
    http_server.fail("/gone/", status=404)
    rc, out, err = _cli(capsys, "nightly", "list", "--index", dead, "--index", cdn.url,
                        "--family", "gfx115X-all", "--json")
    assert rc == 0 and "source skipped" in err
    assert len(json.loads(out)) == 2
    rc, out, err = _cli(capsys, "nightly", "list", "--index", http_server.url("/gone2/"))
    assert rc == 6 and "HTTP 404" in err and "hint" in err


def test_config_set_preserves_comments_and_rejects_typos(capsys):
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# my mirror notes\n[nightly]\n# keep two\nkeep = 2\n")
    rc, _, _ = _cli(capsys, "config", "set", "nightly.sources.mirror.url", "file:///srv/rocm/")
    assert rc == 0
    text = path.read_text()
    assert "# my mirror notes" in text and "# keep two" in text and "keep = 2" in text
    assert config.get("nightly.sources.mirror.url") == "file:///srv/rocm/"
    assert config.get("nightly.keep") == 2
    rc, _, err = _cli(capsys, "config", "set", "nightly.sources.cdn.ulr", "x")
    assert rc == 2 and "did you mean nightly.sources.cdn.url" in err
    rc, _, err = _cli(capsys, "config", "set", "nightly.keep", "many")
    assert rc == 2 and "must be an integer" in err
    rc, out, _ = _cli(capsys, "config", "get", "nightly.keep")
    assert out.strip() == "2"
    rc, _, _ = _cli(capsys, "config", "unset", "nightly.keep")
    assert config.get("nightly.keep") == 3 and "# my mirror notes" in path.read_text()


def test_bad_config_file_is_a_config_error(capsys):
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[nightly\n")
    rc, _, err = _cli(capsys, "nightly", "list", "--family", "gfx1151")
    assert rc == 2 and "not valid TOML" in err


def test_pip_route_probes_family_indexes(http_server, capsys):
    http_server.add("/v2/gfx115X-all/", "<html><a href='rocm/'>rocm</a></html>")
    _cli(capsys, "config", "set", "nightly.pip.family_index", http_server.url("/v2/{family}/"))
    rc, out, err = _cli(capsys, "nightly", "pip", "--target", "gfx1151", "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["index"] == http_server.url("/v2/gfx115X-all/")
    assert plan["requirement"] == "rocm[libraries,devel]" and "no index for gfx1151" in plan["reason"]
    assert plan["argv"][-3:] == ["--index-url", plan["index"], "rocm[libraries,devel]"]
    rc, out, _ = _cli(capsys, "nightly", "pip", "--target", "gfx1100", "--route", "multiarch")
    assert "rocm[libraries,device-gfx1100]" in out and "whl-multi-arch" in out
