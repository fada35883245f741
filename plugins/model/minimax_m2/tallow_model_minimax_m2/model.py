"""MiniMax M2 (``MiniMaxM2ForCausalLM``: MiniMax-M2, M2.1): tallow-model-llama's decoder with

- grouped-query attention without biases, q and k RMS-normed over the whole projection (all
  heads at once, before the rope: tallow-model-olmo2's :class:`~tallow_model_olmo2.model.Olmo2Attention`),
  rotate-half rope over the first ``rotary_dim`` features of each head (transformers' config
  calls it ``partial_rotary_factor = rotary_dim / head_dim``);
- in every layer a mixture of ``num_local_experts`` SwiGLU experts of ``intermediate_size``:
  sigmoid scores, the ``num_experts_per_tok`` best of scores plus ``e_score_correction_bias``,
  their sigmoid weights renormalised to sum to one; no groups, no shared expert, no scaling.

Checkpoint names: :mod:`tallow_model_minimax_m2.naming`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from tallow.layers import ArchConfig, BuildContext, FusedMoE, RotaryEmbedding, RouterSpec
from tallow_model_llama.model import LlamaForCausalLM
from tallow_model_olmo2.model import Olmo2Attention

from .naming import hf_name_map


def _check(config: dict[str, Any]) -> None:
    """Refuses the settings of the MiniMax family this model does not run, naming the field."""
    if config.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError(
            f"model config: scoring_func {config['scoring_func']!r} is not "
            "supported for MiniMax M2 (expected 'sigmoid')"
        )
    if config.get("qk_norm_type", "per_layer") != "per_layer":
        raise ValueError(
            f"model config: qk_norm_type {config['qk_norm_type']!r} is not "
            "supported for MiniMax M2 (expected 'per_layer': one norm over all "
            "heads)"
        )
    if config.get("use_qk_norm") is False:
        raise ValueError("model config: use_qk_norm false is not supported for MiniMax M2")
    kinds = config.get("attn_type_list")
    if kinds is not None and any(int(k) != 1 for k in kinds):
        raise ValueError(
            "model config: attn_type_list asks for linear (lightning) attention "
            f"layers ({kinds!r}); MiniMax M2 runs full attention only (1)"
        )
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(
            f"model config: hidden_act {config.get('hidden_act')!r} is not "
            "supported by the experts (SwiGLU)"
        )


class MiniMaxM2ForCausalLM(LlamaForCausalLM):
    """MiniMax M2 (see the module docstring)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("MiniMaxM2ForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    model_type: ClassVar[str] = "minimax_m2"
    tasks: ClassVar[tuple[str, ...]] = ("generate",)
    weight_name_maps = {"hf": hf_name_map()}
    base_model_prefix = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(ArchConfig(self.config_from_hf(dict(config))), build)

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
        return Olmo2Attention(
            config, build, layer, rotary, head_dim=head_dim, bias=False, prefix=prefix
        )

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        router = RouterSpec(
            top_k=int(config.require("num_experts_per_tok")), scoring="sigmoid", renormalize=True
        )
        return FusedMoE(
            int(config.require("num_local_experts")),
            int(config.hidden_size),
            int(config.require("intermediate_size")),
            router=router,
            correction_bias=True,
            build=build,
            prefix=prefix,
        )

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """Checks the config (:func:`_check`); the published configs' ``rotary_dim`` becomes
        ``partial_rotary_factor`` (as transformers' config does) and ``num_experts`` is read
        as ``num_local_experts``."""
        _check(config)
        cfg = dict(config)
        if not cfg.get("num_local_experts") and cfg.get("num_experts"):
            cfg["num_local_experts"] = cfg["num_experts"]
        params = cfg.get("rope_parameters") or {}
        rotary = cfg.get("rotary_dim")
        if (
            rotary is not None
            and "partial_rotary_factor" not in params
            and "partial_rotary_factor" not in cfg
        ):
            head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // int(
                cfg["num_attention_heads"]
            )
            cfg["partial_rotary_factor"] = int(rotary) / int(head_dim)
        return cfg

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"{cls.__name__} does not load GGUF files")
