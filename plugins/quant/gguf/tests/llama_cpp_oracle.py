"""llama.cpp's own quantizer as a test oracle, and the small float GGUF models it quantizes.

:func:`llama_cpp_quantize` runs ``llama_model_quantize`` of the ``llama-cpp-python`` package
(the core's ``test`` extra pins it; ``make install`` builds it with ``GGML_NATIVE=OFF``): the
same function ``llama-quantize`` runs, so the file it writes has llama.cpp's tensor types
(``llama_tensor_get_type``) and llama.cpp's block quantizers' bytes (``quantize_row_*_ref``
without an importance matrix).

:func:`write_float_gguf` writes a tiny dense ``llama`` or ``qwen2`` model in F32 (a few tensors
in F16/BF16) with values chosen to reach the quantizers' corner cases: outliers, all-zero and
constant blocks, blocks of signed zeros, one-signed blocks, magnitudes below llama.cpp's
``GROUP_MAX_EPS``, and ties of the absolute maximum.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TinyModel:
    arch: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool


_QUIET: list = []


def _silence(llama_cpp) -> None:
    """llama.cpp logs every tensor it quantizes; a no-op log callback (kept alive here)."""
    if not _QUIET:
        _QUIET.append(llama_cpp.llama_log_callback(lambda level, text, data: None))
        llama_cpp.llama_log_set(_QUIET[0], ctypes.c_void_p(0))


def llama_cpp_quantize(src: Path, dst: Path, ftype: int) -> None:
    """``llama_model_quantize(src, dst, ftype)`` with llama.cpp's default parameters, on one
    thread; RuntimeError if it fails."""
    import llama_cpp

    _silence(llama_cpp)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src}, ftype={ftype}) failed with {rc}")


def _matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Gaussian rows of varied scale, with the corner cases every block quantizer meets."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= np.exp(rng.uniform(-3.0, 0.0, (rows, 1))).astype(np.float32) * np.float32(0.05)
    flat = w.reshape(-1)
    n = flat.size
    picks = rng.choice(n, size=max(1, n // 500), replace=False)
    flat[picks] *= np.float32(40.0)  # outliers: one weight dominates its block
    blocks32 = flat[: n - n % 32].reshape(-1, 32)
    k = blocks32.shape[0]
    if k >= 16:
        blocks32[k // 16] = 0.0  # all zeros
        blocks32[k // 8] = np.float32(0.0123)  # constant
        blocks32[k // 4] = np.abs(blocks32[k // 4])  # one sign only
        blocks32[k // 3] = -np.abs(blocks32[k // 3])
        blocks32[k // 2] *= np.float32(1e-17)  # below GROUP_MAX_EPS
        blocks32[2 * k // 3, :2] = [np.float32(0.07), np.float32(-0.07)]  # tied |max|
        blocks32[2 * k // 3, 2:] *= np.float32(0.1)
        blocks32[3 * k // 4] = np.float32(-0.0)  # negative zeros
        blocks32[5 * k // 6] = np.where(
            np.arange(32) % 3 == 0, np.float32(-0.0), np.float32(0.0)
        )  # zeros of both signs
    return w


def write_float_gguf(path: Path, m: TinyModel, seed: int = 0) -> Path:
    """The model as llama.cpp's converter lays it out: F32 matrices and norms (the token
    embedding in F16, the last layer's ffn norm in BF16), q/k/v biases for ``qwen2``, no
    ``output.weight`` when tied."""
    import gguf

    rng = np.random.default_rng(seed)
    head_dim = m.hidden // m.heads
    w = gguf.GGUFWriter(str(path), m.arch)
    w.add_block_count(m.layers)
    w.add_context_length(256)
    w.add_embedding_length(m.hidden)
    w.add_feed_forward_length(m.intermediate)
    w.add_head_count(m.heads)
    w.add_head_count_kv(m.kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0)  # ALL_F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"t{i}" for i in range(m.vocab)])
    w.add_token_types([1] * m.vocab)
    w.add_token_merges([])

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    w.add_tensor("token_embd.weight", _matrix(rng, m.vocab, m.hidden).astype(np.float16))
    kv = m.kv_heads * head_dim
    for i in range(m.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(m.hidden))
        for short, rows in (("attn_q", m.hidden), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(p + short + ".weight", _matrix(rng, rows, m.hidden))
            if m.arch == "qwen2":
                w.add_tensor(
                    p + short + ".bias", (0.02 * rng.standard_normal(rows)).astype(np.float32)
                )
        w.add_tensor(p + "attn_output.weight", _matrix(rng, m.hidden, m.hidden))
        if i == m.layers - 1:
            bits = norm(m.hidden).view(np.uint32) >> 16  # exact BF16 values
            w.add_tensor(
                p + "ffn_norm.weight",
                bits.astype(np.uint16).view(np.uint8),
                raw_dtype=gguf.GGMLQuantizationType.BF16,
            )
        else:
            w.add_tensor(p + "ffn_norm.weight", norm(m.hidden))
        w.add_tensor(p + "ffn_gate.weight", _matrix(rng, m.intermediate, m.hidden))
        w.add_tensor(p + "ffn_up.weight", _matrix(rng, m.intermediate, m.hidden))
        w.add_tensor(p + "ffn_down.weight", _matrix(rng, m.hidden, m.intermediate))
    w.add_tensor("output_norm.weight", norm(m.hidden))
    if not m.tied:
        w.add_tensor("output.weight", _matrix(rng, m.vocab, m.hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tensors_of(path: Path) -> dict[str, tuple[str, bytes]]:
    """``name -> (GGML type name, data bytes)`` of every tensor of a GGUF file."""
    from gguf import GGUFReader

    return {
        t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in GGUFReader(path).tensors
    }
