"""One emitter per output format (issue 30, item 1): a structural test that no other module
writes a format's text, hostile strings round-tripped through each emitter and its real consumer
(bash, zsh, dash, fish, `systemd-analyze verify` and systemd's quoting rules, PyYAML, the
Containerfile reader, sed + sh on a copy of /etc/default/grub), and the trial's attacks:
a preset that opens a second `[Service]` or adds a llama-swap model, a model path with quotes and
`$(...)`, and a single-quoted `$(...)` in GRUB_CMDLINE_LINUX_DEFAULT that `host plan` must keep
single-quoted (grub-mkconfig sources the file as root).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import host_roots as hr
import pytest
import stackfixtures
import yaml
from needs import needs, require
from test_commands_env import cli
from test_ship_containers import parse_containerfile

from rocforge_build import cli as rf_cli
from rocforge_build import shellsafe
from rocforge_build.emit import containerfile, kernel_cmdline, launcher, systemd, yaml_swap
from rocforge_build.errors import RocforgeError
from rocforge_build.ship.closure import parse_dotenv

PACKAGE = Path(__file__).resolve().parent.parent / "rocforge_build"

# -- 1. structure: a format's tokens appear in no string outside its emitter ------------------------
# Each format: a pattern over the package's string literals (f-string fields read as `{}`,
# docstrings left out) and the modules allowed to hold it.  Reading code is not listed: no
# exceptions are needed, since each format's reader lives with its writer.
SH = {"shellsafe.py", "discover/envscript.py", "emit/launcher.py"}
FORMATS = {
    "POSIX sh": (r"(?m)^\s*export (\{\}|[A-Za-z_]\w*)=|^\s*unset (\{\}|[A-Z_][A-Z0-9_]*)$|#!/bin/sh|"
                 r"\bexec env\b|\(\) \{ ", SH),
    "fish": (r"\bset -(gx|e) ", {"discover/envscript.py"}),
    "systemd unit": (r"ExecStart|\[(Service|Unit|Install)\]|\bEnvironment=|WantedBy=", {"emit/systemd.py"}),
    "YAML (llama-swap)": (r"(?m)^\s*-?\s*(cmd|models|checkEndpoint):", {"emit/yaml_swap.py"}),
    "Containerfile": (r"(?m)^(ENV|LABEL) (\{\}|[A-Za-z_][\w.-]*=|$)|^(RUN|CMD|ENTRYPOINT) (\{\}|\[|--)",
                      {"emit/containerfile.py"}),
    "GRUB / kernel command line": (r"GRUB_CMDLINE|\bsed -i", {"emit/kernel_cmdline.py"}),
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def string_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal but docstrings; an f-string's fields become `{}`."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}"
                                             for v in node.values)))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skip and id(node) not in inner):
            out.append((node.lineno, node.value))
    return out


def format_writers(source: str, rel: str) -> list[str]:
    """Where `source` (the module `rel`) writes a format it does not own."""
    found = []
    for line, text in string_literals(source):
        for fmt, (pattern, owners) in FORMATS.items():
            if rel not in owners and re.search(pattern, text):
                found.append(f"{rel}:{line}: {fmt}: {text[:60]!r}")
    return found


def test_every_format_is_written_by_its_emitter_only():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += format_writers(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix())
    assert found == [], "format text outside its emitter (hand the emitter typed values):\n" + "\n".join(found)


@pytest.mark.parametrize("fmt, code", [  # the trial's pasted text, as it was written before
    ("systemd unit", 'lines = ["[Unit]", "", "[Service]"]'),
    ("systemd unit", 'lines += [f"Environment={q(k)}" for k in env]'),
    ("YAML (llama-swap)", 'lines = ["models:", f"    cmd: {json.dumps(c)}"]'),
    ("POSIX sh", 'out.append(f"exec env {cmd} \\"$@\\"")'),
    ("POSIX sh", 'lines.append(f"export {k}={v}")'),
    ("POSIX sh", 'lines.append(f"unset {k}")'),
    ("Containerfile", 'body = "ENV " + pairs'),
    ("Containerfile", 'step = f"RUN {body}"'),
    ("GRUB / kernel command line", 'line = f\'GRUB_CMDLINE_LINUX_DEFAULT="{x}"\''),
    ("fish", 'f"set -gx {k} {q}"'),
])
def test_the_structural_check_finds_pasted_formats(fmt, code):
    assert [f for f in format_writers(code, "measure/elsewhere.py") if f": {fmt}: " in f], code


def test_docstrings_and_prose_are_not_formats():
    code = '"""Writes ExecStart= and ENV lines."""\nhelp = "ENV from the env, LABEL from the manifest"\n'
    assert format_writers(code, "commands/x.py") == []


# Every script or format a command prints goes through shellsafe.write_script (the file system's
# bytes, whatever encoding stdout declares): a print() or sys.stdout.write() of what a format maker
# returned is found, directly or through a name it was bound to.  json.dumps output is ASCII.
FORMAT_MAKERS = {"render", "export", "render_script", "render_facts", "sh_command", "sh_export",
                 "sh_word", "sh_quote", "fish_quote", "comment", "dotenv_line", "models_entry",
                 "service", "tee_line", "quote", "join"}


def _maker_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    if name == "join":  # shlex.join is a format; ", ".join of prose is not
        return isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "shlex"
    return name in FORMAT_MAKERS


def _holds_format(node: ast.AST, bound: set[str]) -> bool:
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "dumps":
        return False
    if _maker_call(node) or (isinstance(node, ast.Name) and node.id in bound):
        return True
    return any(_holds_format(c, bound) for c in ast.iter_child_nodes(node))


def _to_stdout(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name) and f.id == "print":
        dest = next((k.value for k in call.keywords if k.arg == "file"), None)
        return dest is None or ast.unparse(dest) == "sys.stdout"
    return isinstance(f, ast.Attribute) and f.attr == "write" and ast.unparse(f.value).startswith("sys.stdout")


def format_prints(source: str, rel: str) -> list[str]:
    """Where `source` prints a format other than through shellsafe.write_script."""
    tree = ast.parse(source)
    bound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _holds_format(n.value, set())
             for t in n.targets if isinstance(t, ast.Name)}
    return [f"{rel}:{n.lineno}: {ast.unparse(n)[:70]}" for n in ast.walk(tree)
            if isinstance(n, ast.Call) and _to_stdout(n)
            and any(_holds_format(a, bound) for a in [*n.args, *(k.value for k in n.keywords)])]


def test_commands_print_formats_only_through_the_one_writer():
    found = []
    for path in sorted([*(PACKAGE / "commands").glob("*.py"), PACKAGE / "cli.py"]):
        found += format_prints(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix())
    assert found == [], "a format printed past shellsafe.write_script:\n" + "\n".join(found)


@pytest.mark.parametrize("code", [  # the trial's commands, as they printed before
    'print(render(preset, shell=args.shell, only=args.range), end="")',
    'print(export(preset, args.format, args.range, args.host, args.port), end="")',
    'line = shellsafe.sh_command(p.argv, env)\nif dry:\n    print(line)',
    'script = host_plan.render_script(p)\nprint(script, end="")',
    'print(shlex.join(steps.stage))',
    'sys.stdout.write(envscript.render(res, shell))',
])
def test_the_writer_check_finds_a_direct_print(code):
    assert format_prints(code, "commands/x.py"), code
    assert format_prints("import json\nprint(json.dumps({'a': render(p)}))\n"
                         "print(', '.join(names))\nshellsafe.write_script(render(p))\n"
                         "print(render(p), file=out)\n", "commands/x.py") == []


# -- 2. hostile strings through each emitter and its real consumer ---------------------------------
def hostile(mark: Path) -> list[str]:
    """One-line strings that run `touch MARK` or change meaning if a consumer reads them as code."""
    return ["plain", "two  words", "it's", 'say "hi"', f"$(touch {mark})", f"`touch {mark}`",
            "$HOME $$ %", "%i %% %n", f"a;touch {mark};#", "back\\slash\\", "tab\there",
            "é ü 漢字", "-leading", "=x=y", "#hash", "*?[a]~", "!! &&", "\\n\\t\\\\", "{}"]


# Every character any reader takes as a line break (str.splitlines, sh, Docker) and every other
# C0 control but TAB, inside a value that would otherwise be fine.
REFUSED = ["new\nline", "carriage\rreturn", "nul\0byte",
           *(f"a{c}b" for c in sorted(shellsafe.LINE_BREAKS)), "foo\u2028LD_PRELOAD=/tmp/evil.so"]


def dump_program(prefix: Path, name: str = "dump") -> Path:
    """prefix/bin/NAME: an executable that writes its argv and $V as JSON to $DUMP_OUT."""
    return stackfixtures.program(prefix, name, f"#!{sys.executable}\nimport json, os, sys\n"
                                 "json.dump({'argv': sys.argv[1:], 'V': os.environ.get('V')}, "
                                 "open(os.environ['DUMP_OUT'], 'w'))\n")


@pytest.mark.parametrize("shell", ["bash", "zsh", "dash"])
def test_sh_export_and_command_round_trip(tmp_path, shell):
    require(shell)
    mark = tmp_path / "MARK"
    values = hostile(mark) + [""]
    exe = dump_program(tmp_path)
    out = tmp_path / "out.json"
    for value in values:
        script = tmp_path / "s.sh"
        script.write_text(f"{shellsafe.sh_export('V', value)}\nprintf '%s' \"$V\" > {shellsafe.sh_quote(str(out))}\n"
                          f"{shellsafe.sh_command([str(exe), value, '-x'], {'V': value})}\n")
        run = subprocess.run([shell, "-c", '. "$0"', str(script)], env={"PATH": "/usr/bin:/bin",
                             "DUMP_OUT": str(out)}, capture_output=True, timeout=30)
        assert run.returncode == 0, run.stderr
        assert json.loads(out.read_text()) == {"argv": [value, "-x"], "V": value}, value
    assert not mark.exists()


def test_sh_refuses_what_a_line_cannot_hold():
    for value in REFUSED:
        with pytest.raises(RocforgeError):
            shellsafe.sh_export("V", value)
        with pytest.raises(RocforgeError):
            shellsafe.sh_command(["/bin/echo", value])
        with pytest.raises(RocforgeError):
            shellsafe.sh_command(["/bin/echo"], {"V": value})
    for name in ["X;touch M", "1X", "A-B", "", "X\nY", "É"]:
        with pytest.raises(RocforgeError):
            shellsafe.sh_command(["/bin/echo"], {name: "1"})
        with pytest.raises(RocforgeError):
            shellsafe.sh_dispatch("R", {name: "true"}, name)
    with pytest.raises(RocforgeError):
        shellsafe.sh_command([])


def test_line_breaks_hold_every_break_a_reader_splits_at():
    """`str.splitlines` (what a Python reader of a dotenv would use) splits at these, sh and
    Docker at LF only: the emitters refuse all of them, and every C0 control but TAB."""
    splits = {chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".splitlines()) > 1}
    controls = {chr(c) for c in range(0x20)} - {"\t"}
    assert splits | controls == set(shellsafe.LINE_BREAKS)
    assert {"\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"} <= splits


def test_sh_dispatch_runs_only_a_named_range(tmp_path):
    mark = tmp_path / "MARK"
    text = "\n".join(shellsafe.sh_dispatch("ROCFORGE_RANGE", {"short": "echo short", "long": "echo long"},
                                           "long")) + "\n"
    for value, code, out in [(None, 0, "long\n"), ("short", 0, "short\n"),
                             (f"touch {mark}", 2, ""), ("rm", 2, "")]:
        env = {"PATH": "/usr/bin:/bin", **({"ROCFORGE_RANGE": value} if value else {})}
        run = subprocess.run(["sh", "-c", text], env=env, capture_output=True, text=True, timeout=30)
        assert (run.returncode, run.stdout) == (code, out), value
    assert not mark.exists()


@needs("fish")
def test_fish_quote_round_trips(tmp_path):
    mark = tmp_path / "MARK"
    for value in hostile(mark) + ["new\nline", "carriage\rreturn", ""]:
        code = f"set -gx V {shellsafe.fish_quote(value)}; printf '%s' \"$V\""
        run = subprocess.run(["fish", "--no-config", "-c", code], capture_output=True, timeout=30)
        assert run.returncode == 0, run.stderr
        assert run.stdout == value.encode(), value
    assert not mark.exists()


def test_dotenv_lines_are_literal(tmp_path):
    for value in hostile(tmp_path / "MARK"):
        assert parse_dotenv(shellsafe.dotenv_line("V", value) + "\n") == {"V": value}
    for value in REFUSED:
        with pytest.raises(RocforgeError):
            shellsafe.dotenv_line("V", value)


# systemd.syntax(7) "Quoting", systemd.unit(5) "Specifiers", systemd.service(5) "Command lines"
_C_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v", "s": " "}


def systemd_words(value: str) -> list[str]:
    """A setting's value split and unquoted as systemd does (double or single quotes, C escapes)."""
    words, i = [], 0
    while i < len(value):
        if value[i].isspace():
            i += 1
            continue
        quote = value[i] if value[i] in "\"'" else None
        i += 1 if quote else 0
        word = []
        while i < len(value) and (value[i] != quote if quote else not value[i].isspace()):
            if value[i] == "\\":
                word.append(_C_ESCAPES[value[i + 1]])
                i += 2
            else:
                word.append(value[i])
                i += 1
        assert not quote or i < len(value), f"unbalanced quoting: {value!r}"
        i += 1 if quote else 0
        words.append("".join(word))
    return words


def unspecify(word: str) -> str:
    """`%%` -> `%`; any other specifier would be replaced by systemd: none may be left."""
    assert re.fullmatch(r"([^%]|%%)*", word), f"a specifier systemd would expand: {word!r}"
    return word.replace("%%", "%")


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> settings -> values, as systemd reads the file (each section once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        assert not line.endswith("\\"), f"a continuation line: {line!r}"
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        if line.startswith("["):
            assert line not in sections, f"a second {line}"
            current = sections.setdefault(line, {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None, line
        current.setdefault(key, []).append(value)
    return sections


def exec_start(value: str) -> list[str]:
    words = [unspecify(w) for w in systemd_words(value)]
    for w in words[1:]:
        assert re.fullmatch(r"([^$]|\$\$)*", w), f"a variable systemd would expand: {w!r}"
    return words[:1] + [w.replace("$$", "$") for w in words[1:]]


def _verify(tmp_path: Path, unit: str) -> None:
    """`systemd-analyze verify` on the unit (it checks quoting, specifiers and that the program
    exists); skipped where systemd is missing."""
    if shutil.which("systemd-analyze") is None:
        return
    path = tmp_path / "rocforge-test.service"
    path.write_text(unit)
    run = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_systemd_unit_round_trips(tmp_path):
    mark = tmp_path / "MARK"
    exe = dump_program(tmp_path / "odd %i $HOME dir")  # `%` and `$` in the program's own path
    values = hostile(mark)
    unit = systemd.service(comment="c %i\n[Service]\\", description="d %n\\", env={"V": " ".join(values)},
                           argv=[str(exe), *values])
    parsed = parse_unit(unit)
    assert list(parsed) == ["[Unit]", "[Service]", "[Install]"]
    service = parsed["[Service]"]
    assert exec_start(service["ExecStart"][0]) == [str(exe), *values]
    (env,) = [[unspecify(w) for w in systemd_words(v)] for v in service["Environment"]]
    assert env == ["V=" + " ".join(values)]
    _verify(tmp_path, unit)
    assert not mark.exists()


@needs("systemd-analyze")
def test_systemd_analyze_reads_the_program_the_emitter_wrote(tmp_path):
    """systemd checks that ExecStart's program exists: found under a name with spaces, `%`, `$`."""
    exe = dump_program(tmp_path / "a b %i %% $X")
    _verify(tmp_path, systemd.service(comment="c", description="d", env={}, argv=[str(exe)]))
    missing = systemd.service(comment="c", description="d", env={}, argv=[str(exe) + "-not"])
    with pytest.raises(AssertionError):
        _verify(tmp_path, missing)  # the check can fail: a program that is not there


def test_systemd_refuses_what_a_unit_cannot_hold():
    for value in REFUSED:
        with pytest.raises(RocforgeError):
            systemd.service(comment="c", description="d", env={}, argv=["/bin/true", value])
        with pytest.raises(RocforgeError):
            systemd.service(comment="c", description="d", env={"V": value}, argv=["/bin/true"])
    for program in ["relative", "/a\"b", "/a'b", "/a\\b", "/a\tb"]:  # systemd refuses these names
        with pytest.raises(RocforgeError):
            systemd.service(comment="c", description="d", env={}, argv=[program])
    with pytest.raises(RocforgeError):
        systemd.service(comment="c", description="d", env={"X;Y": "1"}, argv=["/bin/true"])


def test_llama_swap_yaml_round_trips(tmp_path):
    mark = tmp_path / "MARK"
    values = [v for v in hostile(mark) if "${" not in v]
    model = "m:\n  evil:\n    cmd: touch " + str(mark)
    text = yaml_swap.models_entry(comment="c\nmodels:", model=model, argv=["/p/bin/llama-server", *values],
                                  env={"V": " ".join(values)})
    data = yaml.safe_load(text)
    assert list(data) == ["models"] and list(data["models"]) == [model]
    entry = data["models"][model]
    assert shlex.split(entry["cmd"]) == ["/p/bin/llama-server", *values, "--port", "${PORT}"]
    assert entry["env"] == ["V=" + " ".join(values)]
    for bad in [*REFUSED, "${PORT}x"]:
        with pytest.raises(RocforgeError):
            yaml_swap.models_entry(comment="c", model="m", argv=["/p", bad], env={})
        with pytest.raises(RocforgeError):
            yaml_swap.models_entry(comment="c", model="m", argv=["/p"], env={"V": bad})


def dockerfile_pairs(args: str) -> dict[str, str]:
    """ENV/LABEL `key="value"` pairs as BuildKit reads them (the Dockerfile reference: inside
    double quotes a backslash escapes the next character)."""
    out, i = {}, 0
    while i < len(args):
        if args[i].isspace():
            i += 1
            continue
        eq = args.index("=", i)
        key, i = args[i:eq], eq + 1
        assert args[i] == '"', args[i:]
        i += 1
        value = []
        while args[i] != '"':
            if args[i] == "\\":
                i += 1
            value.append(args[i])
            i += 1
        out[key] = "".join(value)
        i += 1
    return out


def test_containerfile_values_and_run_words_round_trip(tmp_path):
    mark = tmp_path / "MARK"
    values = {f"V{i}": v for i, v in enumerate(hostile(mark))}
    instrs = parse_containerfile(containerfile.env(values) + "\n" + containerfile.label(
        {f"org.example.v{i}": v for i, v in enumerate(values.values())}) + "\n")
    assert [w for w, _ in instrs] == ["ENV", "LABEL"]
    assert dockerfile_pairs(instrs[0][1]) == values
    assert list(dockerfile_pairs(instrs[1][1]).values()) == list(values.values())
    words = containerfile.shell_words(list(values.values()), "RUN")  # RUN runs /bin/sh -c
    run = subprocess.run(["sh", "-c", f"printf '%s\\0' {words}"], capture_output=True, timeout=30)
    assert run.stdout.decode().split("\0")[:-1] == list(values.values())
    for bad in REFUSED:
        with pytest.raises(RocforgeError):
            containerfile.env({"V": bad})
        with pytest.raises(RocforgeError):
            containerfile.label({"k": bad})
        with pytest.raises(RocforgeError):
            containerfile.shell_words([bad], "RUN")
    assert not mark.exists()


@needs("buildah")
def test_containerfile_env_and_labels_reach_the_image_byte_for_byte(tmp_path):
    """The real consumer: buildah builds `FROM scratch` plus the emitter's ENV and LABEL (no RUN,
    so no isolation is needed) into its own storage under tmp_path; the image's config holds
    exactly the values."""
    values = {f"V{i}": v for i, v in enumerate(hostile(tmp_path / "MARK") + [""])}
    labels = {f"org.example.v{i}": v for i, v in enumerate(values.values())}
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Containerfile").write_text(f"FROM scratch\n{containerfile.env(values)}\n{containerfile.label(labels)}\n")
    store = ["--root", str(tmp_path / "storage"), "--runroot", str(tmp_path / "run"), "--storage-driver", "vfs"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "BUILDAH_ISOLATION": "chroot"}
    build = subprocess.run(["buildah", *store, "build", "-q", "-t", "localhost/rocforge-emit-test",
                            "-f", str(ctx / "Containerfile"), str(ctx)],
                           capture_output=True, text=True, timeout=300, env=env)
    assert build.returncode == 0, build.stderr
    look = subprocess.run(["buildah", *store, "inspect", "--type", "image", "localhost/rocforge-emit-test"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert look.returncode == 0, look.stderr
    config = json.loads(look.stdout)["OCIv1"]["config"]
    got = dict(e.split("=", 1) for e in config["Env"])
    assert {k: got[k] for k in values} == values
    assert {k: config["Labels"][k] for k in labels} == labels


KERNEL_WORDS = ["quiet", "a=$(touch {mark})", "b=`touch {mark}`", "c='x'", "d=\\", "e=%&|<>",
                "f=;touch {mark};", "g=é", "-h", "i=a b", "j=$HOME", "k=#x", "ttm.pages_limit=31719424"]


def _source_grub(path: Path, var: str) -> str:
    """The value grub-mkconfig gets when it sources the file (sh, as it does)."""
    run = subprocess.run(["sh", "-c", f'. "$0" && printf %s "${var}"', str(path)],
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.parametrize("before", ['"quiet splash"', "'quiet $(touch {mark})'", "quiet"])
def test_grub_rewrite_round_trips_through_sed_and_sh(tmp_path, before):
    mark = tmp_path / "MARK"
    words = [w.format(mark=mark) for w in KERNEL_WORDS]
    grub = tmp_path / "grub"
    grub.write_text(hr.GRUB_DEBIAN.replace('"{default}"', before.format(mark=mark)))
    found = kernel_cmdline.grub_find(grub.read_bytes())["GRUB_CMDLINE_LINUX_DEFAULT"]
    cmd = kernel_cmdline.grub_rewrite("GRUB_CMDLINE_LINUX_DEFAULT", found, words, str(grub))
    assert "sudo env LC_ALL=C sed -i.rocforge.bak " in cmd
    subprocess.run(["sh", "-c", cmd.replace("sudo env ", "env ")], check=True, timeout=30)
    expected = kernel_cmdline.line(words)
    assert _source_grub(grub, "GRUB_CMDLINE_LINUX_DEFAULT") == expected
    assert dict(kernel_cmdline.grub_lines(grub.read_text()))["GRUB_CMDLINE_LINUX_DEFAULT"] == expected
    assert 'i="a b"' in expected  # a value with a space stays one kernel parameter
    assert not mark.exists()


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
def test_tee_lines_write_the_text_exactly(tmp_path, shell):
    """`host plan`'s `... | sudo tee FILE` lines (dash's echo reads backslashes: printf then)."""
    require(shell)
    mark = tmp_path / "MARK"
    for text in [*hostile(mark), "-n", "-e \\c", "a\\cb", ""]:
        target = tmp_path / "out"
        cmd = shellsafe.tee_line(text, "/etc/kernel/cmdline").replace(
            "sudo tee /etc/kernel/cmdline", f"tee {shellsafe.sh_quote(str(target))} >/dev/null")
        subprocess.run([shell, "-c", cmd], check=True, timeout=30)
        assert target.read_text() == text + "\n", text
    assert not mark.exists()


def test_grub_append_and_loader_options_round_trip(tmp_path):
    mark = tmp_path / "MARK"
    words = [w.format(mark=mark) for w in KERNEL_WORDS]
    grub = tmp_path / "grub"
    grub.write_text("GRUB_TIMEOUT=5\n")
    cmd = kernel_cmdline.grub_append(words).replace(
        "sudo tee -a /etc/default/grub", f"tee -a {shellsafe.sh_quote(str(grub))} >/dev/null")
    subprocess.run(["sh", "-c", cmd], check=True, timeout=30)
    assert _source_grub(grub, "GRUB_CMDLINE_LINUX_DEFAULT") == kernel_cmdline.line(words)
    entry = tmp_path / "arch.conf"
    entry.write_text("title Arch\noptions root=/dev/sda1 rw\n")
    cmd = kernel_cmdline.loader_options("/boot/loader/entries/arch.conf", words)
    local = cmd.replace("sudo ", "", 1).replace(" /boot/loader/entries/arch.conf", f" {entry}")
    subprocess.run(["sh", "-c", local], check=True, timeout=30)
    assert entry.read_text() == f"title Arch\noptions {kernel_cmdline.line(words)}\n"
    assert not mark.exists()


def test_kernel_parameters_outside_the_grammar_are_refused():
    for word in ['x="q"', 'x="a b"', "", "=v", "new\nline", "nul\0", "cr\r"]:
        with pytest.raises(RocforgeError):
            kernel_cmdline.grub_assignment("GRUB_CMDLINE_LINUX_DEFAULT", ["quiet", word])


@pytest.mark.parametrize("rhs, value", [
    ('"quiet splash"', "quiet splash"), ("'quiet $(x)'", "quiet $(x)"), ("quiet", "quiet"),
    ('"a \\"b\\" \\$c"', 'a "b" $c'), ('"x" # note', "x"), ("''", ""),
    ('"quiet $(touch M)"', None), ('"$GRUB_CMDLINE_LINUX_DEFAULT x"', None), ("`id`", None),
    ("a;touch M", None), ("a b", None), ("'unterminated", None), ('"a" && b', None),
])
def test_grub_lines_read_what_sh_would_without_running_it(rhs, value):
    assert kernel_cmdline.literal(rhs) == value


def test_bundle_launcher_round_trips(tmp_path):
    mark = tmp_path / "MARK"
    values = hostile(mark)
    tree = tmp_path / "my bundle $(x)"
    tree.mkdir()
    env = {f"V{i}": v for i, v in enumerate(values)} | {"IN_HERE": "${here}/lib:${here}/it's"}
    (tree / "run").write_text(launcher.render(head=["h\nexport X=1"], where="run", env=env, left_out={},
                                              gfx_override=("why", "11.0.0")))
    run = subprocess.run(["sh", str(tree / "run"), "/usr/bin/env", "-0"], capture_output=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    got = dict(e.split("=", 1) for e in run.stdout.decode().split("\0") if e)
    assert {k: got[k] for k in env} == env | {"IN_HERE": f"{tree}/lib:{tree}/it's"}
    assert got["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0" and "X" not in got
    for bad in REFUSED:
        with pytest.raises(RocforgeError):
            launcher.render(head=[], where="run", env={"V": bad}, left_out={}, gfx_override=None)
    assert not mark.exists()


# -- 3. the trial's attacks, through the CLI ---------------------------------------------------------
def _stored_preset(tmp_path: Path, *, model: str = "m", label: str = "ub=512",
                   argv_extra: tuple[str, ...] = (), env: dict | None = None) -> Path:
    """A preset in the results store whose program is a real rocforge build's bin/llama-server."""
    from stackfixtures import make_build

    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.measure.store import Store

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = prefix / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(dump_program(tmp_path / "dump"), exe)
    stamp = read_manifest(prefix).get("stamp")
    data = {"model": {"name": model, "sha256": "ab" * 32, "path": "/m/m.gguf"}, "created": "now",
            "ranges": {"short": {"prefix": str(prefix), "backend": "cpu", "stamp": stamp, "depth": 0,
                                 "ctx": 4096, "variant": {}, "variant_label": label, "score": 1.0,
                                 "figures": [], "runner_up": None, "env": env or {},
                                 "argv": [str(exe), "-m", "/m/m.gguf", *argv_extra], "notes": [],
                                 "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": False, "ngl": None, "kv": "f16", "load": "mmap", "parallel": 1}}}}}
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, data)
    return exe


SECOND_SERVICE = "x\n[Service]\nExecStartPre=/usr/bin/touch {mark}\n"


def test_a_preset_cannot_open_a_second_service_section(tmp_path, capsys):
    mark = tmp_path / "MARK"
    bad = SECOND_SERVICE.format(mark=mark)
    _stored_preset(tmp_path, model=f"m{bad}", label=f"ub=512{bad}")
    # a model name and a variant label are free text the store keeps: the emitter keeps them in
    # their one-line comment and description
    assert rf_cli.main(["preset", "export", "m", "--format", "systemd"]) == 0
    out = capsys.readouterr().out
    parsed = parse_unit(out)
    assert list(parsed) == ["[Unit]", "[Service]", "[Install]"]
    assert "ExecStartPre" not in parsed["[Service]"] and not any(
        ln.startswith("ExecStartPre") for ln in out.splitlines())
    _verify(tmp_path, out)


def test_a_preset_cannot_add_a_llama_swap_model(tmp_path, capsys):
    mark = tmp_path / "MARK"
    model = f"m\n  evil:\n    cmd: touch {mark}\n"
    _stored_preset(tmp_path, model=model, env={"V": "v"})
    assert rf_cli.main(["preset", "export", "m", "--format", "llama-swap"]) == 0
    out = capsys.readouterr().out
    assert list(yaml.safe_load(out)["models"]) == [model]


def test_a_model_path_with_quotes_and_a_command_reaches_systemd_as_one_word(tmp_path, capsys):
    mark = tmp_path / "MARK"
    path = f"/m/it's \"$(touch {mark})\" `id` %i $HOME.gguf"
    exe = _stored_preset(tmp_path, argv_extra=("--alias", path))
    assert rf_cli.main(["preset", "export", "m", "--format", "systemd", "--port", "8081"]) == 0
    unit = capsys.readouterr().out
    (line,) = parse_unit(unit)["[Service]"]["ExecStart"]
    assert exec_start(line) == [str(exe), "-m", "/m/m.gguf", "--alias", path,
                                "--host", "127.0.0.1", "--port", "8081"]
    _verify(tmp_path, unit)
    assert not mark.exists()


def _grub_host(tmp_path: Path, default_rhs: str) -> Path:
    root = tmp_path / "root"
    default = "quiet ttm.pages_limit=27648000"
    hr.make_host(root, os="debian13", kernel="6.12.48+deb13-amd64",
                 cmdline=f"BOOT_IMAGE=/boot/vmlinuz-6.12.48+deb13-amd64 root=UUID=77e1 ro {default}",
                 pages_limit=27648000, grub=hr.GRUB_DEBIAN.replace('"{default}"', default_rhs),
                 dpkg={"firmware-amd-graphics": "20250410-2"})
    return root


def test_host_plan_keeps_a_single_quoted_command_single_quoted(tmp_path):
    """The trial: `GRUB_CMDLINE_LINUX_DEFAULT='quiet x=$(touch MARK)'` came back double-quoted,
    so grub-mkconfig (root) would run it.  Now the sed line is run for real on a copy and the
    file sourced as grub-mkconfig does: the word stays data."""
    mark = tmp_path / "MARK"
    root = _grub_host(tmp_path, f"'quiet x=$(touch {mark}) ttm.pages_limit=27648000'")
    out = cli(root, "host", "plan", "--json")
    assert out.returncode == 0, out.stderr
    (sed,) = [c for c in json.loads(out.stdout)["steps"][0]["commands"] if "sed" in c]
    grub = root / "etc/default/grub"
    subprocess.run(["sh", "-c", sed.replace("sudo ", "", 1).replace(" /etc/default/grub", f" {grub}")],
                   check=True, timeout=30)
    value = _source_grub(grub, "GRUB_CMDLINE_LINUX_DEFAULT")
    assert value.startswith(f"quiet x=$(touch {mark}) ") and "ttm.pages_limit=27648000" not in value
    assert re.search(r"\bttm\.pages_limit=\d+", value)
    assert not mark.exists()


def test_host_plan_leaves_a_line_the_shell_computes_to_the_user(tmp_path):
    mark = tmp_path / "MARK"
    root = _grub_host(tmp_path, f'"quiet $(touch {mark}) ttm.pages_limit=27648000"')
    script = tmp_path / "plan.sh"
    out = cli(root, "host", "plan", "--write", str(script))
    assert out.returncode == 0, out.stderr
    text = script.read_text()
    assert "sed" not in text and "edit it by hand" in text
    assert not mark.exists()


def test_serve_dry_run_piped_to_sh_runs_the_preset_and_nothing_else(tmp_path, capsys):
    """The trial: `serve --dry-run | sh` ran a command hidden in a preset.  The line comes from
    the sh emitter: sh runs exactly the preset's program with its argv and env."""
    import hashlib

    from stackfixtures import make_build

    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.measure.store import Store

    mark = tmp_path / "MARK"  # `touch MARK` runs in tmp_path: sh's working directory below
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = dump_program(tmp_path / "dump")
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(exe, prefix / "bin" / "llama-server")
    server = prefix / "bin" / "llama-server"
    model = f"{tmp_path}/it's \"$(touch MARK)\" `touch MARK`.gguf"  # a real file: serve hashes it
    Path(model).write_bytes(b"GGUF model")
    sha = hashlib.sha256(b"GGUF model").hexdigest()
    value = f"a;touch {mark}; $HOME"
    argv = [str(server), "-m", model, "-c", "4096", "--alias", f"x$(touch {mark})"]
    data = {"model": {"name": "m", "sha256": sha, "path": model}, "created": "now",
            "ranges": {"short": {"prefix": str(prefix), "backend": "cpu", "depth": 0, "ctx": 4096,
                                 "stamp": read_manifest(prefix).get("stamp"), "variant": {},
                                 "variant_label": "ub=512", "score": 1.0, "figures": [], "runner_up": None,
                                 "env": {"V": value}, "argv": argv, "notes": [f"n\ntouch {mark}"],
                                 "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": False, "ngl": None, "kv": "f16", "load": "mmap", "parallel": 1}}}}}
    with Store() as s:
        s.add_preset("m", sha, 1, data)
    assert rf_cli.main(["serve", "m", "--dry-run", "--port", "8099"]) == 0
    line = capsys.readouterr().out
    out = tmp_path / "out.json"
    run = subprocess.run(["sh"], input=line, capture_output=True, text=True, timeout=30, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "DUMP_OUT": str(out)})
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert got["V"] == value and got["argv"] == argv[1:] + [
        "--host", "127.0.0.1", "--port", "8099"]
    assert not mark.exists()
