"""Mixtral (Mixtral-8x7B, Mixtral-8x22B): Mistral's attention (GQA, ``sliding_window`` on every
layer when set) with a sparse mixture-of-experts block in every layer.

The router is transformers' ``MixtralTopKRouter``: a softmax over all ``num_local_experts``
logits, the ``num_experts_per_tok`` best, their weights renormalised to sum to one
(:class:`tallow.layers.RouterSpec` with ``renormalize=True``). The experts are SwiGLU MLPs of
``intermediate_size`` (``w1`` gate, ``w3`` up, ``w2`` down); there is no shared expert.
Checkpoint names: :mod:`tallow_model_mixtral.naming`.

GGUF: llama.cpp writes Mixtral as architecture ``llama`` with ``llama.expert_count``;
tallow-model-llama's ``config_from_gguf`` names this class for such files, and the engine builds it.
Quantized experts stay quantized under a scheme that keeps them (tallow-quant-gguf).
"""

from __future__ import annotations

from torch import nn

from tallow.layers import ArchConfig, BuildContext, FusedMoE, RouterSpec
from tallow_model_llama.model import MistralForCausalLM

from .naming import gguf_name_map, hf_name_map


def moe_block(config: ArchConfig, build: BuildContext, prefix: str) -> FusedMoE:
    """One layer's sparse MoE block."""
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(
            f"model config: hidden_act {config.get('hidden_act')!r} is not "
            "supported by the experts (SwiGLU)"
        )
    return FusedMoE(
        int(config.require("num_local_experts")),
        int(config.hidden_size),
        int(config.require("intermediate_size")),
        router=RouterSpec(top_k=int(config.require("num_experts_per_tok")), renormalize=True),
        build=build,
        prefix=prefix,
    )


class MixtralForCausalLM(MistralForCausalLM):
    """Mixtral: every decoder layer's MLP is the sparse MoE block."""

    hf_architectures = ("MixtralForCausalLM",)
    gguf_architectures = ()
    model_type = "mixtral"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        return moe_block(config, build, prefix)
