"""The engine additions the stack recipes need, in isolation: recipe keys (depends, output,
venv, export env, sparse/submodules, build.install), the conditions `{TARGET}`, `pkgconfig` and
`rocm_file`, dependency cycles and the expected-output check."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildfixtures import git
from needs import needs

from rocforge_build.errors import BuildError, ConfigError
from rocforge_build.forge import conditions as c
from rocforge_build.forge import pipeline, recipes
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.forge.plan_values import Output
from rocforge_build.rootfs import Root

HEAD = """
[recipe]
name = "{name}"
[source]
git = "file:///nonexistent/x.git"
ref = "v1"
{source}
[backends.cpu]
toolchain = "host"
"""


def parse(tmp_path: Path, body: str = "", *, name: str = "x", source: str = "") -> recipes.Recipe:
    path = tmp_path / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = HEAD.format(name=name, source=source) + body
    path.write_text(text)
    return recipes.parse(text, path)


def test_new_recipe_keys_load(tmp_path):
    r = parse(tmp_path, """
[build]
install = "ninja"
[venv]
requirements = ["requirements.txt"]
reason = "codegen in Python"
[[depends]]
recipe = "y"
reason = "needs y"
prepend = { CMAKE_PREFIX_PATH = "." }
[[output]]
path = "lib/x/library/TensileLibrary_lazy_{target}.dat"
reason = "kernels"
[[env]]
name = "X_HOME"
value = "{prefix}"
stage = "export"
reason = "for users"
""", source='sparse = ["projects/x", "shared/y"]\nsubmodules = true\nsubdir = "projects/x"')
    assert r.install == "ninja" and r.venv["requirements"] == ["requirements.txt"]
    assert r.source.sparse == ("projects/x", "shared/y") and r.source.submodules
    assert [d.get("recipe") for d in r.of("depends")] == ["y"]
    assert r.to_json()["outputs"][0]["path"].endswith("_{target}.dat")


@pytest.mark.parametrize(("body", "source", "message"), [
    ('[[depends]]\nrecipe = "x"\nreason = "r"\n', "", "cannot depend on itself"),
    ('[[env]]\nname = "A"\nvalue = "1"\nstage = "later"\nreason = "r"\n', "", "runtime or export"),
    ('[build]\ninstall = "make"\n', "", "build.install"),
    ('[[output]]\npath = "lib/x"\n', "", "missing required key 'reason'"),
    ('[venv]\nrequirements = ["r.txt"]\n', "", "missing required key 'reason'"),
    ("", 'sparse = ["/abs"]', "relative directory paths"),
])
def test_new_recipe_keys_are_validated(tmp_path, body, source, message):
    with pytest.raises(ConfigError) as exc:
        parse(tmp_path, body, source=source)
    assert message in exc.value.message


def test_sparse_needs_git(tmp_path):
    text = ('[recipe]\nname = "t"\n[source]\nurl = "file:///x.tar.gz"\nsparse = ["a"]\n'
            '[backends.cpu]\ntoolchain = "host"\n')
    with pytest.raises(ConfigError) as exc:
        recipes.parse(text, tmp_path / "t.toml")
    assert "need a `git` source" in exc.value.message


def test_target_placeholder_in_condition_text(tmp_path):
    (tmp_path / "rocwmma" / "internal").mkdir(parents=True)
    (tmp_path / "rocwmma" / "internal" / "config.hpp").write_text("#define ROCWMMA_ARCH_GFX1151 1\n")
    cond = {"header_contains": {"header": "rocwmma/internal/config.hpp", "text": "ROCWMMA_ARCH_{TARGET}"}}
    host = c.HostFacts(include_dirs=(tmp_path,))
    assert c.explain(cond, c.Facts(target="gfx1151", host=host)) == (
        True, "<rocwmma/internal/config.hpp> has ROCWMMA_ARCH_GFX1151")
    ok, why = c.explain(cond, c.Facts(target="gfx1100", host=host))
    assert not ok and "ROCWMMA_ARCH_GFX1100" in why


@needs("pkg-config")  # the condition runs the one on PATH=/usr/bin:/bin
def test_pkgconfig_condition(tmp_path, monkeypatch):
    pc = tmp_path / "pc"
    pc.mkdir()
    (pc / "liblzma.pc").write_text("Name: liblzma\nDescription: x\nVersion: 5.4.1\n")
    monkeypatch.setenv("PKG_CONFIG_LIBDIR", str(pc))
    facts = c.Facts(target="gfx1151", host=c.HostFacts(path="/usr/bin:/bin"))
    assert c.explain({"pkgconfig": "liblzma"}, facts) == (True, "pkg-config finds liblzma")
    assert c.explain({"pkgconfig": "libnothere"}, facts) == (False, "pkg-config does not find libnothere")
    empty = tmp_path / "bin"
    empty.mkdir()
    no_tool = c.Facts(target="gfx1151", host=c.HostFacts(path=str(empty)))
    assert c.explain({"pkgconfig": "liblzma"}, no_tool) == (False, "pkg-config not found (wanted liblzma)")
    c.validate({"pkgconfig": ["liblzma", "lzma"]}, "t")


def test_rocm_file_condition(tmp_path):
    lib = tmp_path / "lib" / "hipblaslt" / "library"
    lib.mkdir(parents=True)
    (lib / "TensileLibrary_lazy_gfx1151.dat").write_text("")
    cond = {"rocm_file": "lib/hipblaslt/library/TensileLibrary_lazy_{target}.dat"}
    assert c.evaluate(cond, c.Facts(target="gfx1151", host=c.HostFacts(rocm_root=tmp_path)))
    ok, why = c.explain(cond, c.Facts(target="gfx1100", host=c.HostFacts(rocm_root=tmp_path)))
    assert not ok and "TensileLibrary_lazy_gfx1100.dat" in why
    ok, why = c.explain(cond, c.Facts(target="gfx1151", host=c.HostFacts()))
    assert not ok and why.startswith("no ROCm to look in")


def test_dependency_cycle_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.20)\nproject(x NONE)\n")
    git("init", "-q", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-qm", "x", cwd=src)
    git("tag", "v1", cwd=src)
    dep = '[[depends]]\nrecipe = "{other}"\nreason = "cycle"\n'
    for name, other in (("a", "b"), ("b", "a")):
        path = parse(tmp_path, dep.format(other=other), name=name).path
        path.write_text(path.read_text().replace("file:///nonexistent/x.git", src.as_uri()))
    req = Request(recipe=str(tmp_path / "recipes" / "a.toml"), target="gfx1151")
    with pytest.raises(ConfigError) as exc:
        plan_for(req, Root(tmp_path))
    assert "dependency cycle" in exc.value.message and "a -> b -> a" in exc.value.message


def test_output_check_globs_and_names_what_is_missing(tmp_path):
    class P:  # the two fields check_outputs reads
        recipe = type("R", (), {"name": "rocblas"})
        target = "gfx1151"
        outputs = (Output(path="lib/libaotriton_v2.so*", reason="the library"),
                   Output(path="lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat", reason="kernels"))

    (tmp_path / "lib" / "rocblas" / "library").mkdir(parents=True)
    (tmp_path / "lib" / "libaotriton_v2.so.0.11.1").write_text("")
    (tmp_path / "lib" / "rocblas" / "library" / "TensileLibrary_lazy_gfx90a.dat").write_text("")
    with pytest.raises(BuildError) as exc:
        pipeline.check_outputs(P, tmp_path)
    msg = exc.value.message
    assert "TensileLibrary_lazy_gfx1151.dat — kernels" in msg and "TensileLibrary_lazy_gfx90a.dat" in msg
    assert "libaotriton" not in msg
    (tmp_path / "lib" / "rocblas" / "library" / "TensileLibrary_lazy_gfx1151.dat").write_text("")
    assert pipeline.check_outputs(P, tmp_path) == [
        "lib/libaotriton_v2.so.0.11.1", "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat"]
