"""Write a tiny random-weight llama-architecture GGUF (no real weights) for smoke-running
llama-bench on builds made in tests.  Uses the `gguf` package (PyPI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff
SIZES = {"tiny": (1024, 256, 2, 4, 2, 512), "small": (8192, 1024, 4, 8, 4, 2816),
         "medium": (32000, 2048, 8, 16, 8, 5632)}  # ~0.5 B parameters: GPU runs (docs/measurements/measuring.md)


def write(out: Path, size: str = "tiny", seed: int = 0, *, byte_tokens: bool = False,
          n_ctx: int = 2048, sharp: float | None = None) -> Path:
    """`byte_tokens`: the vocabulary starts with SentencePiece's 256 byte tokens <0x00>..<0xFF>, so
    llama.cpp can tokenize any text (llama-perplexity); without them only bench runs work.
    `sharp`: the output norm's weights (1 otherwise) scale every logit by it, so a random model is
    sure of itself and wrong: most text tokens land far below llama-perplexity's -16
    log-probability clamp of the KL base."""
    import gguf

    n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff = SIZES[size]
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    n_bytes = 256 if byte_tokens else 0
    tokens = ([b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(n_bytes)]
              + [f"<w{i}>".encode() for i in range(3 + n_bytes, n_vocab)])
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [6] * n_bytes + [1] * (n_vocab - 3 - n_bytes))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(seed)

    def tensor(name: str, shape: tuple[int, ...], norm: bool = False) -> None:
        if norm:
            w.add_tensor(name, np.ones(shape, np.float32))
        else:
            w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))

    tensor("token_embd.weight", (n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (n_embd,), norm=True)
        tensor(p + "attn_q.weight", (n_embd, n_embd))
        tensor(p + "attn_k.weight", (n_head_kv * head_dim, n_embd))
        tensor(p + "attn_v.weight", (n_head_kv * head_dim, n_embd))
        tensor(p + "attn_output.weight", (n_embd, n_embd))
        tensor(p + "ffn_norm.weight", (n_embd,), norm=True)
        tensor(p + "ffn_gate.weight", (n_ff, n_embd))
        tensor(p + "ffn_up.weight", (n_ff, n_embd))
        tensor(p + "ffn_down.weight", (n_embd, n_ff))
    if sharp:
        w.add_tensor("output_norm.weight", np.full((n_embd,), sharp, np.float32))
    else:
        tensor("output_norm.weight", (n_embd,), norm=True)
    tensor("output.weight", (n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# -- raw bytes, for damaged and hostile headers the gguf package would not write ------------------
UINT32, INT32, FLOAT32, STRING, ARRAY = 4, 5, 6, 8, 9  # GGUF value types (ggml docs/gguf.md)


def gguf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(8, "little") + data


def raw(kvs: list[tuple[str, int, bytes]], *, n_tensors: int = 0, n_kv: int | None = None,
        tail: bytes = b"") -> bytes:
    """A GGUF v3 file: header counts (n_kv defaults to len(kvs)), then each (key, value type,
    value bytes as written), then `tail` (tensor table, data).  Nothing is checked: the point is
    to write what a hostile or damaged file holds."""
    out = b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little")
    out += (len(kvs) if n_kv is None else n_kv).to_bytes(8, "little")
    for key, vtype, value in kvs:
        out += gguf_string(key) + vtype.to_bytes(4, "little") + value
    return out + tail


if __name__ == "__main__":
    import sys

    write(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tiny",
          byte_tokens="--byte-tokens" in sys.argv,
          n_ctx=int(sys.argv[sys.argv.index("--ctx") + 1]) if "--ctx" in sys.argv else 2048)
