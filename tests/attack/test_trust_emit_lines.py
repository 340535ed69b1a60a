"""Attack tests: a value that one reader takes as two lines, a terminal that declares ASCII, and a
range named like a shell word each change nothing in what rocforge's scripts do.  Each attack is
performed for real: a build manifest read by `rocforge env`, its dotenv read back as the container
path reads it; the CLI run in a subprocess with PYTHONIOENCODING=ascii and its script run by sh;
preset scripts run by sh, bash, dash and zsh with every keyword and builtin as a range name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import pytest
import yaml
from needs import require
from stackfixtures import make_build
from test_commands_env import _base_env, cli
from test_emit import dump_program

from rocforge_build import shellsafe
from rocforge_build.cli import main
from rocforge_build.discover import envwarnings
from rocforge_build.emit import containerfile
from rocforge_build.errors import ConfigError
from rocforge_build.measure import preset as preset_mod
from rocforge_build.ship.closure import parse_dotenv

REPO = Path(__file__).resolve().parents[2]


# -- 1. a line break another reader sees: U+2028 and friends in a manifest's export_env ------------
def test_a_manifest_value_with_u2028_never_adds_a_variable_to_the_image(tmp_path):
    """The trial: `A6 = "foo<U+2028>LD_PRELOAD=/tmp/evil.so"` went into the dotenv unchanged, and
    the container path's reader (splitlines) made LD_PRELOAD of it.  Every character any reader
    splits at is refused by the emitter (the build's warning says so), and the dotenv reader
    splits at LF only, so the value can never become a second variable."""
    root = tmp_path / "root"
    fr.make_strix_halo(root)
    exports = {"A6": "foo\u2028LD_PRELOAD=/tmp/evil.so", "B7": "\u2028x", "GOOD": "tab\tkept é"}
    breaks = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x1b\x07"  # what splitlines splits at; ESC, BEL
    exports |= {f"C{ord(c)}": f"x{c}LD_AUDIT=/tmp/evil{ord(c)}.so" for c in breaks}
    make_build(root, "odd", "gfx1151", export_env={k: v.replace("{", "{{") for k, v in exports.items()})
    out = cli(root, "env", "--shell", "dotenv")
    assert out.returncode == 0, out.stderr
    parsed = parse_dotenv(out.stdout)  # what containers.Facts reads back from the builder
    assert parsed["GOOD"] == "tab\tkept é"
    assert not {"LD_PRELOAD", "LD_AUDIT", "A6", "B7"} & set(parsed)
    assert not [k for k in parsed if k.startswith("C") and k[1:].isdigit()]
    assert out.stderr.count(": ignored") == len(exports) - 1  # each said on stderr
    assert "LD_PRELOAD" not in containerfile.env(parsed) and "LD_AUDIT" not in containerfile.env(parsed)


@pytest.mark.parametrize("brk", sorted(set("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")))
def test_the_dotenv_reader_splits_lines_as_docker_does(brk):
    """Docker's --env-file reader ends a line at LF only: a dotenv holding U+2028 (not one rocforge
    wrote) is one line whose value would carry a break, so it is refused, never read as two."""
    with pytest.raises(ConfigError) as err:
        parse_dotenv(f"A6=foo{brk}LD_PRELOAD=/tmp/evil.so\nB=1\n")
    assert "line 1" in err.value.message and "A6" in err.value.message
    assert parse_dotenv("A=1\nB=x=y\n# C\n") == {"A": "1", "B": "x=y"}


def test_one_line_strings_in_a_store_refuse_the_same_breaks():
    """A store's one-line fields (a preset's backend, argv words) are held to the emitters' set."""
    from rocforge_build import schema

    for brk in "\u2028\u2029\x85\x0b\x0c\x1c\x1b\x00\n\r":
        with pytest.raises(schema.Bad):
            schema.Str(one_line=True).take(f"cpu{brk}LD_PRELOAD=x", "backend")
    assert schema.Str(one_line=True).take("tab\tok é", "backend") == "tab\tok é"


def test_cached_env_warnings_are_read_back_at_lf_only():
    script = "export A='1'\n# warning: a\u2028# warning: b\x0cc\n"
    assert envwarnings.from_script(script) == ["a\u2028# warning: b\x0cc"]


# -- 2. the one writer: a terminal that declares ASCII gets the file system's bytes -----------------
def _stored(tmp_path: Path, ranges: dict[str, dict], model: str = "m") -> tuple[Path, Path]:
    """A preset whose every range runs a real rocforge build's bin/llama-server: a program that
    writes its argv and environment's V as JSON to $DUMP_OUT."""
    import hashlib

    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.measure.store import Store

    gguf = tmp_path / "m.gguf"  # serve loads only a file whose sha256 is the preset's
    gguf.write_bytes(b"GGUF model bytes")
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    server = dump_program(prefix, "llama-server")
    stamp = read_manifest(prefix).get("stamp")
    data = {"model": {"name": model, "sha256": sha, "path": str(gguf)}, "created": "now",
            "ranges": {name: {"prefix": str(prefix), "backend": "cpu", "stamp": stamp, "depth": 0,
                              "ctx": r["ctx"], "variant": {}, "variant_label": "ub=512", "score": 1.0,
                              "figures": [], "runner_up": None, "env": r["env"], "notes": [],
                              "argv": [str(server), "-m", "/m/m.gguf", *r["args"]],
                              "verified": {"shape": {"ctx": r["ctx"], "ubatch": 512, "fa": False, "ngl": None,
                                                     "kv": "f16", "load": "mmap", "parallel": 1}}}
                       for name, r in ranges.items()}}
    with Store() as s:
        s.add_preset("m", sha, 1, data)
    return prefix, server


def _ascii_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", *args], cwd=REPO, timeout=60,
                          capture_output=True, env={**_base_env(), "PYTHONIOENCODING": "ascii"})


def _run_script(script: bytes, tmp_path: Path, shell: str = "sh", range_env: str | None = None) -> dict:
    out = tmp_path / "dump.json"
    out.unlink(missing_ok=True)
    path = tmp_path / "script.sh"
    path.write_bytes(script)
    env = {"PATH": "/usr/bin:/bin", "DUMP_OUT": str(out), **({"ROCFORGE_RANGE": range_env} if range_env else {})}
    run = subprocess.run([shell, str(path)], capture_output=True, timeout=30, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def test_an_ascii_terminal_gets_every_format_in_the_file_systems_bytes(tmp_path):
    """The trial: with PYTHONIOENCODING=ascii, `é` was printed as the four characters `\\xe9`
    inside quotes, so the sourced value was `\\xe9`.  Every format reaches stdout through
    shellsafe.write_script: the bytes are UTF-8 of the value, and sh gives é back."""
    value = "é 漢字"
    _stored(tmp_path, {"short": {"ctx": 4096, "env": {"V": value}, "args": ["--alias", value]}},
            model=f"m {value}")
    shown = _ascii_cli("preset", "show", "m", "--shell")
    assert shown.returncode == 0, shown.stderr
    assert value.encode() in shown.stdout and b"\\x" not in shown.stdout and b"\\u" not in shown.stdout
    assert _run_script(shown.stdout, tmp_path) == {"argv": ["-m", "/m/m.gguf", "--alias", value], "V": value}
    for fmt in ("shell", "llama-swap", "systemd"):
        out = _ascii_cli("preset", "export", "m", "--format", fmt)
        assert out.returncode == 0, (fmt, out.stderr)
        assert value.encode() in out.stdout and b"\\x" not in out.stdout, fmt
    swap = yaml.safe_load(_ascii_cli("preset", "export", "m", "--format", "llama-swap").stdout.decode())
    (entry,) = swap["models"].values()
    assert entry["env"] == [f"V={value}"] and value in entry["cmd"]
    plain = _ascii_cli("preset", "show", "m")
    assert plain.returncode == 0 and value.encode() in plain.stdout, plain.stderr
    dry = _ascii_cli("serve", "m", "--dry-run", "--port", "8099")
    assert dry.returncode == 0, dry.stderr
    assert b"\\x" not in dry.stdout
    assert _run_script(dry.stdout, tmp_path)["V"] == value


# -- 3. range names that are shell words ------------------------------------------------------------
def _shell_words() -> list[str]:
    """Every keyword and builtin of bash (`compgen -k -b`) and, where installed, zsh, plus dash's
    builtins and the commands a script calls, that a range name (letters, digits, '_') can be."""
    words = set(subprocess.run(["bash", "-c", "compgen -k -b"], capture_output=True, text=True,
                               check=True, timeout=30).stdout.split())
    if shutil.which("zsh"):
        words |= set(subprocess.run(["zsh", "-fc", "print -l ${(k)reswords} ${(k)builtins}"],
                                    capture_output=True, text=True, check=True, timeout=30).stdout.split())
    words |= {"esac", "in", "do", "done", "fi", "then", "elif", "exec", "env", "command", "chdir",
              "printenv", "sh", "llama_server", "case", "function", "select", "coproc", "time"}
    return sorted(w for w in words if shellsafe.is_env_name(w))


def _range(name: str, ctx: int) -> dict:
    return {"prefix": "/usr", "backend": "cpu", "depth": 0, "ctx": ctx, "variant_label": "v",
            "score": 1.0, "runner_up": None, "figures": [], "notes": [],
            "env": {"RANGE_GOT": name}, "argv": ["/usr/bin/printenv", "RANGE_GOT"]}


@pytest.mark.parametrize("shell", ["sh", "bash", "dash", "zsh"])
def test_every_keyword_and_builtin_is_a_safe_range_name(tmp_path, shell):
    """The trial: `if() {…}` is a syntax error, `exec()` a bad function name in dash, and `env()`
    replaced the `env` the other ranges called.  The script defines no function: a `case` with
    quoted patterns execs each range's line, so every name runs its own command, in every shell."""
    require(shell)
    names = _shell_words()
    assert {"if", "exec", "env", "esac", "while", "export", "cd"} <= set(names), names
    ranges = {n: _range(n, 1000 + i) for i, n in enumerate(names)}  # the last name is the default
    preset = {"model": {"name": "m", "sha256": "0" * 64, "path": "/m"}, "created": "now", "ranges": ranges}
    script = tmp_path / "preset.sh"
    script.write_text(preset_mod.render(preset_mod.checked(preset, "the test's preset"), shell=True))
    failed = {}
    for name in [None, *names]:
        env = {"PATH": "/usr/bin:/bin", **({"ROCFORGE_RANGE": name} if name else {})}
        run = subprocess.run([shell, str(script)], capture_output=True, text=True, timeout=30, env=env)
        if (run.returncode, run.stdout) != (0, f"{name or names[-1]}\n"):
            failed[name] = (run.returncode, run.stdout, run.stderr[-200:])
    assert failed == {}
    run = subprocess.run([shell, str(script)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "ROCFORGE_RANGE": "nonesuch"})
    assert run.returncode == 2 and run.stdout == "" and "ROCFORGE_RANGE" in run.stderr


def test_preset_show_shell_with_shell_word_ranges_runs_each_range(tmp_path, capsys):
    """Through the CLI: ranges `if`, `exec` and `env` each run the build's program with its own
    environment, never another range's `env` function."""
    _stored(tmp_path, {"if": {"ctx": 1024, "env": {"V": "if"}, "args": ["if"]},
                       "exec": {"ctx": 2048, "env": {"V": "exec"}, "args": ["exec"]},
                       "env": {"ctx": 4096, "env": {"V": "env"}, "args": ["env"]}})
    assert main(["preset", "show", "m", "--shell"]) == 0
    script = capsys.readouterr().out.encode()
    for shell in ("sh", "bash", "dash"):
        for name in ("if", "exec", "env"):
            got = _run_script(script, tmp_path, shell, name)
            assert got == {"argv": ["-m", "/m/m.gguf", name], "V": name}, (shell, name)
        assert _run_script(script, tmp_path, shell)["V"] == "env"  # the longest context
