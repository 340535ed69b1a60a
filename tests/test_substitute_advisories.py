"""Nightly advisories published to a store (substitute/advisories.py) are honoured by `nightly
install` as the packaged known-bad table is: "latest" skips a covered version and says why, a
pinned version installs with a warning; an untrusted or forged one is left out with a line.

The listing holds OLDER, GOOD and NEWER for gfx1151, none of them in data/known_bad.toml (its only
nightly entry is 7.14.0a20260609..7.14.0a20260612), so any skip here is the store's advisory."""

from __future__ import annotations

import json

import fixtures_roots as fr
import pytest
from needs import needs
from therock_tarballs import Mirror, make_tarball

from rocforge_build import cli
from rocforge_build.substitute import advisories, signing
from rocforge_build.substitute.stores import open_store

OLDER, GOOD, NEWER = "7.15.0a20260701", "7.15.0a20260702", "7.15.0a20260703"


@pytest.fixture
def site(http_server, tmp_path_factory, capsys):
    work = tmp_path_factory.mktemp("adv-tarballs")
    mirror = Mirror(http_server, "/adv/")
    for i, version in enumerate((OLDER, GOOD, NEWER)):
        mirror.add_file(make_tarball(work, "gfx1151", version, ["gfx1151"]), 1782000000.0 + i)
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    capsys.readouterr()
    return mirror


def _store(tmp_path, pair, *, first=NEWER, last=NEWER, targets=("gfx1151",), reason="hangs in rocBLAS init"):
    url = f"file://{tmp_path / 'store'}"
    with open_store(url, timeout=5) as store:
        advisories.publish(store, advisories.make_document(first, last, list(targets), reason, "test"), pair)
    return url


def _configure(capsys, url, trusted):
    assert cli.main(["config", "set", "substitute.stores", json.dumps([url])]) == 0
    assert cli.main(["config", "set", "substitute.trusted_keys", json.dumps([k.text for k in trusted])]) == 0
    capsys.readouterr()


def _plan(capsys, tmp_path, *extra):
    rc = cli.main(["nightly", "install", "--target", "gfx1151", "--prefix", str(tmp_path / "rocm"),
                   "--dry-run", "--json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), err


def test_a_trusted_advisory_makes_latest_skip_and_say_why(site, capsys, tmp_path):
    pair = signing.generate()
    _configure(capsys, _store(tmp_path, pair), [pair.public])
    plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [GOOD]
    assert f"skipped {NEWER} is a known-bad nightly" in plan["reason"]
    assert "hangs in rocBLAS init" in plan["reason"] and pair.key_id in plan["reason"]
    assert "warning" not in err


def test_a_range_and_other_gpus(site, capsys, tmp_path):
    pair = signing.generate()
    _configure(capsys, _store(tmp_path, pair, first=GOOD, last=NEWER, targets=("gfx1100",)), [pair.public])
    plan, _ = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER]  # gfx1151 is not named


def test_a_pinned_advised_version_installs_with_a_warning(site, capsys, tmp_path):
    pair = signing.generate()
    _configure(capsys, _store(tmp_path, pair), [pair.public])
    plan, err = _plan(capsys, tmp_path, "--version", NEWER)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER]
    assert f"warning: {NEWER} is a known-bad nightly" in err and "--version pins" in err
    assert pair.key_id in err


def test_an_untrusted_advisory_is_left_out_with_a_line(site, capsys, tmp_path):
    stranger, mine = signing.generate(), signing.generate()
    _configure(capsys, _store(tmp_path, stranger), [mine.public])
    plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER]
    assert "advisory left out" in err and "not trusted" in err and "Traceback" not in err


def test_a_forged_document_is_left_out(site, capsys, tmp_path):
    """The manifest names a trusted key but its document was changed after signing."""
    from rocforge_build.substitute import oci

    pair = signing.generate()
    url = f"file://{tmp_path / 'store'}"
    doc = advisories.make_document(GOOD, GOOD, ["gfx1151"], "real", "test")
    with open_store(url, timeout=5) as store:
        signed = oci.canonical_json(doc)
        sig = signing.sign(signed, pair, advisories.comment(oci.sha256_digest(signed))).encode()
        forged = oci.canonical_json({**doc, "first": NEWER, "last": NEWER})
        layers = [store.push_blob_bytes(forged, oci.JSON_LAYER), store.push_blob_bytes(sig, oci.MINISIGN_LAYER)]
        man = oci.make_manifest(artifact_type=oci.ADVISORY_TYPE,
                                config=store.push_blob_bytes(oci.EMPTY_DATA, oci.EMPTY), layers=layers,
                                annotations={"dev.rocforge.signer": pair.key_id})
        store.push_manifest(man, tag=advisories.TAG_PREFIX + "0123456789abcdef")
    _configure(capsys, url, [pair.public])
    plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER]
    assert "advisory left out" in err


def test_no_store_means_no_network_call(site, capsys, tmp_path, monkeypatch):
    from rocforge_build.substitute import stores

    def refuse(*a, **k):
        raise AssertionError("a store was opened with no store configured")
    monkeypatch.setattr(stores, "open_store", refuse)
    plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER] and "advisor" not in err


def test_a_store_that_is_not_there_is_one_warning(site, capsys, tmp_path):
    pair = signing.generate()
    _configure(capsys, "oci+http://127.0.0.1:9/none", [pair.public])
    plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [NEWER]
    assert err.count("no nightly advisories read") == 1 and "Traceback" not in err


@pytest.mark.parametrize("bad", [dict(first="7.15"), dict(reason="two\nlines"), dict(reason="x" * 501),
                                 dict(targets=["gfx1151; rm -rf /"])])
def test_make_document_refuses_what_a_reader_would(bad):
    from rocforge_build.substitute.oci import StoreError

    args = dict(first=GOOD, last=GOOD, targets=["gfx1151"], reason="r", version="t") | bad
    with pytest.raises(StoreError):
        advisories.make_document(**args)


def test_store_advise_nightly_publishes_what_install_honours(site, capsys, tmp_path):
    pair = signing.generate()
    secret = tmp_path / "keys/rocforge.key"
    signing.write_key_pair(secret, tmp_path / "keys/rocforge.pub", pair)
    url = f"file://{tmp_path / 'store'}"
    rc = cli.main(["store", "advise", url, "--nightly", f"{GOOD}..{NEWER}", "--targets", "gfx1151,gfx1150",
                   "--reason", "GPU hang in hipMemcpy", "--key", str(secret)])
    _out, err = capsys.readouterr()
    assert rc == 0, err
    assert "published" in err and pair.key_id in err
    _configure(capsys, url, [pair.public])
    plan, _ = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [OLDER]
    assert "GPU hang in hipMemcpy" in plan["reason"]


@pytest.mark.parametrize("argv,why", [(["--nightly", f"{NEWER}..{GOOD}"], "after"),
                                      (["--nightly", "latest"], "nightly version"),
                                      (["--nightly", GOOD, "--targets", "x86"], "gfx"),
                                      (["KEY", "--nightly", GOOD], "not both")])
def test_store_advise_nightly_refuses_bad_input_in_one_line(capsys, tmp_path, argv, why):
    url = f"file://{tmp_path / 'store'}"
    rc = cli.main(["store", "advise", url, *argv, "--reason", "r"])
    _out, err = capsys.readouterr()
    assert rc != 0 and why in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


@needs("docker-registry")
def test_on_a_real_registry_through_the_cli(site, capsys, tmp_path):
    """Debian's docker-registry: `store advise --nightly` pushes it, `nightly install` skips NEWER."""
    from registry_server import start_registry

    pair = signing.generate()
    secret = tmp_path / "keys/rocforge.key"
    signing.write_key_pair(secret, tmp_path / "keys/rocforge.pub", pair)
    with start_registry(tmp_path) as reg:
        url = reg.store_url("rocforge/advisories")
        rc = cli.main(["store", "advise", url, "--nightly", NEWER, "--reason", "bad kernels",
                       "--key", str(secret)])
        _out, err = capsys.readouterr()
        assert rc == 0, err
        _configure(capsys, url, [pair.public])
        plan, err = _plan(capsys, tmp_path)
    assert [layer["version"] for layer in plan["layers"]] == [GOOD]
    assert "bad kernels" in plan["reason"] and pair.key_id in plan["reason"]


def test_doctor_warns_when_the_current_nightly_has_a_store_advisory(site, capsys, tmp_path, monkeypatch):
    """doctor judges the current nightly by the stores' signed advisories too, not only the
    packaged table (NEWER is in no packaged entry: the warning can only come from the store)."""
    root = tmp_path / "machine"
    fr.make_gpus(root, fr.STRIX_HALO)
    fr.make_system(root)
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(root / "home/alice/.local/share/rocforge"))
    assert cli.main(["--root", str(root), "nightly", "install", "--target", "gfx1151", "--version", NEWER,
                     "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["--root", str(root), "doctor", "--json"]) in (0, 1)
    assert not [w for w in json.loads(capsys.readouterr().out)["warnings"] if "known-bad" in w]
    pair = signing.generate()
    _configure(capsys, _store(tmp_path, pair), [pair.public])
    assert cli.main(["--root", str(root), "doctor", "--json"]) in (0, 1)
    warning = next(w for w in json.loads(capsys.readouterr().out)["warnings"] if "known-bad" in w)
    assert "hangs in rocBLAS init" in warning and pair.key_id in warning and NEWER in warning


def test_doctor_asks_no_store_without_a_current_nightly(capsys, tmp_path, monkeypatch):
    root = tmp_path / "machine"
    fr.make_gpus(root, fr.STRIX_HALO)
    fr.make_system(root)
    _configure(capsys, f"file://{tmp_path / 'not-there'}", [signing.generate().public])
    assert cli.main(["--root", str(root), "doctor", "--json"]) in (0, 1)
    assert not [w for w in json.loads(capsys.readouterr().out)["warnings"] if "advisor" in w]
