"""Qwen2-MoE and Qwen3-MoE: the Qwen2 / Qwen3 decoders of tallow-model-llama with a
mixture-of-experts MLP.

=========== ================= ========= =================== ===================================
model       q/k/v bias        q/k norm  router              shared expert
=========== ================= ========= =================== ===================================
Qwen2-MoE   ``qkv_bias``      no        softmax top-k,      ``shared_expert`` scaled by
            (default on)                ``norm_topk_prob``  ``sigmoid(shared_expert_gate(x))``
Qwen3-MoE   ``attention_bias`` per head  softmax top-k,      none
                                        ``norm_topk_prob``
=========== ================= ========= =================== ===================================

Layer ``i`` has the MoE block when it is not in ``mlp_only_layers`` and ``(i + 1)`` is a
multiple of ``decoder_sparse_step``; the others keep the dense SwiGLU MLP of
``intermediate_size``. The MoE block is :class:`tallow.layers.FusedMoE` with experts of
``moe_intermediate_size``. Checkpoint names: :mod:`tallow_model_qwen_moe.naming`.

GGUF files (llama.cpp's ``qwen3moe`` and ``qwen2moe``) load too: every layer has the MoE
block, with ``expert_count`` experts of ``expert_feed_forward_length`` and
``expert_used_count`` per token; the shared expert's size is
``expert_shared_feed_forward_length``. Whether the top-k weights are renormalised is
``expert_weights_norm`` when the file states it, else what llama.cpp does for the family
(Qwen3-MoE yes, Qwen2-MoE no). Quantized experts stay quantized under a scheme that keeps
them (tallow-quant-gguf).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import ArchConfig, BuildContext, FusedMoE, RouterSpec
from tallow_model_llama.gguf_config import arch_value
from tallow_model_llama.model import Qwen2ForCausalLM, Qwen3ForCausalLM

from .naming import gguf_name_map, hf_name_map


def num_experts(config: ArchConfig) -> int:
    """The routed experts of a config: ``num_experts`` (checkpoints) or ``num_local_experts``
    (what transformers 5 writes for Qwen3-MoE)."""
    value = config.get("num_experts") or config.get("num_local_experts")
    if not value:
        raise ValueError("model config: 'num_experts' (or 'num_local_experts') is required")
    return int(value)


def is_moe_layer(config: ArchConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` has the MoE block (transformers' rule)."""
    step = int(config.get("decoder_sparse_step") or 1)
    return (
        layer not in (config.get("mlp_only_layers") or [])
        and num_experts(config) > 0
        and (layer + 1) % step == 0
    )


def moe_block(config: ArchConfig, build: BuildContext, prefix: str, shared_gate: bool) -> FusedMoE:
    """The MoE block of one layer: softmax top-k routing, SwiGLU experts, and (Qwen2-MoE) a
    shared expert of ``shared_expert_intermediate_size`` behind a sigmoid gate."""
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(
            f"model config: hidden_act {config.get('hidden_act')!r} is not "
            "supported by the experts (SwiGLU)"
        )
    shared = int(config.get("shared_expert_intermediate_size") or 0) if shared_gate else 0
    return FusedMoE(
        num_experts(config),
        int(config.hidden_size),
        int(config.require("moe_intermediate_size")),
        router=RouterSpec(
            top_k=int(config.require("num_experts_per_tok")),
            renormalize=bool(config.get("norm_topk_prob", False)),
        ),
        shared_intermediate_size=shared,
        shared_gate=bool(shared),
        build=build,
        prefix=prefix,
    )


def moe_config_from_gguf(
    metadata: dict[str, Any], config: dict[str, Any], *, norm_topk: bool
) -> dict[str, Any]:
    """The MoE keys of a ``qwen3moe`` / ``qwen2moe`` GGUF config (see the module docstring);
    ``norm_topk`` is llama.cpp's choice for the family when the file does not say."""
    cfg = dict(config)
    experts = arch_value(metadata, "expert_count")
    if not experts:
        raise ValueError(
            "GGUF metadata expert_count is missing or zero: not a mixture-of-experts file"
        )
    cfg["num_experts"] = int(experts)
    for key, gguf_key in (
        ("num_experts_per_tok", "expert_used_count"),
        ("moe_intermediate_size", "expert_feed_forward_length"),
    ):
        value = arch_value(metadata, gguf_key)
        if value is None:
            raise ValueError(f"GGUF metadata {gguf_key} is missing; it is needed for {key}")
        cfg[key] = int(value)
    shared = arch_value(metadata, "expert_shared_feed_forward_length")
    if shared:
        cfg["shared_expert_intermediate_size"] = int(shared)
    norm = arch_value(metadata, "expert_weights_norm")
    cfg["norm_topk_prob"] = bool(norm_topk if norm is None else norm)
    cfg["decoder_sparse_step"] = 1
    cfg["mlp_only_layers"] = []
    return cfg


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, no shared expert."""

    hf_architectures = ("Qwen3MoeForCausalLM",)
    gguf_architectures = ("qwen3moe",)
    model_type = "qwen3_moe"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return moe_config_from_gguf(
            metadata, super().config_from_gguf(metadata, config), norm_topk=True
        )

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        if is_moe_layer(config, layer):
            return moe_block(config, build, prefix, shared_gate=False)
        return super().build_mlp(config, build, layer, prefix)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    """Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention with ``qkv_bias``, a
    gated shared expert beside the routed ones."""

    hf_architectures = ("Qwen2MoeForCausalLM",)
    gguf_architectures = ("qwen2moe",)
    model_type = "qwen2_moe"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return moe_config_from_gguf(
            metadata, super().config_from_gguf(metadata, config), norm_topk=False
        )

    def as_row(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """GGUF's shared-expert gate ``[H]`` (or ``[1, H]``) as the linear weight ``[1, H]``."""
        return tensor.reshape(1, -1)

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("qkv_bias", True))

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        if is_moe_layer(config, layer):
            return moe_block(config, build, prefix, shared_gate=True)
        return super().build_mlp(config, build, layer, prefix)
