"""rocforge's own directories without ROCFORGE_*_DIR: platformdirs' answer, worked out without
importing platformdirs in the plain Linux case (issue 24 item 5), platformdirs' own elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import platformdirs
import pytest

from rocforge_build import paths

REPO = Path(__file__).resolve().parent.parent
KINDS = {"config": "ROCFORGE_CONFIG_DIR", "cache": "ROCFORGE_CACHE_DIR", "data": "ROCFORGE_DATA_DIR"}
XDG = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "ANDROID_DATA", "ANDROID_ROOT")

PLAIN = [  # (HOME, XDG value for every kind): answered without platformdirs
    ("/home/u", None), ("/home/u/", None), ("/", None), ("/home/u", "/x/y"), ("/home/u", "/x/"),
    ("relative-home", "/x"), (None, None), (None, "/x"),
]
OTHER = [  # platformdirs decides (its releases differ on some of these)
    ("/home/u", "relative"), ("/home/u", "   "), ("/home/u", " /x"), ("relative-home", None),
    ("", None),
]


def _answer(fn):
    try:
        return fn()
    except Exception as exc:  # platformdirs refuses some homes: rocforge must refuse alike
        return type(exc)


def _setenv(monkeypatch, home, xdg):
    for var in (*KINDS.values(), *XDG):
        monkeypatch.delenv(var, raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    if xdg is not None:
        for var in XDG[:3]:
            monkeypatch.setenv(var, xdg)


@pytest.mark.parametrize(("home", "xdg"), PLAIN + OTHER)
def test_the_same_directories_as_platformdirs(monkeypatch, home, xdg):
    _setenv(monkeypatch, home, xdg)
    for kind, var in KINDS.items():
        want = _answer(lambda kind=kind: getattr(platformdirs, f"user_{kind}_dir")(
            "rocforge", appauthor=False))
        got = _answer(lambda kind=kind, var=var: paths._dir_str(var, kind))
        assert got == want, (kind, home, xdg)
        fast = paths._xdg_dir(kind)
        if (home, xdg) in PLAIN:
            assert fast == want, (kind, home, xdg)
        else:
            assert fast is None, (kind, home, xdg)


def test_android_is_platformdirs_own(monkeypatch):
    _setenv(monkeypatch, "/home/u", None)
    monkeypatch.setenv("ANDROID_DATA", "/data")
    assert paths._xdg_dir("data") is None


def test_env_without_overrides_does_not_import_platformdirs(tmp_path):
    """A user's shell: no ROCFORGE_*_DIR, HOME set.  `rocforge env` reads config.toml and the
    data dir where platformdirs puts them, and does not import it."""
    root = tmp_path / "root"
    fr.make_strix_halo(root)
    home = tmp_path / "home"
    (home / ".config" / "rocforge").mkdir(parents=True)
    (home / ".config" / "rocforge" / "config.toml").write_text('[nightly]\nprefix = "/opt/mine"\n')
    code = ("import sys, io, contextlib; from rocforge_build.cli import main; from rocforge_build "
            "import config\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['--root', sys.argv[1], 'env'])\n"
            "print(rc, 'platformdirs' in sys.modules, config.nightly_prefix())")
    env = {k: v for k, v in os.environ.items() if k not in (*KINDS.values(), *XDG)}
    env.update(HOME=str(home), ROCFORGE_NO_CACHE="1")
    out = subprocess.run([sys.executable, "-c", code, str(root)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "False", "/opt/mine"]


def test_string_forms_are_what_pathlib_gave(monkeypatch, tmp_path):
    """`rocforge env` asks for its directories as strings (no pathlib import): each is the
    `str()` of the Path the rest of rocforge gets, overrides and a configured prefix too."""
    from rocforge_build import config

    for text in ("/a/b", "a/./b/", "//x/y", "///x", "/", "//", ".", "a/../b", "/x//y/.", "x"):
        assert paths.path_str(text) == str(Path(text)), text
    for override in ("/srv/rf//data/", "rel/data", "/"):
        monkeypatch.setenv("ROCFORGE_DATA_DIR", override)
        monkeypatch.setenv("ROCFORGE_CONFIG_DIR", override)
        assert paths.data_dir_str() == str(paths.data_dir())
        assert paths.builds_prefix_str() == str(paths.builds_prefix())
        assert paths.nightly_prefix_str() == str(paths.nightly_prefix())
        assert paths.config_file_str() == str(paths.config_file())
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for configured in ("~/rocm-nightlies", "rel//dir/", "/abs/../x", ""):
        cfg = {"nightly": {"prefix": configured}}
        want = (Path(configured).expanduser().absolute() if configured
                else paths.nightly_prefix())
        assert config.nightly_prefix_str(cfg) == str(want) == str(config.nightly_prefix(cfg))
