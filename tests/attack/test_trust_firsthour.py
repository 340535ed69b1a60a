"""The first hour: the traps a new user met (issue 25, items 11-14 and 18), each tried for real.

Real files, a real read-only mount for the home/cache/data/config directories, a real HTTP
server on 127.0.0.1 (tests/http_fixture.py) that records every request, fake sysfs roots in the
kernel's formats (tests/fixtures_roots.py).
"""

from __future__ import annotations

import pytest
from buildfixtures import RECIPE, project_copy, tarball

from rocforge_build import download_policy
from rocforge_build.cli import main


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rocforge: error:")]


@pytest.fixture
def no_sleep(monkeypatch):
    """Download retries without their backoff waits (the retries themselves still happen)."""
    monkeypatch.setattr(download_policy, "_sleep", lambda seconds: None)


# -- 14: a download error whose cause carries a str `reason` -----------------------------------

def test_container_run_tls_error_is_one_network_line(http_server, no_sleep, tmp_path, capsys):
    """`container run` without --backend reads the source where the recipe's default needs it
    (the fixture's gfx1151 default depends on FIXTURE_ACCEL; a dry run would download nothing);
    an https:// URL answered by a plain-HTTP server fails the TLS handshake with an ssl.SSLError
    whose `reason` is a str ('WRONG_VERSION_NUMBER') — which used to end in an internal error."""
    url = http_server.add("/fixture.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    https = url.replace("http://", "https://", 1)
    rc = main(["container", "run", str(RECIPE), "--target", "gfx1151", "--engine", "docker",
               "--source", https, "--", "true"])
    err = capsys.readouterr().err
    assert rc == 6, err
    assert "internal error" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and "SSL" in lines[0], err


# -- 11: a read-only HOME, cache, data or config directory -------------------------------------

_RO_SCRIPT = r"""
set -u
mount -t tmpfs -o ro,size=64k tmpfs "$RO" || exit 99
cd "$RO"
i=0
for args in "$@"; do
    i=$((i + 1))
    eval "set -- $args"
    "$PY" -m rocforge_build "$@" >"$OUTDIR/$i.out" 2>"$OUTDIR/$i.err"
    echo $? >"$OUTDIR/$i.rc"
done
"""


def run_on_read_only_home(tmp_path, commands: list[list[str]], env_extra: dict) -> list[tuple]:
    """Run each rocforge command with HOME on a real read-only tmpfs, mounted in a private
    user and mount namespace (`unshare -rm`: works for root, whom chmod 0555 does not stop,
    and for an unprivileged user alike; the mount vanishes with the namespace)."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    ro, outdir = tmp_path / "ro-home", tmp_path / "out"
    ro.mkdir()
    outdir.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROCFORGE_", "XDG_"))}
    env.update(HOME=str(ro), RO=str(ro), OUTDIR=str(outdir), PY=sys.executable,
               PYTHONPATH=str(Path(__file__).resolve().parents[2]), **env_extra)
    res = subprocess.run(["unshare", "-rm", "sh", "-c", _RO_SCRIPT, "sh",
                          *[shlex.join(c) for c in commands]], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not any(ro.iterdir())  # outside the namespace: nothing was written where HOME was
    return [(int((outdir / f"{i}.rc").read_text()), (outdir / f"{i}.err").read_text())
            for i in range(1, len(commands) + 1)]


def test_read_only_home_names_the_directory_and_its_variable(tmp_path):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    build = ["build", str(RECIPE), "--target", "gfx1030", "--source", str(tb),
             "--prefix", str(tmp_path / "prefix")]
    results = run_on_read_only_home(tmp_path, [
        [*build, "--dry-run"],
        build,
        ["config", "set", "download.attempts", "3"],
    ], {})
    expected = [("cache", "ROCFORGE_CACHE_DIR"), ("cache", "ROCFORGE_CACHE_DIR"),
                ("config", "ROCFORGE_CONFIG_DIR")]
    for (rc, err), (kind, var) in zip(results, expected, strict=True):
        assert rc == 2, err
        assert "internal error" not in err and "Traceback" not in err
        lines = error_lines(err)
        assert len(lines) == 1, err
        assert f"the {kind} directory {tmp_path / 'ro-home'}" in lines[0] and var in lines[0]
        assert "Read-only file system" in lines[0]
    assert not (tmp_path / "prefix").exists()


def test_read_only_data_dir_override_is_named(tmp_path):
    """A ROCFORGE_DATA_DIR on the read-only mount (cache and config writable elsewhere)."""
    ro = tmp_path / "ro-home"
    results = run_on_read_only_home(tmp_path, [
        ["build", str(RECIPE), "--target", "gfx1030", "--source", str(project_copy(tmp_path / "s"))],
    ], {"ROCFORGE_DATA_DIR": str(ro / "data"), "ROCFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "ROCFORGE_CONFIG_DIR": str(tmp_path / "config")})
    rc, err = results[0]
    assert rc == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and f"the data directory {ro / 'data'}" in lines[0], err
    assert "ROCFORGE_DATA_DIR" in lines[0]


def test_read_only_prefix_outside_rocforges_directories_is_named(tmp_path):
    """A --prefix on the read-only mount (rocforge's own directories writable elsewhere): one
    line naming the flag and the directory that cannot be written, exit 2, before any build."""
    ro = tmp_path / "ro-home"
    [(rc, err)] = run_on_read_only_home(tmp_path, [
        ["build", str(RECIPE), "--target", "gfx1030", "--source", str(project_copy(tmp_path / "s")),
         "--prefix", str(ro / "prefix")],
    ], {"ROCFORGE_DATA_DIR": str(tmp_path / "data"), "ROCFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "ROCFORGE_CONFIG_DIR": str(tmp_path / "config")})
    assert rc == 2, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0] == f"rocforge: error: --prefix {ro}: {ro} cannot be written (Read-only file system)"


@pytest.mark.parametrize("where", ["data", ""])
def test_results_store_in_a_read_only_data_dir_is_named(tmp_path, where):
    """`results list` with ROCFORGE_DATA_DIR on the read-only mount (not yet there: the store
    would create it; or there, but read-only): the one line of the other commands, naming the
    directory and ROCFORGE_DATA_DIR, exit 2 (it was exit 11, "cannot be opened: Read-only file
    system" or "unable to open database file", naming neither)."""
    ro = tmp_path / "ro-home"
    data = ro / where if where else ro
    [(rc, err)] = run_on_read_only_home(tmp_path, [["results", "list"]], {
        "ROCFORGE_DATA_DIR": str(data), "ROCFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "ROCFORGE_CONFIG_DIR": str(tmp_path / "config")})
    assert rc == 2, err
    assert "internal error" not in err and "Traceback" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and f"the data directory {data} cannot be written" in lines[0], err
    assert "ROCFORGE_DATA_DIR" in lines[0] and "Read-only file system" in lines[0]


def test_results_db_override_in_a_read_only_dir_names_its_variable(tmp_path):
    ro = tmp_path / "ro-home"
    [(rc, err)] = run_on_read_only_home(tmp_path, [["results", "list"]], {
        "ROCFORGE_RESULTS_DB": str(ro / "r.sqlite3"), "ROCFORGE_DATA_DIR": str(tmp_path / "data"),
        "ROCFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "ROCFORGE_CONFIG_DIR": str(tmp_path / "config")})
    assert rc == 11, err
    lines = error_lines(err)
    assert len(lines) == 1 and f"{ro} cannot be written (Read-only file system)" in lines[0], err
    assert "ROCFORGE_RESULTS_DB" in err


# -- 13: preflight before fetching; a dry run exits as the build would -------------------------

@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
def test_no_rocm_stops_before_any_download(http_server, tmp_path, capsys, dry):
    """llama-cpp's default backend for gfx1151 is HIP; on a root without any ROCm the build
    (and its dry run) stops with exit 4 (no ROCm, as `rocforge env`) before the source is asked for."""
    url = http_server.add("/llama.cpp.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    empty = tmp_path / "root"
    empty.mkdir()
    argv = ["--root", str(empty), "build", "llama-cpp", "--target", "gfx1151", "--source", url]
    rc = main(argv + (["--dry-run"] if dry else []))
    err = capsys.readouterr().err
    assert rc == 4, err
    assert len(error_lines(err)) == 1 and "no ROCm toolchain found for gfx1151" in err
    assert http_server.requests == []  # not a single request, not even a HEAD


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
def test_foreign_prefix_refused_before_any_download(http_server, tmp_path, capsys, dry):
    url = http_server.add("/fixture-1.2.0.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    prefix = tmp_path / "mine"
    prefix.mkdir()
    (prefix / "notes.txt").write_text("the user's own file\n")
    argv = ["build", str(RECIPE), "--target", "gfx1030", "--source", url, "--prefix", str(prefix)]
    rc = main(argv + (["--dry-run"] if dry else []))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(error_lines(err)) == 1 and "refusing to replace --prefix" in err
    assert http_server.requests == []
    assert (prefix / "notes.txt").read_text() == "the user's own file\n"


def test_dry_run_and_build_exit_alike_on_missing_toolchain_after_fetch(tmp_path, capsys):
    """A backend whose toolchain is missing, found out with a local source (no download to
    spare): the dry run no longer prints a plan with "toolchain MISSING" and exits 0."""
    src = project_copy(tmp_path / "src")
    empty = tmp_path / "root"
    empty.mkdir()
    codes = []
    for extra in (["--dry-run"], []):
        codes.append(main(["--root", str(empty), "build", str(RECIPE), "--target", "gfx1151",
                           "--backend", "hip", "--source", str(src),
                           "--prefix", str(tmp_path / "p"), *extra]))
    err = capsys.readouterr().err
    assert codes == [4, 4], err  # no ROCm at all: exit 4, as `rocforge env`
    assert not (tmp_path / "p").exists()


# -- 13: a dry run never downloads -----------------------------------------------------------------

def _llama_like(dest, hip_floor: str | None = "6.1", version: str = "0.3.36"):
    """A tarball shaped like a llama-cpp-python sdist (PKG-INFO, vendor/llama.cpp with the HIP
    switch and, where `hip_floor`, ggml-hip's `VERSION_LESS` stop, as 0.3.36's own)."""
    tree = dest.with_suffix(".d")
    inner = tree / "vendor" / "llama.cpp"
    (inner / "ggml" / "src" / "ggml-hip").mkdir(parents=True)
    (tree / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {version}\n")
    (inner / "CMakeLists.txt").write_text('option(GGML_HIP "HIP" OFF)\nadd_subdirectory(ggml)\n')
    stop = (f"if (${{hip_VERSION}} VERSION_LESS {hip_floor})\n    message(FATAL_ERROR \"At least "
            f"ROCM/HIP V{hip_floor} is required\")\nendif()\n") if hip_floor else ""
    (inner / "ggml" / "src" / "ggml-hip" / "CMakeLists.txt").write_text(
        "set(CMAKE_HIP_ARCHITECTURES ${AMDGPU_TARGETS})\n" + stop)
    return tarball(dest, tree)


def _pinned_recipe(tmp_path, url: str, sha: str):
    """The packaged llama-cpp recipe with its pinned default source served on 127.0.0.1."""
    import re

    from measure_fixtures import recipe_variant

    recipe = recipe_variant(tmp_path / "pinned")
    text = recipe.read_text()
    text = re.sub(r'^url = ".*"$', f'url = "{url}"', text, count=1, flags=re.M)
    text = re.sub(r'^sha256 = ".*"$', f'sha256 = "{sha}"', text, count=1, flags=re.M)
    recipe.write_text(text)
    return recipe


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
def test_hip_too_old_for_the_pinned_source_stops_before_any_download(http_server, tmp_path,
                                                                     capsys, dry):
    """ROCm 6.0.2 and the recipe's pinned default source (llama-cpp-python 0.3.36, whose
    ggml-hip stops below HIP 6.1): the recipe's `pinned_version` decides the stop before the
    download, so the build and its dry run exit 5 without a single request."""
    import hashlib

    from toolchain_fixtures import therock_root

    data = _llama_like(tmp_path / "llama.tar.gz").read_bytes()
    url = http_server.add("/llama_cpp_python-0.3.36.tar.gz", data)
    recipe = _pinned_recipe(tmp_path, url, hashlib.sha256(data).hexdigest())
    root = therock_root(tmp_path, version="6.0.2")
    rc = main(["--root", str(root.base), "build", str(recipe), "--target", "gfx1151",
               "--prefix", str(tmp_path / "p"), *(["--dry-run"] if dry else [])])
    out, err = capsys.readouterr()
    assert rc == 5, err
    assert len(error_lines(err)) == 1 and "needs HIP >= 6.1" in err
    assert "source version 0.3.36 (the recipe's pinned source) matches ==0.3.36" in err
    assert http_server.requests == []
    assert out == ""


def test_a_pinned_version_the_tarball_contradicts_is_a_recipe_error(http_server, tmp_path, capsys):
    """The recipe's pinned_version decided conditions before the download; a tarball that says
    another version makes the recipe wrong: exit 2 naming both, after the one download."""
    import hashlib

    from toolchain_fixtures import therock_root

    data = _llama_like(tmp_path / "llama.tar.gz").read_bytes()
    url = http_server.add("/llama_cpp_python-0.3.36.tar.gz", data)
    recipe = _pinned_recipe(tmp_path, url, hashlib.sha256(data).hexdigest())
    recipe.write_text(recipe.read_text().replace('pinned_version = "0.3.36"', 'pinned_version = "0.3.35"'))
    root = therock_root(tmp_path)  # ROCm 7.9: no stop
    rc = main(["--root", str(root.base), "build", str(recipe), "--target", "gfx1151",
               "--prefix", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = error_lines(err)[0]
    assert "source.pinned_version is 0.3.35, but the pinned tarball" in line and "says 0.3.36" in line
    assert len(http_server.requests) == 1


def test_hip_too_old_for_another_source_is_known_only_after_the_fetch(http_server, tmp_path,
                                                                      capsys):
    """The same ROCm 6.0.2 and a tarball URL rocforge knows nothing of: whether its ggml-hip stops
    below HIP 6.1 is in the source.  The build fetches it (one GET) and stops, exit 5; its dry run
    downloads nothing, says which condition decides after the fetch, and exits 0."""
    from toolchain_fixtures import therock_root

    url = http_server.add("/llama.cpp.tar.gz", _llama_like(tmp_path / "l.tar.gz").read_bytes())
    root = therock_root(tmp_path, version="6.0.2")
    argv = ["--root", str(root.base), "build", "llama-cpp", "--target", "gfx1151", "--source", url,
            "--prefix", str(tmp_path / "p")]
    assert main([*argv, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert http_server.requests == []
    assert "(not fetched: a dry run downloads nothing)" in out and "fetching" not in err
    after = out[out.index("decided after the fetch"):]
    assert ("stop: this llama.cpp needs HIP >= 6.1 (ggml-hip/CMakeLists.txt stops below it) but "
            "the ROCm found is older\n") in after
    assert "      if ggml/src/ggml-hip/CMakeLists.txt has `VERSION_LESS 6.1`\n" in after
    assert "if the source's version matches ==0.3.36" in after  # the pinned source's stop
    assert main([*argv, "--dry-run", "--json"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)
    assert plan["source"]["fetched"] is False and plan["source"]["identity"] == ""
    stops = [e for e in plan["after_fetch"] if e["rule"] == "stop"]
    assert any("VERSION_LESS 6.1" in e["when"] and "rocforge nightly install" in e["hint"] for e in stops)
    assert http_server.requests == []
    assert main(argv) == 5  # the build: fetched, then stopped by the source's own check
    err = capsys.readouterr().err
    assert "needs HIP >= 6.1" in error_lines(err)[0]
    assert {m for m, _, _ in http_server.requests} == {"GET"}
    assert not (tmp_path / "p").exists()


def test_source_dependent_stop_after_the_fetch_and_a_cached_source_plans_in_full(
        http_server, tmp_path, capsys):
    """The fixture recipe (its source pinned to a tarball on 127.0.0.1) stops a tree that has
    STOP-ME.  Not cached: the dry run cannot know, says so and exits 0, with no request; the build
    downloads it (once) and stops, exit 5.  Now cached: the dry run reads it as the build does and
    exits 5 too, without a request."""
    import hashlib

    from buildfixtures import recipe_copy

    src = project_copy(tmp_path / "src")
    (src / "STOP-ME").write_text("")
    data = tarball(tmp_path / "s.tar.gz", src).read_bytes()
    url = http_server.add("/fixture-1.2.0.tar.gz", data)
    recipe = recipe_copy(tmp_path / "r", **{'git = "file:///nonexistent/fixture.git"':
                                            f'url = "{url}"\nsha256 = "{hashlib.sha256(data).hexdigest()}"'})
    argv = ["build", str(recipe), "--target", "gfx1030", "--prefix", str(tmp_path / "p")]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stop: this fixture tree is marked unbuildable\n      if the source has STOP-ME\n" \
           "      hint: remove STOP-ME\n" in out
    assert "greeting.patch: decided after the fetch" in out
    assert http_server.requests == []
    assert main(argv) == 5
    assert "marked unbuildable" in capsys.readouterr().err
    assert [p for _, p, _ in http_server.requests] == ["/fixture-1.2.0.tar.gz"]
    assert main([*argv, "--dry-run"]) == 5  # cached now: read, and the same stop
    out, err = capsys.readouterr()
    assert "marked unbuildable" in err and "decided after the fetch" not in out
    assert len(http_server.requests) == 1


def test_dry_run_of_a_backend_the_source_decides(http_server, tmp_path, capsys):
    """The fixture's gfx1151 default is `accel` where the tree declares FIXTURE_ACCEL, else `cpu`:
    without the source the dry run plans accel and says cpu is the other way, no request."""
    import json

    url = http_server.add("/fixture.tar.gz", tarball(tmp_path / "f.tar.gz").read_bytes())
    rc = main(["build", str(RECIPE), "--target", "gfx1151", "--source", url, "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and http_server.requests == []
    assert plan["backend"] == "accel" and plan["backend_alternatives"] == ["cpu"]
    assert ("if the source declares FIXTURE_ACCEL (decided after the fetch); otherwise cpu "
            "(everything else)") in plan["backend_reason"]
    assert {"rule": "backend", "name": "accel", "when": "the source declares FIXTURE_ACCEL / "
            "FIXTURE_OLDACCEL", "message": "this fixture tree predates the accel switch"} \
        in plan["after_fetch"]


def test_a_candidate_backend_without_its_toolchain_is_left_to_the_fetch(http_server, tmp_path,
                                                                        capsys):
    """A default of hip where the tree declares FIXTURE_HIP, else cpu, on a root without ROCm:
    whether the build stops (no HIP toolchain) depends on the source.  The dry run plans hip,
    lists the missing toolchain for after the fetch and exits 0 with no request; the build
    fetches, chooses hip (the fixture declares FIXTURE_HIP) and exits 4 (no ROCm at all)."""
    from buildfixtures import recipe_copy

    recipe = recipe_copy(tmp_path / "r", **{
        'backend = "accel"\nwhen = { target = "gfx1151", cmake_option = "FIXTURE_ACCEL" }':
        'backend = "hip"\nwhen = { target = "gfx1151", cmake_option = "FIXTURE_HIP" }'})
    url = http_server.add("/fixture.tar.gz", tarball(tmp_path / "f.tar.gz").read_bytes())
    empty = tmp_path / "root"
    empty.mkdir()
    argv = ["--root", str(empty), "build", str(recipe), "--target", "gfx1151", "--source", url,
            "--prefix", str(tmp_path / "p")]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  toolchain hip MISSING, the build stops: " in out
    assert "      the source makes the backend hip\n" in out
    assert "should the source make it cpu, `--backend cpu --dry-run` shows that one" in out
    assert http_server.requests == []
    assert main(argv) == 4
    assert "no ROCm toolchain found for gfx1151" in capsys.readouterr().err
    assert http_server.requests  # fetched first: only the source could tell


@pytest.mark.parametrize("recipe", ["llama-cpp", str(RECIPE)], ids=["llama-cpp", "fixture"])
def test_container_run_dry_run_downloads_nothing(http_server, tmp_path, capsys, docker_ok, recipe):
    """`container run --dry-run` without --backend chose the backend by reading the source: the
    290 MB sdist.  Now: llama-cpp's default (hip) needs no source; the fixture's is left open."""
    url = http_server.add("/src.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    rc = main(["container", "run", recipe, "--target", "gfx1151", "--engine", "docker",
               "--source", url, "--dry-run", "--", "llama-cli", "--version"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert http_server.requests == []
    if recipe == "llama-cpp":
        assert "localhost/rocforge/llama-cpp:gfx1151-hip" in out and "decided after" not in out
    else:
        assert "localhost/rocforge/fixture:gfx1151-accel" in out
        assert "(decided after the fetch); otherwise cpu" in out


# -- 12: a --source or --root that holds nothing to build ---------------------------------------

@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
@pytest.mark.parametrize("shape", ["missing", "empty", "no-cmakelists"])
def test_source_with_nothing_to_build_is_refused_before_a_plan(tmp_path, capsys, shape, dry):
    src = tmp_path / "src"
    if shape == "empty":
        src.mkdir()
    elif shape == "no-cmakelists":
        project_copy(src)
        (src / "CMakeLists.txt").unlink()
    argv = ["build", str(RECIPE), "--target", "gfx1030", "--source", str(src),
            "--prefix", str(tmp_path / "p")]
    rc = main(argv + (["--dry-run"] if dry else []))
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert out == ""  # no plan
    lines = error_lines(err)
    assert len(lines) == 1 and f"--source {src}" in lines[0], err
    assert ("no such file or directory" if shape == "missing" else "holds no CMakeLists.txt") \
        in lines[0]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("what", ["recipe", "source"])
def test_a_fifo_recipe_or_source_is_named_as_not_a_regular_file(tmp_path, what):
    """A FIFO given as the recipe file or as --source: said to be a FIFO (it was "does not exist"
    and "holds no CMakeLists.txt"), one line, exit 2, in a real process that never waits on it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fifo = tmp_path / ("r.toml" if what == "recipe" else "src")
    os.mkfifo(fifo)
    argv = ([str(fifo)] if what == "recipe" else [str(RECIPE), "--source", str(fifo)])
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "build", *argv, "--target",
                          "gfx1030", "--dry-run"], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[2], stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and f"{fifo} is a FIFO, not a regular file" in lines[0], out.stderr


def test_source_tarball_without_a_project_is_refused(tmp_path, capsys):
    """A tarball that unpacks to a tree without CMakeLists.txt: exit 2 before any plan."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README").write_text("not a project\n")
    tb = tarball(tmp_path / "docs.tar.gz", docs)
    rc = main(["build", str(RECIPE), "--target", "gfx1030", "--source", str(tb), "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", err
    assert len(error_lines(err)) == 1 and "holds no CMakeLists.txt" in err


@pytest.mark.parametrize("command", [["build", str(RECIPE), "--target", "gfx1030", "--dry-run"],
                                     ["kernels", "build"], ["tune", "llama-cpp", "--model", "m"]])
def test_missing_root_is_refused_with_exit_2(tmp_path, capsys, command):
    rc = main(["--root", str(tmp_path / "nowhere"), *command])
    err = capsys.readouterr().err
    assert rc == 2 and len(error_lines(err)) == 1 and "is not a directory" in err, err


# -- 18: consistent flags and right hints -------------------------------------------------------

def test_build_target_defaults_to_the_detected_gpu(tmp_path, capsys):
    import json

    from fixtures_roots import make_strix_halo

    root = tmp_path / "root"
    make_strix_halo(root)  # a gfx1151 iGPU in sysfs, in the kernel's format
    rc = main(["--root", str(root), "build", str(RECIPE), "--source",
               str(project_copy(tmp_path / "src")), "--backend", "cpu", "--dry-run", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["target"] == "gfx1151"


@pytest.mark.parametrize("command", [
    ["build", str(RECIPE), "--dry-run"],
    ["tune", "llama-cpp", "--model", "m.gguf"],
    ["container", "run", "llama-cpp", "--backend", "hip", "--engine", "docker", "--dry-run",
     "--", "true"],
    ["kernels", "build"],
    ["nightly", "pip", "--no-probe"],
    ["bisect", "llama-cpp", "--good", "a1", "--bad", "b2", "--run", "true"],
], ids=["build", "tune", "container", "kernels", "nightly-pip", "bisect"])
def test_no_target_and_no_gpu_lists_the_choices(tmp_path, capsys, command):
    import tiny_gguf

    root = tmp_path / "root"
    root.mkdir()
    if "--model" in command:  # tune checks its model file before it looks for a GPU
        tiny_gguf.write(tmp_path / "m.gguf")
        command = [str(tmp_path / "m.gguf") if a == "m.gguf" else a for a in command]
    rc = main(["--root", str(root), *command])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert error_lines(err) == ["rocforge: error: no GPU target was given and none was detected"]
    hint = next(line for line in err.splitlines() if line.startswith("rocforge: hint:"))
    for known in ("gfx900", "gfx90a", "gfx1030", "gfx1100", "gfx1151", "gfx1201"):
        assert f" {known}," in hint or hint.endswith(f" {known}"), hint


def test_container_target_defaults_to_the_detected_gpu(tmp_path, capsys, docker_ok):
    from fixtures_roots import make_strix_halo

    root = tmp_path / "root"
    make_strix_halo(root)
    rc = main(["--root", str(root), "container", "run", "llama-cpp", "--backend", "hip",
               "--engine", "docker", "--dry-run", "--", "true"])
    out = capsys.readouterr().out
    assert rc == 0 and "localhost/rocforge/llama-cpp:gfx1151-hip" in out


def test_build_rocm_selects_that_rocm(tmp_path, capsys):
    import json

    from fixtures_roots import make_strix_halo, make_therock_tree

    root = tmp_path / "root"
    make_strix_halo(root)  # TheRock 7.9 at /opt/rocm
    make_therock_tree(root, "7.10.0rc20251020", ("gfx1151",), inner="/opt/therock-b")
    src = str(project_copy(tmp_path / "src"))
    plans = {}
    for rocm in (None, "/opt/therock-b"):
        argv = ["--root", str(root), "build", str(RECIPE), "--target", "gfx1151", "--backend",
                "hip", "--source", src, "--dry-run", "--json"]
        main(argv + (["--rocm", rocm] if rocm else []))
        plans[rocm] = json.loads(capsys.readouterr().out)["toolchain"]
    assert plans[None]["rocm_path"] == "/opt/rocm"
    assert plans["/opt/therock-b"]["rocm_path"] == "/opt/therock-b"
    assert plans["/opt/therock-b"]["env"]["ROCM_PATH"].endswith("/opt/therock-b")


def test_kernels_extra_hint_works_from_a_checkout(tmp_path):
    """This test runs from a checkout: the hint installs the checkout, editable, with the extra
    (`pip install 'rocforge[kernels]'` would ask the package index for rocforge instead)."""
    from pathlib import Path

    from rocforge_build.kernels.runner import extra_install_hint

    checkout = Path(__file__).resolve().parents[2]
    assert (checkout / "pyproject.toml").is_file()
    assert extra_install_hint("kernels") == f"pip install -e '{checkout}[kernels]'"


def test_nightly_pip_offline_hint_names_only_its_own_flags(http_server, no_sleep, tmp_path,
                                                           capsys):
    """The probe of the per-family index fails (the server answers 500 every time): the hint
    must not suggest `--index`, which `nightly pip` does not have."""
    import os

    index = http_server.url("/whl/{family}/")
    for _ in range(10):
        http_server.fail("/whl/gfx1151/", status=500)
        http_server.fail("/whl/gfx115X-all/", status=500)
    cfg = tmp_path / "cfg"
    os.environ["ROCFORGE_CONFIG_DIR"] = str(cfg)
    assert main(["config", "set", "nightly.pip.family_index", index]) == 0
    assert main(["config", "set", "download.attempts", "1"]) == 0
    capsys.readouterr()
    rc = main(["nightly", "pip", "--target", "gfx1151"])
    err = capsys.readouterr().err
    assert rc == 6, err
    assert len(error_lines(err)) == 1 and "--index" not in err.replace("--index-url", "")
    assert "--no-probe" in err


@pytest.mark.parametrize("inner", ["proc/meminfo", "proc/cmdline", "etc/os-release",
                                   "sys/class/kfd/kfd/topology/nodes/1/name"])
def test_a_fifo_in_the_inspected_root_is_never_waited_on(tmp_path, inner):
    """A FIFO where the host's /proc, /etc or sysfs has a file (a hand-made --root, a container
    filesystem): every read of discovery opened it and waited forever, `rocforge env` at each
    shell start-up too.  Real processes, cold and then from the env cache: each answers within
    seconds, and the FIFO is left as it was."""
    import os
    import stat
    import subprocess
    import sys
    from pathlib import Path

    import host_roots as hr

    root = hr.strix_defaults(tmp_path / "root")
    target = root / inner
    assert target.is_file()  # the real host has a file there
    target.unlink()
    os.mkfifo(target)
    # this host has no ROCm: env says so (exit 4), doctor finds it not usable (1), host plan plans
    # (0) — except without MemTotal, which the GTT size is computed from (3, one line)
    plan = 3 if inner == "proc/meminfo" else 0
    for cmd, code in ((["env"], 4), (["env"], 4), (["doctor"], 1), (["host", "plan"], plan)):
        out = subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), *cmd],
                             cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
        assert out.returncode == code, out.stderr
        assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


def test_a_fifo_for_a_gpus_kfd_properties_is_one_detection_line(tmp_path):
    """The one file discovery cannot do without: a FIFO for a KFD node's properties is exit 3 with
    one line naming it, not a wait."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import host_roots as hr

    root = hr.strix_defaults(tmp_path / "root")
    props = root / "sys/class/kfd/kfd/topology/nodes/1/properties"
    props.unlink()
    os.mkfifo(props)
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), "env"],
                         cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.splitlines()[0] == ("rocforge: error: cannot read /sys/class/kfd/kfd/topology/nodes/1/"
                                          "properties: a FIFO, not a regular file")


def test_an_unpinned_tarball_is_downloaded_once_per_run(http_server, tmp_path, capsys):
    """A --source URL (no sha256 pins it): one build reads it once, and plans and builds from
    those same bytes — it was fetched for the up-to-date check, again for the dependencies and
    again for the plan: three downloads of what may have changed in between."""
    src = project_copy(tmp_path / "src")
    url = http_server.add("/fixture-1.2.0.tar.gz", tarball(tmp_path / "s.tar.gz", src).read_bytes())
    assert main(["build", str(RECIPE), "--target", "gfx1030", "--source", url,
                 "--prefix", str(tmp_path / "p")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert [(m, p) for m, p, _ in http_server.requests] == [("GET", "/fixture-1.2.0.tar.gz")]
