"""Phi-3, Phi-3.5 and Phi-4 (``Phi3ForCausalLM``): the Llama decoder (Mistral's switches) with

- q, k and v stored as one ``qkv_proj`` and gate and up as one ``gate_up_proj`` in the
  checkpoint (split on load into the same fused layers Llama uses);
- LongRoPE (``rope_scaling.type`` ``longrope``, or ``su`` / ``yarn`` in older configs, which
  transformers reads as LongRoPE for this architecture), with ``original_max_position_embeddings``
  taken from the top level of the config when it is there (it wins over the one inside
  ``rope_scaling``, as in transformers);
- partial rotary when the config has ``partial_rotary_factor`` (Phi-4-mini rotates 3/4 of each
  head);
- a sliding window on every layer when ``sliding_window`` is set (Phi-3-mini-4k);
- no biases.

Tensor names, HF and GGUF, are listed in :mod:`tallow_model_phi3.naming`.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from tallow.layers import (
    ArchConfig,
    BuildContext,
    LongRoPERotaryEmbedding,
    WeightLoadError,
    rope_parameters,
)
from tallow_model_llama.gguf_config import arch_value, llama_family_config
from tallow_model_llama.model import MistralForCausalLM
from tallow_model_llama.naming import hf_name_map

from .naming import gguf_name_map

#: rope types this architecture reads as LongRoPE (transformers' Phi-3 config does the same)
LONGROPE_ALIASES = ("longrope", "su", "yarn")


def phi3_config(config: ArchConfig | dict[str, Any]) -> ArchConfig:
    """The config with its RoPE scaling in the form :func:`tallow.layers.get_rope` builds
    (see the module docstring)."""
    cfg = ArchConfig(config)
    base, scaling, partial = rope_parameters(cfg)
    if scaling is None:
        return cfg
    scaling = dict(scaling)
    if scaling["rope_type"] in LONGROPE_ALIASES:
        scaling["rope_type"] = "longrope"
        original = cfg.get("original_max_position_embeddings")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
    cfg.pop("rope_parameters", None)
    cfg.update(rope_scaling=scaling, rope_theta=base, partial_rotary_factor=partial)
    return cfg


class Phi3ForCausalLM(MistralForCausalLM):
    """Phi-3 / Phi-3.5 / Phi-4 (see the module docstring): Mistral's switches (no biases, a
    window on every layer when ``sliding_window`` is set; GGUF's 0 reads as none) with
    LongRoPE and its own GGUF names."""

    hf_architectures = ("Phi3ForCausalLM",)
    gguf_architectures = ("phi3",)
    model_type = "phi3"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(phi3_config(config), build)
        self._gguf_rope_factors: dict[str, torch.Tensor] = {}

    # -- loading ---------------------------------------------------------------------------
    def load_rope_factors(self, tensor: torch.Tensor, groups: dict[str, str]) -> None:
        """``rope_factors_short`` / ``rope_factors_long`` of a GGUF file: LongRoPE's factor
        lists, applied once both have arrived."""
        kind = groups["kind"]
        if kind not in ("short", "long"):
            raise WeightLoadError(
                f"rope_factors_{kind}.weight: not a LongRoPE factor list "
                "(expected rope_factors_short or rope_factors_long)"
            )
        rotary = self.model.rotary_emb
        if not isinstance(rotary, LongRoPERotaryEmbedding):
            raise WeightLoadError(
                f"rope_factors_{kind}.weight: the checkpoint carries LongRoPE "
                "factors, but its config has no LongRoPE scaling (GGUF: "
                "rope.scaling.attn_factor)"
            )
        self._gguf_rope_factors[kind] = tensor
        if len(self._gguf_rope_factors) == 2:
            rotary.set_factors(self._gguf_rope_factors["short"], self._gguf_rope_factors["long"])

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor]], naming: str = "hf"
    ) -> set[str]:
        self._gguf_rope_factors.clear()
        filled = super().load_weights(tensors, naming)
        scaling = self.config.get("rope_scaling") or {}
        expects_tensors = scaling.get("rope_type") == "longrope" and (
            scaling.get("short_factor") is None or scaling.get("long_factor") is None
        )
        if expects_tensors and len(self._gguf_rope_factors) != 2:
            lacking = sorted({"short", "long"} - set(self._gguf_rope_factors))
            raise WeightLoadError(
                "checkpoint does not match Phi3ForCausalLM: its config asks for LongRoPE "
                "factors from tensors, but "
                + " and ".join(f"rope_factors_{k}.weight" for k in lacking)
                + " is missing"
            )
        return filled

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """llama.cpp's converter writes LongRoPE as ``rope.scaling.attn_factor`` and
        ``rope.scaling.original_context_length`` plus two tensors (``rope_factors_short`` and
        ``rope_factors_long``); ``attention.sliding_window`` 0 means none."""
        cfg = llama_family_config(
            metadata, config, hf_architecture=cls.hf_architectures[0], model_type=cls.model_type
        )
        original = arch_value(metadata, "rope.scaling.original_context_length")
        if original is not None:
            cfg["original_max_position_embeddings"] = int(original)
        attn_factor = arch_value(metadata, "rope.scaling.attn_factor")
        if attn_factor is not None:
            cfg.pop("rope_parameters", None)
            cfg["rope_scaling"] = {
                "rope_type": "longrope",
                "attention_factor": float(attn_factor),
                "original_max_position_embeddings": int(original or cfg["max_position_embeddings"]),
                "short_factor": None,
                "long_factor": None,  # tensors of the file
            }
        return cfg
