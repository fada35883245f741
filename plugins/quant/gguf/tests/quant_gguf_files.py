"""Small Llama-family GGUF files whose matrices are GGML blocks of chosen types, for tests.

Block types the ``gguf`` package can quantize to (Q4_0 … Q8_0) are quantized from random
weights; the others (k-quants, IQ4) are random blocks with small scales; F32 and F16 are the
random weights themselves. Either way the file
is a valid GGUF model whose values are whatever its blocks decode to."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quant_blocks import random_blocks

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 256, 512, 4, 2, 320
HEAD_DIM = HIDDEN // HEADS
#: per GGUF tensor name (layer names with {i}), the type of each layer's matrices
MIXED = [
    {
        "attn_q": "Q4_K",
        "attn_k": "Q6_K",
        "attn_v": "Q8_0",
        "attn_output": "Q5_K",
        "ffn_gate": "Q4_0",
        "ffn_up": "Q4_0",
        "ffn_down": "Q3_K",
    },
    {
        "attn_q": "IQ4_XS",
        "attn_k": "IQ4_XS",
        "attn_v": "Q5_1",
        "attn_output": "Q2_K",
        "ffn_gate": "Q4_1",
        "ffn_up": "IQ4_NL",
        "ffn_down": "Q5_0",
    },
]
_SHAPES = {
    "attn_q": (HIDDEN, HIDDEN),
    "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_output": (HIDDEN, HIDDEN),
    "ffn_gate": (INTERMEDIATE, HIDDEN),
    "ffn_up": (INTERMEDIATE, HIDDEN),
    "ffn_down": (HIDDEN, INTERMEDIATE),
}


def _matrix(rng: np.random.Generator, qtype: str, rows: int, cols: int, seed: int):
    import gguf

    Q = gguf.GGMLQuantizationType
    if qtype in ("F32", "F16"):
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return w.astype(np.float16 if qtype == "F16" else np.float32), None
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return gguf.quants.quantize(w, Q[qtype]), Q[qtype]
    block = gguf.GGML_QUANT_SIZES[Q[qtype]][0]
    blocks = random_blocks(
        qtype, rows, cols // block, seed=seed, extremes=False, d_range=(1e-4, 5e-4)
    )
    return blocks, Q[qtype]


def write_llama_gguf(
    path: Path,
    arch: str = "llama",
    layer_types: list[dict] = MIXED,
    embed_type: str = "Q8_0",
    head_type: str | None = "Q6_K",
    seed: int = 0,
) -> Path:
    """Write the model; ``head_type`` None writes no ``output.weight`` (a tied head). ``qwen2``
    files get q/k/v biases, as Qwen2 has."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(len(layer_types))
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([1] * VOCAB)
    n = 0

    def add(name: str, qtype: str, rows: int, cols: int) -> None:
        nonlocal n
        data, q = _matrix(rng, qtype, rows, cols, seed * 1000 + n)
        n += 1
        w.add_tensor(name, data, raw_dtype=q)  # the shape follows from the bytes

    add("token_embd.weight", embed_type, VOCAB, HIDDEN)
    for i, types in enumerate(layer_types):
        for short, qtype in types.items():
            add(f"blk.{i}.{short}.weight", qtype, *_SHAPES[short])
        if arch == "qwen2":
            for short in ("attn_q", "attn_k", "attn_v"):
                rows = _SHAPES[short][0]
                w.add_tensor(
                    f"blk.{i}.{short}.bias", (0.1 * rng.standard_normal(rows)).astype(np.float32)
                )
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(
                f"blk.{i}.{norm}.weight",
                (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
            )
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if head_type is not None:
        add("output.weight", head_type, VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
