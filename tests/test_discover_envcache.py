"""The validated `rocforge env` cache: answers only while every consulted input is unchanged."""

import os
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import pytest

from rocforge_build import cli, paths
from rocforge_build.discover import envcache

MARK = "# served from the cache\n"


def run_env(capsys, root, *args):
    code = cli.main(["--root", str(root), "env", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def tamper() -> Path:
    """Append a marker to the single cache entry's output (with its length and CRC updated, as
    a whole entry has them): output carrying it came from the cache."""
    (entry,) = (paths.cache_dir() / "env").iterdir()
    magic, sizes, rest = entry.read_text().split("\n", 2)
    size = int(sizes.split()[0])
    output = rest[size:] + MARK
    entry.write_text(f"{magic}\n{size} {len(output)} {envcache._crc(output)}\n{rest[:size]}{output}")
    return entry


def test_second_run_is_served_from_the_cache(tmp_path, capsys):
    fr.make_strix_halo(tmp_path)
    first = run_env(capsys, tmp_path, "--shell", "bash")
    tamper()
    assert run_env(capsys, tmp_path, "--shell", "bash") == first + MARK


def _new_kernels(root):
    fr._tensile(root / "opt/rocm/lib/rocblas/library", "gfx1100", "rocblas")


def _switch_current(root):
    prefix = root / str(paths.nightly_prefix()).lstrip("/")
    os.unlink(prefix / "current")
    os.symlink("v2", prefix / "current")


def _sysfs_changes(root):
    fr.make_gpus(root, fr.RX7900XTX)


def _new_install(root):
    fr.make_classic_rocm(root, "6.4.1", link=False)


def _override_env(root, monkeypatch):
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")


@pytest.mark.parametrize("change", [_new_kernels, _switch_current, _sysfs_changes, _new_install,
                                    _override_env])
def test_a_changed_input_invalidates(tmp_path, capsys, monkeypatch, change):
    fr.make_strix_halo(tmp_path)
    prefix = str(paths.nightly_prefix())
    for v in ("v1", "v2"):
        fr.make_therock_tree(tmp_path, f"7.10.0a2025110{v[1]}", ("gfx1151",), inner=f"{prefix}/{v}")
    os.symlink("v1", tmp_path / prefix.lstrip("/") / "current")
    first = run_env(capsys, tmp_path, "--shell", "bash")
    tamper()
    if change is _override_env:
        change(tmp_path, monkeypatch)
    else:
        change(tmp_path)
    second = run_env(capsys, tmp_path, "--shell", "bash")
    assert MARK not in second
    if change is _switch_current:
        assert "therock 7.10.0a20251102" in second and "therock 7.10.0a20251101" in first
    if change is _sysfs_changes:
        assert "target gfx1100" in second


def test_options_and_shells_have_their_own_entries(tmp_path, capsys):
    fr.make_strix_halo(tmp_path)
    bash = run_env(capsys, tmp_path, "--shell", "bash")
    fish = run_env(capsys, tmp_path, "--shell", "fish")
    assert bash != fish and "set -gx" in fish
    assert run_env(capsys, tmp_path, "--shell", "bash") == bash
    assert len(list((paths.cache_dir() / "env").iterdir())) == 2


def test_damaged_entry_is_a_miss(tmp_path, capsys):
    fr.make_strix_halo(tmp_path)
    first = run_env(capsys, tmp_path)
    (entry,) = (paths.cache_dir() / "env").iterdir()
    entry.write_text(envcache.MAGIC + "\n12\nzz not hex\n")
    assert run_env(capsys, tmp_path) == first


def test_no_cache_switch(tmp_path, capsys, monkeypatch):
    fr.make_strix_halo(tmp_path)
    monkeypatch.setenv("ROCFORGE_NO_CACHE", "1")
    run_env(capsys, tmp_path)
    assert not (paths.cache_dir() / "env").exists()


def test_errors_are_not_cached(tmp_path, capsys):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    assert cli.main(["--root", str(tmp_path), "env"]) == 4
    capsys.readouterr()
    assert not (paths.cache_dir() / "env").exists()


def test_only_plain_env_command_lines_are_cacheable():
    env = {"ROCFORGE_ROOT": "/", "ROCFORGE_SHELL": "zsh"}
    assert envcache._parse(["env", "--shell", "fish", "--target=gfx1151"], env) == (
        "/", "fish", "gfx1151", None)
    # no --shell: the calling shell is part of the key (fish and bash get different scripts)
    assert envcache._parse(["--root", "/r", "env", "--rocm", "/opt/x"], env) == (
        "/r", "zsh", None, "/opt/x")
    for argv in (["env", "--help"], ["env", "--shell"], ["doctor"], ["env", "extra"]):
        assert envcache._parse(argv, env) is None


PLAIN = [["env"], ["--root", "/r", "env"], ["--root=/r", "env", "--shell=fish"],
         ["env", "--shell", "json", "--target", "gfx1151", "--rocm", "/opt/x"],
         ["env", "--target=", "--shell", "zsh", "--shell", "bash"],
         ["env", "--rocm", "/a b", "--target", "x"]]
ARGPARSES = [["env", "--json"], ["env", "--shell", "tcsh"], ["env", "--sh", "bash"],
             ["env", "--target", "-x"], ["env", "--rocm", "--target"], ["env", "--help"],
             ["--version", "env"], ["env", "--", "x"], ["env", "--root", "/r"], ["env", "env"]]


@pytest.mark.parametrize("argv", PLAIN + ARGPARSES)
def test_plain_env_command_lines_skip_argparse_with_its_answers(argv, monkeypatch):
    """An uncached `rocforge env` reads a plain command line without argparse (start-up cost),
    with every field the command uses as argparse gives it; anything else (--json, --help, an
    abbreviation, an error) is still argparse's to read and word."""
    monkeypatch.setenv("ROCFORGE_ROOT", "/from-env")
    fast = cli._plain_env_args(argv)
    if argv in ARGPARSES:
        assert fast is None
        return
    slow = cli.build_parser("env").parse_args(argv)
    for name in ("command", "root", "shell", "json", "target", "rocm"):
        assert getattr(fast, name) == getattr(slow, name), (argv, name)


def test_default_cache_dir_matches_platformdirs(monkeypatch):
    import platformdirs

    monkeypatch.delenv("ROCFORGE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    expected = os.path.join(platformdirs.user_cache_dir("rocforge", appauthor=False), "env")
    assert os.path.dirname(envcache._cache_file("k", os.environ)) == expected


def test_code_stamps_cover_every_module_a_full_run_imports(tmp_path):
    """A change to any rocforge module that shapes the output invalidates the cache: every module
    a full `rocforge env` imports (in a fresh interpreter) is in envcache._CODE, except package
    markers and the error/signal plumbing that never reaches the output."""
    fr.make_strix_halo(tmp_path)
    code = ("import sys, io, contextlib; from rocforge_build.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--root', sys.argv[1], 'env', '--shell', 'bash'])\n"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items()\n"
            "                 if n.startswith('rocforge_build') and getattr(m, '__file__', None)))")
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=repo, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "ROCFORGE_NO_CACHE": "1"})
    assert out.returncode == 0, out.stderr
    pkg = Path(envcache._PKG)
    used = {Path(f).relative_to(pkg).as_posix() for f in out.stdout.split()}
    exempt = {"errors.py", "signals.py"}
    missing = sorted(f for f in used - set(envcache._CODE) - exempt
                     if not f.endswith("__init__.py"))
    assert "discover/resolver.py" in used and not missing, missing
