"""A tiny DeepSeek-V3 checkpoint that ships a multi-token prediction layer under its real names
(``model.layers.{num_hidden_layers}.*``), saved from transformers with one decoder layer more
than its config declares (that layer is the MTP layer's decoder block) and the MTP layer's own
tensors added."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tallow.plugin.testing.tokenizer import save_tokenizer

from deepseek_configs import SMALL

LAYERS = int(SMALL["num_hidden_layers"])


def save_mtp_checkpoint(path: Path, seed: int) -> Any:
    """Save the checkpoint at ``path``; returns transformers' model of ``LAYERS + 1`` layers
    (its last layer is the MTP block) and the MTP layer's own tensors."""
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(
        **{**SMALL, "num_hidden_layers": LAYERS + 1}, q_lora_rank=24, n_group=2, topk_group=1
    )
    hf = transformers.DeepseekV3ForCausalLM(config).eval()
    hf.save_pretrained(str(path), safe_serialization=True)
    weights = load_file(str(path / "model.safetensors"))
    hidden, vocab = int(SMALL["hidden_size"]), int(SMALL["vocab_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    own = {
        "enorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "hnorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "eh_proj.weight": 0.1 * torch.randn(hidden, 2 * hidden, generator=gen),
        "embed_tokens.weight": 0.5 * torch.randn(vocab, hidden, generator=gen),
        "shared_head.norm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "shared_head.head.weight": 0.5 * torch.randn(vocab, hidden, generator=gen),
    }
    for name, tensor in own.items():
        weights[f"model.layers.{LAYERS}.{name}"] = tensor
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["num_hidden_layers"] = LAYERS
    cfg["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(cfg))
    save_tokenizer(path)
    return hf, own
