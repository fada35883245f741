"""IBM Granite 3 (``GraniteForCausalLM``): the Llama decoder with four scalar multipliers.

============================ ===================================== =======================
config key                   effect                                GGUF key
============================ ===================================== =======================
``embedding_multiplier``     scales the token embeddings           ``embedding_scale``
``residual_multiplier``      scales each block's output before     ``residual_scale``
                             it joins the residual stream
``attention_multiplier``     the softmax scale of q·k (replaces    ``attention.scale``
                             ``1 / sqrt(head_dim)``; default 1)
``logits_scaling``           divides the logits                    ``logit_scale``
============================ ===================================== =======================

Biases follow ``attention_bias`` (q, k, v and the output projection) and ``mlp_bias``, as in
Llama. Checkpoint names are the Llama family's; GGUF files of architecture ``granite`` store Q
and K rows permuted like ``llama`` files, and the model undoes it on load.
"""

from __future__ import annotations

from typing import Any

import torch

from tallow.layers import ArchConfig, BuildContext
from tallow_model_llama.gguf_config import arch_value
from tallow_model_llama.model import LlamaForCausalLM
from tallow_model_llama.naming import gguf_name_map, hf_name_map

#: HF config key → GGUF architecture key (what llama.cpp's converter writes, when not zero)
GGUF_MULTIPLIERS = {
    "embedding_multiplier": "embedding_scale",
    "residual_multiplier": "residual_scale",
    "attention_multiplier": "attention.scale",
    "logits_scaling": "logit_scale",
}


def _multiplier(config: ArchConfig, key: str) -> float:
    value = config.get(key)
    if value is None:
        return 1.0
    value = float(value)
    if value == 0.0:
        raise ValueError(f"model config: {key!r} is 0; expected a non-zero multiplier")
    return value


class GraniteForCausalLM(LlamaForCausalLM):
    """Granite 3 (see the module docstring)."""

    hf_architectures = ("GraniteForCausalLM",)
    gguf_architectures = ("granite",)
    model_type = "granite"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map(interleaved_qk=True)}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        self.logits_scaling = _multiplier(self.config, "logits_scaling")

    def attention_scale(self, config: ArchConfig, head_dim: int) -> float | None:
        return _multiplier(config, "attention_multiplier")

    def embedding_multiplier(self, config: ArchConfig) -> float:
        return _multiplier(config, "embedding_multiplier")

    def residual_multiplier(self, config: ArchConfig) -> float:
        return _multiplier(config, "residual_multiplier")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The Llama family's keys plus the four multipliers. A key the file lacks means 1,
        except the attention scale, which llama.cpp then takes as ``1 / sqrt(head_dim)``
        (transformers' default for a config without it is 1)."""
        cfg = super().config_from_gguf(metadata, config)
        for hf_key, gguf_key in GGUF_MULTIPLIERS.items():
            value = arch_value(metadata, gguf_key)
            if value is not None:
                cfg[hf_key] = float(value)
        cfg.setdefault("attention_multiplier", float(cfg["head_dim"]) ** -0.5)
        return cfg
