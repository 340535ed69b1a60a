"""The one `when` evaluator: request facts, source facts, host facts, nesting, unknowns."""

from __future__ import annotations

import pytest

from rocforge_build.errors import ConfigError
from rocforge_build.forge import conditions as c


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "ggml" / "src").mkdir(parents=True)
    (tmp_path / "CMakeLists.txt").write_text(
        'option(LLAMA_HIPBLAS "hip" OFF)\n'
        '# option(COMMENTED_OUT "x" OFF)\n'
        'set(LLAMA_TARGETS "" CACHE STRING "targets")\n'
        'cmake_dependent_option(LLAMA_DEP "x" ON "LLAMA_HIPBLAS" OFF)\n'
        'set(NOT_CACHED 1)\n')
    (tmp_path / "ggml" / "CMakeLists.txt").write_text('option(GGML_HIP_ROCWMMA_FATTN "r" OFF)\n')
    (tmp_path / "ggml" / "src" / "x.cu").write_text("vk::LayerSettingEXT s;\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeLists.txt").write_text('option(IN_BUILD_DIR "x" OFF)\n')
    return tmp_path


@pytest.fixture
def facts(tree, tmp_path_factory):
    inc = tmp_path_factory.mktemp("inc")
    (inc / "vulkan").mkdir()
    (inc / "vulkan" / "vulkan_core.h").write_text("#define VK_HEADER_VERSION 239\n")
    return c.Facts(target="gfx1151", families=("gfx1151", "gfx115X-all"), backend="hip",
                   rocm_version="7.10.0a20251021", source=c.SourceFacts(tree, "0.3.9"),
                   host=c.HostFacts(include_dirs=(inc,), path="/usr/bin:/bin",
                                    probe_glslc=lambda ext: ext == "GL_EXT_integer_dot_product"),
                   toolchain_found=True)


def test_scan_cmake_options(tree):
    opts = c.scan_cmake_options(tree)
    assert opts["LLAMA_HIPBLAS"] == "CMakeLists.txt"
    assert opts["GGML_HIP_ROCWMMA_FATTN"] == "ggml/CMakeLists.txt"
    assert "LLAMA_TARGETS" in opts and "LLAMA_DEP" in opts
    assert "COMMENTED_OUT" not in opts and "NOT_CACHED" not in opts and "IN_BUILD_DIR" not in opts


@pytest.mark.parametrize("cond, expected", [
    ({"target": "gfx1151"}, True),
    ({"target": ["gfx1100", "gfx115*"]}, True),
    ({"target": "gfx110*"}, False),
    ({"family": "gfx115X-all"}, True),
    ({"family": "gfx110X-all"}, False),
    ({"backend": ["hip", "rocwmma"]}, True),
    ({"backend": "vulkan"}, False),
    ({"rocm": ">=7.0"}, True),  # 7.10.0a20251021 -> 7.10.0
    ({"rocm": "<7"}, False),
    ({"source_version": ">=0.3,<0.3.10"}, True),
    ({"source_version": ">=0.3.10"}, False),
    ({"cmake_option": "LLAMA_HIPBLAS"}, True),
    ({"cmake_option": ["GGML_HIP", "GGML_HIPBLAS"]}, False),
    ({"file": "ggml/src/x.cu"}, True),
    ({"file": "ggml/src/fattn-wmma-f16.cu"}, False),
    ({"source_contains": {"file": "ggml/src/x.cu", "text": "LayerSettingEXT"}}, True),
    ({"source_contains": {"file": "ggml/src/x.cu", "text": "nothing"}}, False),
    ({"header_contains": {"header": "vulkan/vulkan_core.h", "text": "VK_HEADER_VERSION"}}, True),
    ({"header_contains": {"header": "vulkan/vulkan_core.h", "text": "VkLayerSettingEXT"}}, False),
    ({"header_contains": {"header": "rocwmma/internal/config.hpp", "text": "X"}}, False),
    ({"glslc_extension": "GL_EXT_integer_dot_product"}, True),
    ({"glslc_extension": "GL_KHR_cooperative_matrix"}, False),
    ({"tool": "sh"}, True),
    ({"tool": "no-such-tool-rocforge"}, False),
    ({"toolchain_found": True}, True),
    ({"not": {"target": "gfx1151"}}, False),
    ({"any": [{"target": "gfx1100"}, {"backend": "hip"}]}, True),
    ({"all": [{"target": "gfx1151"}, {"backend": "cpu"}]}, False),
    ({"target": "gfx1151", "backend": "vulkan"}, False),  # keys AND together
    ({}, True),
])
def test_evaluate(facts, cond, expected):
    c.validate(cond, "t")
    assert c.evaluate(cond, facts) is expected


def test_unknown_facts_are_false_with_a_reason():
    f = c.Facts(target="gfx1151")
    assert c.explain({"cmake_option": "X"}, f) == (False, "the source declares X")
    assert c.explain({"rocm": ">=6"}, f) == (False, "ROCm version unknown (wanted >=6)")
    assert c.explain({"header_contains": {"header": "a.h", "text": "b"}}, f)[0] is False


def test_explain_names_the_failing_fact(facts):
    ok, why = c.explain({"target": "gfx1151", "cmake_option": "GGML_HIP"}, facts)
    assert not ok and why == "source does not declare GGML_HIP"
    ok, why = c.explain({"cmake_option": "LLAMA_HIPBLAS"}, facts)
    assert ok and why == "source declares LLAMA_HIPBLAS (CMakeLists.txt)"


@pytest.mark.parametrize("cond, msg", [
    ({"targte": "x"}, "unknown condition key 'targte'"),
    ({"rocm": ">>7"}, "not a version range"),
    ({"any": []}, "non-empty list"),
    ({"source_contains": {"file": "x"}}, "{file = ..., text = ...}"),
    ({"target": 5}, "a string or a list of strings"),
    ({"cpu_flag": ["amx_int8", {"x": 1}]}, "t.cpu_flag: must be a string or a list of strings"),  # a recipe's CPU flag is a name
    ({"toolchain_found": "yes"}, "true or false"),
    ({"not": {"backnd": "x"}}, "t.not: unknown condition key 'backnd'"),
])
def test_validate_errors(cond, msg):
    with pytest.raises(ConfigError) as exc:
        c.validate(cond, "t")
    assert msg in exc.value.message


def test_rocblas_hipblaslt_is_known_or_false_both_ways():
    f = c.Facts(rocblas_hipblaslt=(False, "librocblas.so.4 NEEDs no libhipblaslt"))
    assert c.explain({"rocblas_hipblaslt": False}, f) == (
        True, "librocblas.so.4 NEEDs no libhipblaslt")
    assert not c.evaluate({"rocblas_hipblaslt": True}, f)
    unknown = c.Facts()  # no toolchain: neither holds, so `not = {... = false}` does
    assert not c.evaluate({"rocblas_hipblaslt": False}, unknown)
    assert c.evaluate({"not": {"rocblas_hipblaslt": False}}, unknown)
    with pytest.raises(ConfigError):
        c.validate({"rocblas_hipblaslt": "no"}, "x")


# -- before the source is read: three-valued (a dry run downloads nothing) ------------------------

def test_judge_leaves_to_the_source_only_what_it_decides():
    f = c.Facts(target="gfx1100", backend="hip", rocm_version="6.0.2", toolchain_found=True)
    # a key that is false decides whatever the source says; one that is true leaves the rest open
    assert c.judge({"target": "gfx1151", "cmake_option": "X"}, f) == (False, "target gfx1100 is not gfx1151")
    assert c.judge({"cmake_option": "X", "target": "gfx1151"}, f)[0] is False
    assert c.judge({"target": "gfx11*", "cmake_option": ["X", "Y"]}, f) == (None, "the source declares X / Y")
    assert c.judge({"rocm": "<6.1", "file": "a/b.c"}, f) == (None, "the source has a/b.c")
    item = {"file": "ggml/CMakeLists.txt", "text": "VERSION_LESS 6.1"}
    assert c.judge({"source_contains": item}, f) == (None, "ggml/CMakeLists.txt has `VERSION_LESS 6.1`")
    # not keeps unknown unknown (explain used to turn `not` of an unread source into true)
    assert c.judge({"not": {"cmake_option": "X"}}, f) == (None, "not (the source declares X)")
    assert c.explain({"not": {"cmake_option": "X"}}, f)[0] is False
    # any: a true alternative decides, else the open ones remain; all: a false one decides
    assert c.judge({"any": [{"cmake_option": "X"}, {"backend": "hip"}]}, f)[0] is True
    assert c.judge({"any": [{"cmake_option": "X"}, {"backend": "cpu"}]}, f) == (None, "the source declares X")
    assert c.judge({"all": [{"cmake_option": "X"}, {"backend": "cpu"}]}, f)[0] is False
    assert c.judge({"target": "gfx1100"}, f) == (True, "target gfx1100 is gfx1100")


def test_pinned_version_decides_source_version_before_the_fetch():
    f = c.Facts(target="gfx1151", pinned_version="0.3.36")
    assert c.judge({"source_version": "==0.3.36"}, f) == (
        True, "source version 0.3.36 (the recipe's pinned source) matches ==0.3.36")
    assert c.judge({"source_version": "<0.3"}, f)[0] is False
    assert c.judge({"source_version": ">=1"}, c.Facts())[0] is None  # no pin: the source tells


def test_a_rule_only_the_source_decides_is_one_typed_entry_for_after_the_fetch():
    """judge_rule of a rule the unread source decides: it does not hold in the plan, and its
    entry names the rule, the condition the fetch settles and what describes it; what is not
    given (stage, hint) is left out of the JSON a dry run prints, as an empty evidence list is."""
    from rocforge_build.forge.recipes import Rule

    f = c.Facts(target="gfx1151", backend="hip")
    rule = Rule("option", {"name": "GGML_HIP_ROCWMMA_FATTN", "value": "ON"}, {"cmake_option": "GGML_HIP_ROCWMMA_FATTN"})
    verdict = c.judge_rule(rule, f, "option", "GGML_HIP_ROCWMMA_FATTN", value="ON", reason="rocWMMA FA",
                           evidence=["ggml-org/llama.cpp#16221"])
    assert verdict.holds is False and verdict.why == "the source declares GGML_HIP_ROCWMMA_FATTN"
    assert verdict.after_fetch == c.AfterFetch(rule="option", name="GGML_HIP_ROCWMMA_FATTN",
                                               when="the source declares GGML_HIP_ROCWMMA_FATTN", value="ON",
                                               reason="rocWMMA FA", evidence=("ggml-org/llama.cpp#16221",))
    assert verdict.after_fetch.to_json() == {
        "rule": "option", "name": "GGML_HIP_ROCWMMA_FATTN", "when": "the source declares GGML_HIP_ROCWMMA_FATTN",
        "value": "ON", "reason": "rocWMMA FA", "evidence": ["ggml-org/llama.cpp#16221"]}
    decided = c.judge_rule(Rule("option", {}, {"target": "gfx1151"}), f, "option", "X", value="ON", evidence=[])
    assert decided.holds is True and decided.after_fetch is None
    bare = c.AfterFetch(rule="stop", name="too old", when="the source makes the backend hip")
    assert bare.to_json() == {"rule": "stop", "name": "too old", "when": "the source makes the backend hip"}
