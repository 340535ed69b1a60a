"""`records.Record`: the value classes of the modules `rocforge env` imports behave as the
`@dataclass(frozen=True)` classes they replaced (without importing dataclasses at start-up)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest

from rocforge_build import config, records
from rocforge_build.discover import (
    binaries,
    builds,
    gpus,
    host,
    host_checks,
    installs,
    layouts,
    resolver,
    targets,
)

CLASSES = [resolver.Decision, resolver.Resolution, builds.Build, targets.Target, gpus.Gpu,
           gpus.Discovery, binaries.ElfInfo, binaries.RuntimeIsas, binaries.Hipcc,
           binaries.KernelPack, layouts.Layout, installs.Coverage, installs.RocmInstall,
           host.Kernel, host.CardMemory, host.Host, host_checks.Check, config.Bound]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_slot_order(cls):
    """`init(self, ...)` maps values onto `__slots__` by position: the signature must name the
    same fields in the same order, or two fields would swap silently."""
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    assert params == list(cls.__slots__)
    assert set(cls._hidden) <= set(cls.__slots__)
    assert issubclass(cls, records.Record) and not hasattr(cls(*_sample_args(cls)), "__dict__")


def _sample_args(cls):
    """One value per required parameter (defaults stay), distinct per position."""
    return [f"v{i}" for i, p in enumerate(list(inspect.signature(cls.__init__).parameters.values())[1:])
            if p.default is inspect.Parameter.empty]


@dataclasses.dataclass(frozen=True)
class _Twin:
    """The dataclass Gpu was, to compare behaviour against."""

    index: int
    node: int | None
    gfx: str
    gfx_target_version: int
    kind: str
    kind_reason: str
    compute_units: int | None = None
    device_id: int | None = None
    unique_id: str | None = None
    marketing_name: str | None = None
    drm_render_minor: int | None = None
    source: str = "kfd"
    extra: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _pair(**kw):
    args = dict(index=0, node=1, gfx="gfx1151", gfx_target_version=110501, kind="igpu",
                kind_reason="APU", compute_units=40)
    args.update(kw)
    return gpus.Gpu(**args), _Twin(**args)


def test_eq_hash_repr_and_defaults_as_the_dataclass():
    g, t = _pair(extra={"properties": {"a": 1}})
    assert repr(g) == repr(t).replace("_Twin(", "Gpu(")  # `extra` left out, like repr=False
    same, same_t = _pair(extra={"other": 2})  # `extra` is not compared (compare=False)
    assert (g == same) is (t == same_t) is True
    assert hash(g) == hash(same) and hash(t) == hash(same_t)
    other, other_t = _pair(compute_units=32)
    assert (g == other) is (t == other_t) is False and g != other
    assert g != t and g.__eq__(t) is NotImplemented  # another class is never equal
    assert {g, same, other} == {g, other}
    a, b = gpus.Gpu(0, 1, "gfx1151", 1, "igpu", "r"), gpus.Gpu(0, 1, "gfx1151", 1, "igpu", "r")
    assert a.extra == {} and a.extra is not b.extra  # a new dict each, as default_factory=dict
    assert a.source == "kfd" and a.unique_id is None
    d = resolver.Decision("k", ["a"], "why")
    with pytest.raises(TypeError):
        hash(d)  # an unhashable field makes the record unhashable, as with the dataclass


def test_frozen():
    g, _ = _pair()
    with pytest.raises(AttributeError):
        g.gfx = "gfx1100"
    with pytest.raises(records.FrozenInstanceError):
        del g.gfx
    with pytest.raises(AttributeError):
        g.new_attribute = 1


def test_replace_copy_and_pickle():
    cov = installs.Coverage(rocblas=("gfx1151",), has_rocblas=True)
    inst = installs.RocmInstall("/opt/rocm", "/opt/rocm-7", "7.0",
                                "therock", None, None, cov, sources=("/opt/rocm",),
                                extra={"hipcxx": None})
    new = records.replace(inst, sources=("/opt/rocm", "$ROCM_PATH"), nightly_current=True)
    assert new.sources == ("/opt/rocm", "$ROCM_PATH") and new.nightly_current
    assert new.path == inst.path and new.coverage is cov and new.extra == {"hipcxx": None}
    assert inst.sources == ("/opt/rocm",)  # the original is unchanged
    with pytest.raises(TypeError):
        records.replace(inst, no_such_field=1)
    for clone in (copy.copy(inst), copy.deepcopy(inst), pickle.loads(pickle.dumps(inst))):
        assert clone == inst and clone.extra == inst.extra and clone is not inst
    assert records.fields_of(inst) == records.fields_of(installs.RocmInstall) == inst.__slots__
    res = resolver.Resolution((), None, None, {}, [], [], root=object())
    assert res.prepend == {} and "root" not in repr(res)
    assert res == resolver.Resolution((), None, None, {}, [], [])  # root is not compared


def test_wrong_number_of_values_is_an_error():
    class Pair(records.Record):
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            records.init(self, a)

    with pytest.raises(TypeError):
        Pair(1, 2)
