"""GLM-4.5, GLM-4.6 and GLM-4.7 (``Glm4MoeForCausalLM``): tallow-model-llama's decoder with
grouped-query attention (q/k/v biases with ``attention_bias``, per-head q/k RMSNorm with
``use_qk_norm``, rotate-half rope over the first ``partial_rotary_factor`` of each head,
0.5 unless the config says otherwise) and, from layer ``first_k_dense_replace`` on, DeepSeek-V3's
mixture of experts (tallow-model-deepseek's block: sigmoid routing with
``e_score_correction_bias`` over ``n_group`` groups, ``norm_topk_prob``,
``routed_scaling_factor``, ``n_shared_experts`` shared experts).

Checkpoint names: tallow-model-llama's for attention, norms, the dense MLP and the head, plus the
MoE block's (:func:`tallow_model_deepseek.naming.moe_rules`); the multi-token prediction
layers (``model.layers.{num_hidden_layers}...``) are skipped, unless ``build.mtp``
(``speculative.method: mtp``) asks for the first of them: DeepSeek-V3's layer
(:mod:`tallow_model_deepseek.mtp`) around a decoder layer of this model, ``mtp_head()``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable

import torch
from torch import nn

from tallow.layers import ArchConfig, BuildContext, QuantizedWeight, RotaryEmbedding, WeightNameMap
from tallow_model_llama.model import LlamaAttention, LlamaForCausalLM
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map
from tallow_model_deepseek.model import moe_block, sigmoid_router
from tallow_model_deepseek.mtp import DeepseekMTPHead, build_mtp_head, model_tensors
from tallow_model_deepseek.naming import moe_rules

#: transformers' default of GLM-4.5 configs that do not say
PARTIAL_ROTARY_FACTOR = 0.5


class Glm4MoeForCausalLM(LlamaForCausalLM):
    """GLM-4.5 / 4.6 / 4.7 (see the module docstring)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Glm4MoeForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    model_type: ClassVar[str] = "glm4_moe"
    tasks: ClassVar[tuple[str, ...]] = ("generate",)
    weight_name_maps = {"hf": WeightNameMap(moe_rules()) + llama_hf_name_map()}
    base_model_prefix = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(ArchConfig(self.config_from_hf(dict(config))), build)
        # not a submodule: the model's forward and KV cache know nothing of it
        self._mtp = build_mtp_head(self, build)

    def mtp_head(self) -> DeepseekMTPHead | None:
        return self._mtp[0] if self._mtp else None

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", False))

    def o_bias(self, config: ArchConfig) -> bool:
        return False

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        return LlamaAttention(
            config,
            build,
            layer,
            rotary,
            head_dim=head_dim,
            qkv_bias=self.qkv_bias(config),
            o_bias=False,
            qk_norm=bool(config.get("use_qk_norm", False)),
            sliding_window=None,
            prefix=prefix,
        )

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        if layer < int(config.get("first_k_dense_replace") or 0) or not int(
            config.get("n_routed_experts") or 0
        ):
            return super().build_mlp(config, build, layer, prefix)
        return moe_block(config, build, prefix, sigmoid_router(config), correction_bias=True)

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]], naming: str = "hf"
    ) -> set[str]:
        head = self.mtp_head()
        # the head's tensors are kept aside while the model's stream past
        own: list[tuple[str, torch.Tensor | QuantizedWeight]] = []
        layers = int(self.config.num_hidden_layers)
        loaded = super().load_weights(
            model_tensors(tensors, layers, own if head is not None else None), naming
        )
        if head is not None:
            head.load_weights(own, naming)
        return loaded

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        return set()

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``n_routed_experts`` (also read as transformers' ``num_local_experts``) and the
        rotary fraction GLM-4.5 configs may leave to the default."""
        cfg = dict(config)
        if not cfg.get("n_routed_experts") and cfg.get("num_local_experts"):
            cfg["n_routed_experts"] = cfg["num_local_experts"]
        params = cfg.get("rope_parameters") or {}
        if "partial_rotary_factor" not in cfg and "partial_rotary_factor" not in params:
            cfg["partial_rotary_factor"] = PARTIAL_ROTARY_FACTOR
        return cfg

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"{cls.__name__} does not load GGUF files")
