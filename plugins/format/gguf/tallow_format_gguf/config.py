"""An HF-style ``config.json`` dict from GGUF metadata, by a mapping every architecture shares.

GGUF stores the hyper-parameters as ``<arch>.<key>``; the same keys mean the same thing in every
architecture, so one table serves them all. What is specific to a family (extra norms, soft-caps,
per-layer patterns) the model class adds in its ``config_from_gguf(metadata, config)``.
"""

from __future__ import annotations

from typing import Any, Iterable

#: ``<arch>.<gguf key>`` → HF config key, copied when present.
ARCH_KEYS: dict[str, str] = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "context_length": "max_position_embeddings",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.layer_norm_epsilon": "layer_norm_eps",
    "attention.key_length": "head_dim",
    "attention.value_length": "v_head_dim",
    "attention.sliding_window": "sliding_window",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "rope.freq_base": "rope_theta",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "vocab_size": "vocab_size",
}

#: GGUF ``general.architecture`` values whose HF ``model_type`` is spelled differently.
MODEL_TYPES: dict[str, str] = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gemma3": "gemma3_text",
    "command-r": "cohere",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "qwen3next": "qwen3_next",
    "qwen35": "qwen3_5_text",
    "qwen35moe": "qwen3_5_moe_text",
}

#: ``rope.scaling.<key>`` → key of HF ``rope_scaling``, for the keys that mean the same in both.
#: (``attn_factor`` does not: llama.cpp multiplies YaRN's default scale by it, transformers'
#: ``attention_factor`` replaces that scale; the model plugin converts it.)
ROPE_SCALING_KEYS: dict[str, str] = {
    "factor": "factor",
    "original_context_length": "original_max_position_embeddings",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
}

_QUANTIZED_FREE = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


def _rope_scaling(metadata: dict[str, Any], arch: str) -> dict[str, Any] | None:
    prefix = f"{arch}.rope.scaling."
    kind = metadata.get(prefix + "type")
    if kind is None:
        # Older files state only a linear factor, under another key.
        factor = metadata.get(f"{arch}.rope.scale_linear")
        return {"rope_type": "linear", "factor": float(factor)} if factor else None
    if kind == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "type": kind}
    for gguf_key, hf_key in ROPE_SCALING_KEYS.items():
        value = metadata.get(prefix + gguf_key)
        if value is not None:
            scaling[hf_key] = value
    return scaling


def torch_dtype_of(tensor_types: Iterable[tuple[str, int]]) -> str:
    """The natural compute dtype of a file from ``(type name, ndim)`` of its tensors.

    Matrices decide: all F32 → ``float32``, F16 → ``float16``, BF16 → ``bfloat16``; block
    quantized files → ``bfloat16`` (their values are rounded either way, and bfloat16's range
    keeps activations of every family finite).
    """
    matrix_types = {name for name, ndim in tensor_types if ndim >= 2}
    if not matrix_types or matrix_types - _QUANTIZED_FREE:
        return "bfloat16"
    if "BF16" in matrix_types:
        return "bfloat16"
    if "F16" in matrix_types:
        return "float16"
    return "float32"


def config_from_metadata(
    metadata: dict[str, Any],
    tensor_names: Iterable[str],
    *,
    vocab_size: int | None = None,
    torch_dtype: str | None = None,
) -> dict[str, Any]:
    """The HF-style config of a GGUF model.

    ``vocab_size`` defaults to the length of ``tokenizer.ggml.tokens``; ``tie_word_embeddings`` is
    true when the file has no ``output.weight`` (llama.cpp then reuses the embedding). Raises
    ``ValueError`` naming the key when a required key is missing.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ValueError(
            "GGUF metadata key 'general.architecture' is missing; expected a "
            "model family name such as 'llama' or 'qwen2'"
        )
    config: dict[str, Any] = {"model_type": MODEL_TYPES.get(arch, arch)}
    for gguf_key, hf_key in ARCH_KEYS.items():
        value = metadata.get(f"{arch}.{gguf_key}")
        if value is not None:
            config[hf_key] = value
    for required in ("block_count", "embedding_length", "attention.head_count"):
        if f"{arch}.{required}" not in metadata:
            raise ValueError(
                f"GGUF metadata key '{arch}.{required}' is missing; it is needed "
                f"for {ARCH_KEYS[required]}"
            )

    heads = config["num_attention_heads"]
    # Some families store a per-layer list of head counts; the uniform case collapses to an int.
    if isinstance(heads, list) and len(set(heads)) == 1:
        config["num_attention_heads"] = heads = heads[0]
    kv_heads = config.get("num_key_value_heads", heads)
    if isinstance(kv_heads, list) and len(set(kv_heads)) == 1:
        kv_heads = kv_heads[0]
    config["num_key_value_heads"] = kv_heads
    if "head_dim" not in config and isinstance(heads, int) and heads:
        config["head_dim"] = config["hidden_size"] // heads
    rope_dims = metadata.get(f"{arch}.rope.dimension_count")
    head_dim = config.get("head_dim")
    if isinstance(rope_dims, int) and isinstance(head_dim, int) and 0 < rope_dims < head_dim:
        config["partial_rotary_factor"] = rope_dims / head_dim

    scaling = _rope_scaling(metadata, arch)
    config["rope_scaling"] = scaling
    rope_parameters: dict[str, Any] = {"rope_type": "default"}
    if "rope_theta" in config:
        rope_parameters["rope_theta"] = config["rope_theta"]
    if scaling:
        rope_parameters.update({k: v for k, v in scaling.items() if k != "type"})
    config["rope_parameters"] = rope_parameters
    config.setdefault("sliding_window", None)

    if vocab_size is None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab_size = len(tokens) if isinstance(tokens, list) else None
    if vocab_size is not None:
        config.setdefault("vocab_size", vocab_size)
    names = set(tensor_names)
    config["tie_word_embeddings"] = "output.weight" not in names
    # The metadata does not say whether projections carry biases; the tensors do.
    config["attention_bias"] = "blk.0.attn_q.bias" in names
    config["mlp_bias"] = "blk.0.ffn_up.bias" in names
    # Blocks with a key projection and no value projection (values from the keys, as Gemma 4's
    # full layers may have them); stated only when there are any.
    value_from_key = sorted(
        int(name.split(".")[1])
        for name in names
        if name.startswith("blk.")
        and name.endswith(".attn_k.weight")
        and name.replace(".attn_k.", ".attn_v.") not in names
    )
    if value_from_key:
        config["gguf_value_from_key_layers"] = value_from_key
    for hf_key, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        config[hf_key] = metadata.get(f"tokenizer.ggml.{gguf_key}")
    if torch_dtype is not None:
        config["torch_dtype"] = torch_dtype
    return config
