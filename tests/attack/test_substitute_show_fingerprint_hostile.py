"""Trusted evidence whose Vulkan fingerprint (devices, drivers, ICD manifests and their API
versions), check batch or own figures' serving dimensions are hostile: `store show` reads it field by field and prints one line per
value, no terminal control and no traceback, with or without --json.  The store is the first
machine's real published fixture build (test_substitute_pull_hostile's fixtures), the evidence
signed by its trusted key: a signer vouches for the bytes, not for their shape."""

from __future__ import annotations

import json

import pytest
from test_substitute_pull_hostile import first, second  # noqa: F401 - the fixtures

from rocforge_build.substitute import artifact, oci

EVIL = "\x1b]0;owned\x07\x1b[2J\nrocforge: error: forged"


@pytest.mark.parametrize("vulkan, batch", [
    ({"devices": [{"name": EVIL, "driver": EVIL}], "icds": [{"file": EVIL, "library": EVIL, "api_version": EVIL}],
      "error": EVIL}, EVIL),
    ({"devices": 5, "icds": "x", "error": ["x"]}, [1, 2]),
    ({"devices": [5, None, {"name": {"x": 1}}], "icds": [{"api_version": 1.3}, 7]}, {"b": 1}),
    ("a string", 10 ** 400),
    ({"devices": [{"name": "d" * 100000, "driver": "x"}] * 20 + [{}] * 5000,
      "icds": [{"file": "/" * 100000}] * 40 + [{}] * 5000}, -1),
])
def test_hostile_vulkan_fingerprints_and_batches_are_shown_in_one_line_each(second, vulkan, batch):  # noqa: F811
    with second.open() as store:
        man = second.build_manifest(store)
        doc = {"key": man.config.digest, "kind": "verify", "passed": True,
               "host": {"kernel": "6.18.4", "vulkan": vulkan},
               "verify": [{"checks": [{"ctx": 512, "ubatch": 512, "fa": True, "ngl": 99, "kv": "f16",
                                       "load": "mmap", "parallel": 1, "batch": batch, "passed": True,
                                       "kld_mean": 0.001, "top1": 0.99}]}],
               "own_figures": [{"ctx": 512, "chunks": 1, "fa": True, "ppl": 15.4, "batch": batch, "ubatch": batch,
                                "kv": vulkan, "load": EVIL, "parallel": batch}]}
        artifact.attach(store, man, oci.EVIDENCE_TYPE, doc, second.pair())
    res = second.machine("store", "show", second.url, second.tag)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert not any(c in res.stdout + res.stderr for c in "\x1b\x07"), repr(res.stdout)[:2000]
    assert not any(line.startswith("rocforge: error") for line in res.stdout.splitlines())
    assert max(len(line) for line in res.stdout.splitlines()) < 20000
    shown = second.machine("store", "show", second.url, second.tag, "--json")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    json.loads(shown.stdout)
