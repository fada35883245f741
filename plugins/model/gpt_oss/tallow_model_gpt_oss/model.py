"""gpt-oss (gpt-oss-20b, gpt-oss-120b): a Llama-style decoder with

- **attention sinks**: a learned logit per query head in every softmax's denominator
  (:class:`tallow.layers.Attention` with ``sinks=True``), q/k/v/o projections with biases;
- **alternating sliding-window and full layers** (``layer_types``: ``sliding_attention``
  layers see the last ``sliding_window`` tokens, 128 in the released models);
- **YaRN** rotary scaling (``rope_scaling`` / ``rope_parameters``: factor 32 over an original
  context of 4096, ``beta_fast`` 32, ``beta_slow`` 1, not truncated), GPT-NeoX-style halves;
- a **mixture of experts** in every layer (:class:`tallow.layers.FusedMoE`): the router is a
  biased linear layer whose ``num_experts_per_tok`` largest logits are softmaxed among
  themselves (``RouterSpec(scoring="softmax_selected")``, transformers' ``GptOssTopKRouter``);
  the experts are clamped SwiGLU MLPs with biases (``swiglu_clamp``: ``gate`` clamped above at
  ``swiglu_limit``, ``up`` to ``±swiglu_limit``, ``(up + 1) * gate * sigmoid(swiglu_alpha *
  gate)``). Their weights are float, or MXFP4 as published, kept packed by the ``fp4`` quant
  scheme of tallow-quant-fp4.

Checkpoint names and layouts: :mod:`tallow_model_gpt_oss.naming`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    FusedMoE,
    RotaryEmbedding,
    RouterSpec,
)
from tallow_model_llama.model import LlamaAttention, LlamaForCausalLM

from . import naming

#: what transformers' GptOssConfig assumes when config.json leaves a key out
DEFAULTS: dict[str, Any] = {
    "attention_bias": True,
    "head_dim": 64,
    "sliding_window": 128,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
#: the rotary scaling of the released models (transformers' default for gpt-oss)
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
DEFAULT_ROPE_THETA = 150000.0
LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_types(config: ArchConfig) -> list[str]:
    """Each layer's attention kind: ``layer_types``, else sliding on even layers and full on
    odd ones (transformers' default)."""
    n = int(config.require("num_hidden_layers"))
    types = config.get("layer_types")
    if types is None:
        return [LAYER_TYPES[i % 2] for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise ValueError(
            f"model config: layer_types must list {n} entries, each one of "
            f"{', '.join(LAYER_TYPES)}; got {types!r}"
        )
    return list(types)


class GptOssAttention(LlamaAttention):
    """Llama's attention block (biased q/k/v/o, RoPE) over an attention layer with sinks."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        *,
        head_dim: int,
        bias: bool,
        sliding_window: int | None,
        prefix: str,
    ) -> None:
        super().__init__(
            config,
            build,
            layer_index,
            rotary,
            head_dim=head_dim,
            qkv_bias=bias,
            o_bias=bias,
            qk_norm=False,
            sliding_window=sliding_window,
            prefix=prefix,
        )
        heads = self.qkv_proj.num_heads
        self.attn = Attention(
            layer_index,
            heads,
            self.qkv_proj.num_kv_heads,
            head_dim,
            scale=head_dim**-0.5,
            sliding_window=sliding_window,
            sinks=True,
            sinks_head_offset=build.tp_rank * heads,
            device=build.device,
        )


def moe_block(config: ArchConfig, build: BuildContext, prefix: str) -> FusedMoE:
    """One layer's mixture of experts (see the module docstring)."""
    experts = config.get("num_local_experts") or config.get("num_experts")
    if not experts:
        raise ValueError("model config: 'num_local_experts' is required")
    return FusedMoE(
        int(experts),
        int(config.hidden_size),
        int(config.require("intermediate_size")),
        router=RouterSpec(
            top_k=int(config.require("num_experts_per_tok")), scoring="softmax_selected"
        ),
        router_bias=True,
        activation="swiglu_clamp",
        expert_bias=True,
        swiglu_alpha=float(config.get("swiglu_alpha", DEFAULTS["swiglu_alpha"])),
        swiglu_limit=float(config.get("swiglu_limit", DEFAULTS["swiglu_limit"])),
        build=build,
        prefix=prefix,
    )


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss (see the module docstring)."""

    hf_architectures = ("GptOssForCausalLM",)
    gguf_architectures = ()
    model_type = "gpt_oss"
    tasks = ("generate",)
    weight_name_maps = {"hf": naming.hf_name_map()}
    base_model_prefix = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        config = ArchConfig(self.config_from_hf(dict(config)))
        self._layer_types = layer_types(config)
        super().__init__(config, build)

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", True))

    o_bias = qkv_bias

    def layer_sliding_window(self, config: ArchConfig, layer: int) -> int | None:
        if self._layer_types[layer] != "sliding_attention":
            return None
        return int(config.require("sliding_window"))

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        return GptOssAttention(
            config,
            build,
            layer,
            rotary,
            head_dim=head_dim,
            bias=self.qkv_bias(config),
            sliding_window=self.layer_sliding_window(config, layer),
            prefix=prefix,
        )

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        return moe_block(config, build, prefix)

    # -- loading: gpt-oss's expert layouts (see naming) -------------------------------------
    def split_gate_up(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return naming.split_interleaved_gate_up(tensor)

    def gate_up_from_hf(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return naming.gate_up_from_hf(tensor)

    def down_from_hf(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return naming.down_from_hf(tensor)

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """transformers' defaults for what a gpt-oss ``config.json`` leaves out: biases, head
        size, the window and its alternating layers, the clamped SwiGLU, YaRN."""
        out = dict(config)
        for key, value in DEFAULTS.items():
            if out.get(key) is None:
                out[key] = value
        if out.get("rope_theta") is None:
            out["rope_theta"] = DEFAULT_ROPE_THETA  # rope_parameters' own rope_theta wins
        if not (config.get("rope_scaling") or config.get("rope_parameters")):
            out["rope_scaling"] = dict(DEFAULT_ROPE)
        if "layer_types" not in config and "num_hidden_layers" in config:
            out["layer_types"] = layer_types(ArchConfig(out))
        return out
