"""What a person reads shows no Python internals: no None, [] or True, no exception class names,
no "[Errno N]", no C source pasted into a plan's reason (issue 24 item 3).  Each case runs the
code path that used to show one with the input that showed it."""

from __future__ import annotations

import errno
import os

import pytest

from rocforge_build.cli import main
from rocforge_build.discover.resolver import Decision
from rocforge_build.errors import reason
from rocforge_build.forge import conditions as c

INTERNALS = ("None", "[]", "True", "False", "Errno", "Error:", "Traceback")


def _clean(text: str) -> None:
    for word in INTERNALS:
        assert word not in text, f"{word!r} in {text!r}"


def test_reason_of_an_os_error_is_its_words():
    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/no/such")
    assert reason(missing) == "No such file or directory"
    assert reason(missing, name_file=True) == "No such file or directory: /no/such"
    assert reason(PermissionError(errno.EACCES, os.strerror(errno.EACCES))) == "Permission denied"
    assert reason(KeyError("runtime")) == "runtime"  # not "'runtime'"
    # a library's wrapper that pastes an OSError's text into its own message
    assert reason(RuntimeError("cannot connect: [Errno 111] Connection refused")) == \
        "cannot connect: Connection refused"
    assert reason(ValueError()) == "no details given"


@pytest.mark.parametrize("value, text", [
    (None, "unset"), ([], "none"), ((), "none"), (["/a", "/b"], "/a, /b"), (True, "yes"),
    (False, "no"), ("gfx1151", "gfx1151"), (0, "0"),
])
def test_a_decision_value_as_a_person_reads_it(value, text):
    assert Decision("k", value, "why").text() == text


def test_the_closure_env_file_that_cannot_be_read(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    code = main(["container", "closure", str(prefix), "--out", str(tmp_path / "stage"),
                 "--env-file", str(tmp_path / "missing.env")])
    err = capsys.readouterr().err
    assert code != 0
    assert err.splitlines()[0] == f"rocforge: error: cannot read {tmp_path / 'missing.env'}: No such file or directory"
    _clean(err)


def test_rocminfo_that_cannot_run_is_said_in_words(tmp_path):
    from rocforge_build.discover.gpus import discover_rocminfo

    program = tmp_path / "rocminfo"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o644)  # not executable
    found = discover_rocminfo(str(program))
    assert found.gpus == ()
    assert found.warnings == ("rocminfo could not run: Permission denied",)


def test_a_llama_program_that_does_not_start(tmp_path):
    from rocforge_build.errors import RocforgeError
    from rocforge_build.measure.llama_tools import LlamaBuild

    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "llama-bench"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o644)  # not executable, even for root
    with pytest.raises(RocforgeError) as exc:
        LlamaBuild.open(tmp_path).help_text("llama-bench")
    assert exc.value.message == f"{tmp_path.resolve()}/bin/llama-bench does not start: Permission denied"


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe not text", "not UTF-8 text"),
    (b"version = \n", "Invalid value (at line 1, column 11)"),
])
def test_a_damaged_nightly_record_is_said_in_words(tmp_path, content, why):
    from rocforge_build.nightly.install import RECORD, read_record_checked

    (tmp_path / RECORD).write_bytes(content)
    record, problem = read_record_checked(tmp_path)
    assert record == {} and problem == f"{RECORD} cannot be read ({why})"


def test_plan_reasons_do_not_paste_source_code(tmp_path):
    """A recipe condition on a multi-line C excerpt used to put the excerpt (with its quotes,
    braces and indentation) into the plan's reason; it says what the code is instead."""
    (tmp_path / "v.cpp").write_text('    ok = true;\n            } else if (strcmp("EXT_x"\n')
    facts = c.Facts(backend="vulkan", source=c.SourceFacts(tmp_path, "1.0"))
    code = {"file": "v.cpp", "text": 'ok = true;\n            } else if (strcmp("EXT_x"'}
    ok, why = c.explain({"source_contains": code}, facts)
    assert ok and why == "v.cpp has the code the recipe names"
    ok, why = c.explain({"source_contains": {**code, "means": "the unguarded EXT_x check"}}, facts)
    assert ok and why == "v.cpp has the unguarded EXT_x check"
    ok, why = c.explain({"not": {"source_contains": {**code, "means": "the unguarded EXT_x check"}}}, facts)
    assert not ok and "the unguarded EXT_x check" in why and "strcmp" not in why
    short = {"file": "v.cpp", "text": "ok = true;"}  # one short line is quoted as it is
    assert c.explain({"source_contains": short}, facts) == (True, "v.cpp has `ok = true;`")
    ok, why = c.explain({"source_contains": {"file": "v.cpp", "text": "absent()"}}, facts)
    assert (ok, why) == (False, "source does not have `absent()` in v.cpp")


def test_the_recipe_vulkan_patch_reason_names_no_code():
    from rocforge_build.forge import recipes

    rule = next(r for r in recipes.load("llama-cpp").of("patch")
                if r.data["file"] == "vulkan-coopmat-glslc-guard.patch")
    item = rule.when["source_contains"]
    assert "\n" in item["text"]  # the recipe looks for a multi-line excerpt
    assert item["means"] and "strcmp" not in item["means"]


def test_bytes_after_a_gzip_stream_are_shown_as_hex(tmp_path):
    """The refusal used to quote Python's bytes repr (b'hello')."""
    import io
    import tarfile

    from rocforge_build import extract
    from rocforge_build.errors import IntegrityError

    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("a/file")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    archive.write_bytes(archive.read_bytes() + b"hello")
    with pytest.raises(IntegrityError) as exc, extract.staging(tmp_path) as stage:
        extract.safe_extract(archive, stage)
    assert "data after the end of the gzip stream (bytes 68 65 6c 6c 6f ...)" in exc.value.message
    assert "b'" not in exc.value.message


def test_an_unknown_toolchain_lists_the_known_ones_as_words(tmp_path):
    from pathlib import Path

    from rocforge_build.errors import ConfigError
    from rocforge_build.forge import recipes

    fixture = Path(__file__).resolve().parent / "data" / "recipes" / "fixture.toml"
    bad = tmp_path / "fixture.toml"
    bad.write_text(fixture.read_text().replace('toolchain = "hip"', 'toolchain = "cuda"', 1))
    with pytest.raises(ConfigError) as exc:
        recipes.load_file(bad)
    assert exc.value.message.endswith("'cuda' is not one of hip, vulkan, host")
