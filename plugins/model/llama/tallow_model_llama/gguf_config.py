"""What the Llama family needs from GGUF metadata beyond the generic GGUF → config mapping.

``metadata`` maps GGUF keys to plain Python values; architecture-specific keys may carry their
prefix (``"qwen2.context_length"``) or not (``"context_length"``). Values the generic mapping
already put in ``config`` are kept, except where GGUF is authoritative and the generic mapping
cannot know better: the head size (``attention.key_length``), the rotary size
(``rope.dimension_count``) and RoPE scaling (``rope.scaling.*``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (as some GGUF readers return them) to Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _getter(metadata: Mapping[str, Any]):
    arch = metadata.get("general.architecture")

    def get(key: str, default: Any = None) -> Any:
        for full in (f"{arch}.{key}", key) if arch else (key,):
            if full in metadata and metadata[full] is not None:
                return _plain(metadata[full])
        return default

    return get


def arch_value(metadata: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value of architecture key ``key`` (``"rope.freq_base"``), with or without the
    ``<general.architecture>.`` prefix, as a plain Python value; ``default`` when absent."""
    return _getter(metadata)(key, default)


def _uniform(value: Any, key: str) -> Any:
    """A per-layer list that must hold one value for every layer (the Llama family)."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) > 1:
            raise ValueError(
                f"GGUF metadata {key}: per-layer values {sorted(set(value))} are not "
                "supported by the Llama-family models (one value for all layers)"
            )
        return value[0] if value else None
    return value


def llama_family_config(
    metadata: Mapping[str, Any], config: Mapping[str, Any], *, hf_architecture: str, model_type: str
) -> dict[str, Any]:
    """An HF-style config for ``hf_architecture`` from GGUF ``metadata`` and the generic
    ``config`` (see the module docstring)."""
    get = _getter(metadata)
    cfg: dict[str, Any] = dict(config)

    def put(key: str, value: Any) -> None:
        if value is not None and cfg.get(key) is None:
            cfg[key] = value

    put("architectures", [hf_architecture])
    put("model_type", model_type)
    put("hidden_size", get("embedding_length"))
    put("intermediate_size", _uniform(get("feed_forward_length"), "feed_forward_length"))
    put("num_hidden_layers", get("block_count"))
    heads = _uniform(get("attention.head_count"), "attention.head_count")
    put("num_attention_heads", heads)
    put(
        "num_key_value_heads",
        _uniform(get("attention.head_count_kv"), "attention.head_count_kv") or heads,
    )
    put("max_position_embeddings", get("context_length"))
    put("rms_norm_eps", get("attention.layer_norm_rms_epsilon"))
    put("rope_theta", get("rope.freq_base", 10000.0))
    tokens = metadata.get("tokenizer.ggml.tokens")
    put("vocab_size", get("vocab_size") or (len(tokens) if tokens is not None else None))
    put("bos_token_id", get("tokenizer.ggml.bos_token_id"))
    put("eos_token_id", get("tokenizer.ggml.eos_token_id"))
    put("sliding_window", get("attention.sliding_window"))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if cfg.get(key) is None:
            raise ValueError(
                f"GGUF metadata lacks what {key!r} is read from; cannot build a "
                f"{hf_architecture} config"
            )

    head_dim = get("attention.key_length")
    if head_dim is None:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["head_dim"] = int(head_dim)
    rotary = get("rope.dimension_count")
    if rotary is not None and int(rotary) != cfg["head_dim"]:
        cfg["partial_rotary_factor"] = int(rotary) / cfg["head_dim"]

    scaling = _rope_scaling(get)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
        cfg.pop("rope_parameters", None)
    return cfg


def _rope_scaling(get) -> dict[str, Any] | None:
    kind = get("rope.scaling.type")
    factor = get("rope.scaling.factor")
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        original = get("rope.scaling.original_context_length")
        if original is not None:
            out["original_max_position_embeddings"] = int(original)
        attn = get("rope.scaling.attn_factor")
        if attn is not None and float(attn) != 1.0:
            # llama.cpp multiplies YaRN's default magnitude scale by attn_factor; transformers'
            # attention_factor replaces that scale, so fold the default in.
            default = 0.1 * math.log(float(factor)) + 1.0 if float(factor) > 1 else 1.0
            out["attention_factor"] = float(attn) * default
        return out
    raise ValueError(
        f"GGUF metadata rope.scaling.type {kind!r} is not supported (expected none, linear or yarn)"
    )


def mixtral_config(metadata: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The config of a Mixtral written as GGUF architecture ``llama`` with experts:
    ``expert_count`` experts of ``feed_forward_length``, ``expert_used_count`` per token
    (routing weights always renormalised, as llama.cpp does for Mixtral)."""
    cfg = llama_family_config(
        metadata, config, hf_architecture="MixtralForCausalLM", model_type="mixtral"
    )
    cfg["num_local_experts"] = int(arch_value(metadata, "expert_count"))
    used = arch_value(metadata, "expert_used_count")
    if not used:
        raise ValueError(
            "GGUF metadata expert_used_count is missing; a llama file with "
            "experts needs it for num_experts_per_tok"
        )
    cfg["num_experts_per_tok"] = int(used)
    return cfg
