"""The GGUF format against tallow's weight-format conformance suite: a tiny Llama file of float
and block-quantized tensors, whose values the gguf package's own dequantizers give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import gguf_synthetic as gs
from tallow.plugin.testing import WeightFormatConformance, WrittenCheckpoint


def write_tiny_gguf(path: Path) -> WrittenCheckpoint:
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    n_vocab = len(gs.sentencepiece_vocab()[0])
    arrays = {
        "token_embd.weight": (rng.standard_normal((n_vocab, 64)), Q.Q8_0),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)), Q.Q4_0),
        "blk.0.attn_k.weight": (rng.standard_normal((32, 64)), Q.F16),
        "blk.0.ffn_down.weight": (rng.standard_normal((64, 128)), Q.BF16),
        "blk.0.attn_norm.weight": (rng.standard_normal((64,)), Q.F32),
    }
    arrays = {k: (a.astype(np.float32), q) for k, (a, q) in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    gs.write_sentencepiece_gguf(path, tensors=arrays)
    expected = {
        name: torch.from_numpy(
            np.asarray(gguf.quants.dequantize(gguf.quants.quantize(a, q), q), np.float32).copy()
        )
        for name, (a, q) in arrays.items()
    }
    return WrittenCheckpoint(str(path), expected, "gguf:llama", [path])


class TestGGUFConformance(WeightFormatConformance):
    distribution = "tallow-format-gguf"
    component = "gguf"
    light_modules = ("torch", "gguf", "numpy", "tokenizers")

    def write_checkpoint(self, directory: Path) -> WrittenCheckpoint:
        return write_tiny_gguf(directory / "tiny.gguf")
