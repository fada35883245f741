"""GLM-4, the 0414 family (``Glm4ForCausalLM``: GLM-4-9B/32B-0414, GLM-Z1): the Llama decoder
with

- two more norms per layer: ``post_self_attn_layernorm`` on the attention output and
  ``post_mlp_layernorm`` on the MLP output, each before its residual add (four norms in all);
- partial rotary (``partial_rotary_factor``, 0.5 in the released models) in GLM's interleaved
  layout: feature ``2i`` pairs with ``2i + 1`` (GPT-J style), over the first
  ``head_dim * partial_rotary_factor`` features of each head;
- biases on q, k and v (``attention_bias``, on by default), none on the output projection or
  the MLP; gate and up stored fused (``gate_up_proj``) in the checkpoint.

A config without ``partial_rotary_factor`` rotates half of each head, as transformers assumes.
Tensor names, HF and GGUF, are listed in :mod:`tallow_model_glm4.naming`. A GGUF config is completed by
the Llama family's ``config_from_gguf``: the rotary size (``rope.dimension_count``) gives the
partial rotary factor, the tensors say whether q, k and v have biases.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import ArchConfig, BuildContext, RMSNorm
from tallow_model_llama.model import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

from .naming import gguf_name_map, hf_name_map


class Glm4DecoderLayer(LlamaDecoderLayer):
    """Pre-norm attention and MLP blocks whose outputs are normed again before they join the
    residual stream (the adds are deferred into the next pre-norm, as in Llama)."""

    def __init__(
        self, attn: nn.Module, mlp: LlamaMLP, hidden: int, eps: float, build: BuildContext
    ) -> None:
        super().__init__(attn, mlp, hidden, eps, build)
        self.post_self_attn_layernorm = RMSNorm(hidden, eps, build=build)
        self.post_mlp_layernorm = RMSNorm(hidden, eps, build=build)

    def attention_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.post_self_attn_layernorm(hidden)

    def mlp_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.post_mlp_layernorm(hidden)


class Glm4ForCausalLM(LlamaForCausalLM):
    """GLM-4-0414 (see the module docstring)."""

    hf_architectures = ("Glm4ForCausalLM",)
    gguf_architectures = ("glm4",)
    model_type = "glm4"
    rope_neox_style = False
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        cfg = ArchConfig(config)
        # transformers' default for GLM-4 configs that do not say (rope_parameters wins)
        cfg.setdefault("partial_rotary_factor", 0.5)
        super().__init__(cfg, build)

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", True))

    def o_bias(self, config: ArchConfig) -> bool:
        return False

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def build_decoder_layer(
        self, config: ArchConfig, build: BuildContext, attn: nn.Module, mlp: LlamaMLP
    ) -> nn.Module:
        return Glm4DecoderLayer(
            attn, mlp, int(config.hidden_size), float(config.get("rms_norm_eps", 1e-6)), build
        )

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        cfg = super().config_from_gguf(metadata, config)
        # the file states its rotary size; without a partial factor it rotates whole heads
        cfg.setdefault("partial_rotary_factor", 1.0)
        return cfg
