"""Hostile and broken inputs met with one clear line, never an internal error (exit 70) or a
broken script: config files that are not UTF-8 or are directories, negative counts, a cut env
cache entry, a ':' in a ROCm path, recipe names and placeholders that reach outside their lane."""

from __future__ import annotations

import subprocess

import fixtures_roots as fr
import pytest
from buildfixtures import project_copy, recipe_copy

from rocforge_build import cli, paths
from rocforge_build.discover import envcache


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


# -- 10. a config file that is not UTF-8 or is a directory ----------------------------------------

@pytest.mark.parametrize("argv", [("config", "list"), ("config", "get", "nightly.keep"),
                                  ("config", "set", "nightly.keep", "2"), ("nightly", "installed")])
def test_config_file_not_utf8(capsys, argv):
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[nightly]\nprefix = \"/opt/\xff\xfe\"\n")  # Latin-1 bytes, not UTF-8
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "is not UTF-8" in one_error(err) and str(path) in err
    assert path.read_bytes().startswith(b"[nightly]")  # left as it was


def test_env_with_a_broken_config_file_is_one_line(tmp_path, capsys):
    """`rocforge env` reads `nightly.prefix` from the config file on every shell start."""
    fr.make_strix_halo(tmp_path)
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_bytes(b"# caf\xe9\n")
    code, out, err = run(capsys, "--root", str(tmp_path), "env")
    assert code == 2 and out == "" and "is not UTF-8" in one_error(err)


@pytest.mark.parametrize("argv", [("config", "list"), ("config", "set", "nightly.keep", "2")])
def test_config_file_is_a_directory(capsys, argv):
    path = paths.config_file()
    path.mkdir(parents=True)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "is a directory" in one_error(err) and path.is_dir()


# -- 13. negative counts and ratios are config errors naming the key ------------------------------

@pytest.mark.parametrize("key,value", [("nightly.keep", "-1"), ("nightly.extract_ratio", "-0.5")])
def test_negative_keep_and_extract_ratio(capsys, key, value):
    code, _, err = run(capsys, "config", "set", key, value)
    assert code == 2 and key in one_error(err) and "at least 0" in err
    assert not paths.config_file().exists()
    table, leaf = key.split(".")
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_text(f"[{table}]\n{leaf} = {value}\n")
    for argv in (("config", "list"), ("nightly", "prune", "--prefix", str(paths.data_dir()))):
        code, _, err = run(capsys, *argv)
        assert code == 2 and key in one_error(err)


def test_negative_keep_on_the_command_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:  # refused while parsing (argtypes.count)
        run(capsys, "nightly", "prune", "--prefix", str(tmp_path), "--keep", "-1")
    assert exc.value.code == 2 and "--keep" in one_error(capsys.readouterr().err)


# -- 11. a cut env cache entry is never served ----------------------------------------------------

def test_truncated_env_cache_entry_is_regenerated(tmp_path, capsys):
    fr.make_strix_halo(tmp_path)
    code, full, _ = run(capsys, "--root", str(tmp_path), "env", "--shell", "bash")
    assert code == 0
    (entry,) = (paths.cache_dir() / "env").iterdir()
    whole = entry.read_bytes()
    assert whole.endswith(full.encode())
    entry.write_bytes(whole[: len(whole) - len(full) // 2])  # header intact, body cut in half
    code, again, _ = run(capsys, "--root", str(tmp_path), "env", "--shell", "bash")
    assert code == 0 and again == full
    assert entry.read_bytes() == whole  # written again, whole
    # the served script is the whole one: a real bash sources it
    res = subprocess.run(["bash", "-c", full + '\nprintf %s "$ROCM_PATH"'], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout == "/opt/rocm", res.stderr


def test_a_flipped_byte_in_the_body_is_a_miss(tmp_path, capsys):
    fr.make_strix_halo(tmp_path)
    _, full, _ = run(capsys, "--root", str(tmp_path), "env")
    (entry,) = (paths.cache_dir() / "env").iterdir()
    data = bytearray(entry.read_bytes())
    i = len(data) - len(full) + full.index("ROCM_PATH=")
    data[i] = ord("X")  # same length, other content
    entry.write_bytes(bytes(data))
    assert envcache.lookup(["--root", str(tmp_path), "env"]) is None
    assert run(capsys, "--root", str(tmp_path), "env")[1] == full


# -- 12. a ':' in a ROCm path ---------------------------------------------------------------------

def test_rocm_path_with_colon_is_refused(tmp_path, capsys):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_therock_tree(tmp_path, inner="/opt/rocm-7:9")
    for shell in ("bash", "fish", "json"):
        code, out, err = run(capsys, "--root", str(tmp_path), "env", "--shell", shell)
        assert code == 2 and out == ""
        line = one_error(err)
        assert "/opt/rocm-7:9" in line and "contains ':'" in line
    assert not (paths.cache_dir() / "env").exists()  # nothing cached: every start says it again
    code, _, err = run(capsys, "--root", str(tmp_path), "env", "--rocm", "/opt/rocm-7:9")
    assert code == 2 and "--rocm /opt/rocm-7:9 contains ':'" in one_error(err)


# -- 13. recipe names and placeholders are plain -------------------------------------------------

@pytest.mark.parametrize("old,new,needle", [
    ('name = "fixture"', 'name = "../../evil"', "recipe.name: '../../evil' is not a plain name"),
    ("[backends.cpu]", '[backends."../cpu"]', "'../cpu' is not a plain name"),
    ('value = "built for {target}"', 'value = "{target.__class__}"',
     "placeholder {target.__class__}"),
    ('value = "built for {target}"', 'value = "{prefix[0]}"', "placeholder {prefix[0]}"),
    ('value = "built for {target}"', 'value = "{target!r}"', "placeholder {target!r}"),
    ('value = "built for {target}"', 'value = "{target:>{prefix}}"', "placeholder {target:>{prefix}}"),
    ('file = "greeting.patch"', 'file = "../fixture/greeting.patch"',
     "'../fixture/greeting.patch' is not a plain name"),
])
def test_recipe_names_and_placeholders_must_be_plain(tmp_path, capsys, old, new, needle):
    recipe = recipe_copy(tmp_path / "r", **{old: new})
    assert new in recipe.read_text()
    for argv in (("recipe", "show", str(recipe)),
                 ("build", str(recipe), "--target", "gfx1030", "--dry-run")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert needle in one_error(err)


def test_plain_placeholders_still_fill(tmp_path, capsys):
    recipe = recipe_copy(tmp_path / "r", **{'value = "built for {target}"':
                                            'value = "{{literal}} for {target} in {prefix}"'})
    code, out, err = run(capsys, "build", str(recipe), "--target", "gfx1030", "--dry-run",
                         "--prefix", str(tmp_path / "p"), "--source", str(project_copy(tmp_path / "src")))
    assert code == 0, err
    assert f"FIXTURE_BUILD_NOTE={{literal}} for gfx1030 in {tmp_path / 'p'}" in out

