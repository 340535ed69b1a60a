"""What keeps `rocforge bench`'s own cost down without giving up a fact: the model digest is
computed once per file (device, inode, size, mtime) and again whenever any of them changes; the
GGUF header of a real-sized vocabulary is walked without a read per string and still fails a cut
file in one line; provenance starts no process; a `--no-gate` bench does not import the gate,
the build planner or the HTTP stack.  Timings are in benchmarks/bench_measure.py, not here."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import gguf as gguf_py
import numpy as np
import pytest
from tiny_gguf import write as write_gguf

from rocforge_build import download
from rocforge_build.measure import gguf, provenance

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(d))
    return d


def _cached(data_dir: Path) -> dict:
    return json.loads((data_dir / provenance.DIGESTS).read_text())


def _no_hashing(monkeypatch) -> None:
    def refuse(path):
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(download, "sha256_file", refuse)


# -- the model digest ------------------------------------------------------------------------------
def test_digest_is_computed_once_per_file(tmp_path, data_dir, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"A" * 4096)
    assert provenance.model_sha256(f) == hashlib.sha256(b"A" * 4096).hexdigest()
    st = f.stat()
    assert list(_cached(data_dir)) == [f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"]
    _no_hashing(monkeypatch)
    assert provenance.model_sha256(f) == hashlib.sha256(b"A" * 4096).hexdigest()  # from the cache


def test_changed_file_is_hashed_again(tmp_path, data_dir):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"A" * 4096)
    provenance.model_sha256(f)
    st = f.stat()
    # the same size, written again in place (a new mtime): re-hashed
    f.write_bytes(b"B" * 4096)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert provenance.model_sha256(f) == hashlib.sha256(b"B" * 4096).hexdigest()
    # another file of the same size and mtime renamed over it (a new inode): re-hashed
    other = tmp_path / "other.gguf"
    other.write_bytes(b"C" * 4096)
    os.utime(other, ns=(st.st_atime_ns, f.stat().st_mtime_ns))
    other.replace(f)
    assert provenance.model_sha256(f) == hashlib.sha256(b"C" * 4096).hexdigest()
    # a different size: re-hashed
    f.write_bytes(b"C" * 4097)
    assert provenance.model_sha256(f) == hashlib.sha256(b"C" * 4097).hexdigest()
    assert len(_cached(data_dir)) == 4


def test_file_changing_while_hashed_is_not_cached(tmp_path, data_dir, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"A" * 4096)
    real = download.sha256_file

    def hash_then_grow(path):  # a download still writing the model
        digest = real(path)
        with open(path, "ab") as fh:
            fh.write(b"more")
        return digest

    monkeypatch.setattr(download, "sha256_file", hash_then_grow)
    provenance.model_sha256(f)
    assert not (data_dir / provenance.DIGESTS).exists()
    monkeypatch.setattr(download, "sha256_file", real)
    assert provenance.model_sha256(f) == hashlib.sha256(b"A" * 4096 + b"more").hexdigest()


def test_unreadable_digest_cache_is_only_a_miss(tmp_path, data_dir):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"A" * 100)
    data_dir.mkdir()
    (data_dir / provenance.DIGESTS).write_text("{not json")
    assert provenance.model_sha256(f) == hashlib.sha256(b"A" * 100).hexdigest()
    assert len(_cached(data_dir)) == 1


# -- the GGUF header -------------------------------------------------------------------------------
def _vocab_model(out: Path, n_tokens: int, n_merges: int) -> Path:
    """A header shaped like a real model's (string arrays of tokens and merges), written by
    gguf-py, llama.cpp's own writer."""
    w = gguf_py.GGUFWriter(str(out), "qwen2")
    w.add_context_length(32768)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}".encode() for i in range(n_tokens)])
    w.add_token_types([1] * n_tokens)
    w.add_token_merges([f"t{i} k{i}" for i in range(n_merges)])
    w.add_tensor("output_norm.weight", np.ones((64,), np.float32))
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory) -> Path:
    """Qwen2's sizes: 152064 tokens, 151387 merges."""
    return _vocab_model(tmp_path_factory.mktemp("gguf") / "vocab.gguf", 152064, 151387)


def test_big_vocabulary_header_reads(big_vocab):
    m = gguf.check(big_vocab)
    assert (m.arch, m.n_ctx_train, m.n_tensors) == ("qwen2", 32768, 2)
    assert m.metadata["tokenizer.ggml.model"] == "gpt2"
    assert m.metadata["tokenizer.ggml.tokens"] is None  # arrays are walked past, not kept


def test_string_arrays_read_as_gguf_py_reads_them(tmp_path):
    f = _vocab_model(tmp_path / "v.gguf", 3000, 2000)  # gguf-py's reader is slow on big arrays
    m = gguf.check(f)
    ref = gguf_py.GGUFReader(str(f))
    assert m.n_tensors == len(ref.tensors) == 2
    assert set(m.metadata) == set(ref.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    assert m.metadata["qwen2.context_length"] == int(ref.fields["qwen2.context_length"].parts[-1][0])


@pytest.mark.parametrize("cut", [30, 1000, 600_000, 1_500_000, 3_000_000])
def test_cut_inside_the_string_arrays_is_truncated(tmp_path, big_vocab, cut):
    data = big_vocab.read_bytes()
    assert cut < len(data) - 1024  # inside the token list, the merges, or the tensor table
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[:cut])
    with pytest.raises(gguf.ModelError, match="is truncated"):
        gguf.check(f)


def test_tiny_model_reads_as_gguf_py_reads_it(tmp_path):
    f = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)
    m = gguf.check(f)
    ref = gguf_py.GGUFReader(str(f))
    assert m.n_tensors == len(ref.tensors)
    assert m.metadata["llama.embedding_length"] == int(ref.fields["llama.embedding_length"].parts[-1][0])


# -- provenance and imports ------------------------------------------------------------------------
def test_host_provenance_starts_no_process(monkeypatch):
    expected = platform.platform(terse=True)  # the stdlib's answer, before processes are refused

    def refuse(*args, **kwargs):
        raise AssertionError(f"provenance started a process: {args}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    info = provenance.host()
    assert info["os"] == expected and info["kernel"] == os.uname().release
    assert info["cpu"] and info["ram_bytes"] > 0


def test_bench_command_imports_neither_gate_nor_planner():
    code = ("import sys; import rocforge_build.commands.bench, rocforge_build.measure.session; "
            "bad = [m for m in ('rocforge_build.measure.verify', 'rocforge_build.forge.plan', "
            "'rocforge_build.download', 'urllib.request', 'rich') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
