"""Gemma 2 and Gemma 3 configs: the family's defaults, which layers slide, RoPE per layer kind.

Checkpoints state their config in several forms, all read here:

- ``config.json`` of ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM``, complete when written by a
  recent transformers, or sparse (older writers leave out values equal to the config class's
  defaults), hence :data:`GEMMA2_DEFAULTS` / :data:`GEMMA3_DEFAULTS`, the defaults of
  transformers' ``Gemma2Config`` and ``Gemma3TextConfig``;
- the ``text_config`` of a ``Gemma3ForConditionalGeneration`` checkpoint (usually sparse);
- GGUF metadata (``gemma2.*``, ``gemma3.*``), completed by :func:`config_from_gguf` with what
  llama.cpp assumes for the family and does not store.

Which layers use the sliding window: ``layer_types`` (``"sliding_attention"`` /
``"full_attention"`` per layer) when given, else every ``sliding_window_pattern``-th layer is
global (Gemma 2: every 2nd, Gemma 3: every 6th). Gemma 3 rotates local (sliding) layers with
base ``rope_local_base_freq`` and no scaling, global layers with ``rope_theta`` and
``rope_scaling``; transformers 5 writes both as ``rope_parameters: {"sliding_attention": ...,
"full_attention": ...}``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tallow.layers import rope_parameters

SLIDING, FULL = "sliding_attention", "full_attention"

#: transformers' ``Gemma2Config`` defaults
GEMMA2_DEFAULTS: dict[str, Any] = dict(
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0,
    tie_word_embeddings=True,
    sliding_window_pattern=2,
)

#: transformers' ``Gemma3TextConfig`` defaults
GEMMA3_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262208,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    rope_local_base_freq=10000.0,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    tie_word_embeddings=True,
    sliding_window_pattern=6,
)


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every key it lacks taken from ``defaults`` (an explicit None is kept: a
    null softcap or window means none)."""
    out = dict(config)
    for key, value in defaults.items():
        out.setdefault(key, value)
    # older configs spell the pattern with a leading underscore (transformers' private field)
    if "_sliding_window_pattern" in config and "sliding_window_pattern" not in config:
        out["sliding_window_pattern"] = config["_sliding_window_pattern"]
    return out


def text_model_config(config: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The ``text_config`` of a multimodal ``architecture`` checkpoint's ``config``, with what
    only the outer config states (dtype, special token ids, tying) and the outer
    ``architectures``; a config that is already the text model's is returned as it is."""
    text = config.get("text_config")
    if text is None and "hidden_size" in config:
        return dict(config)
    if not isinstance(text, Mapping):
        raise ValueError(
            f"model config: a {architecture} config needs a 'text_config' object, got "
            f"{type(text).__name__}"
        )
    flat = dict(text)
    for key in (
        "torch_dtype",
        "dtype",
        "eos_token_id",
        "bos_token_id",
        "pad_token_id",
        "tie_word_embeddings",
    ):
        if key in config and key not in flat:
            flat[key] = config[key]
    flat["architectures"] = list(config.get("architectures") or [architecture])
    return flat


def sliding_layers(config: Mapping[str, Any]) -> list[bool]:
    """Per layer, whether it is a sliding-window (local) layer (see the module docstring)."""
    n = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if types:
        if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
            raise ValueError(
                f"model config: layer_types must list {n} entries, each "
                f"{SLIDING!r} or {FULL!r}; got {list(types)!r}"
            )
        return [t == SLIDING for t in types]
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):  # GGUF may store one flag per layer
        if len(pattern) != n:
            raise ValueError(
                f"model config: sliding_window_pattern has {len(pattern)} flags for {n} layers"
            )
        return [bool(p) for p in pattern]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(
            "model config: sliding_window_pattern must be a positive integer (every "
            f"n-th layer is global), got {pattern!r}"
        )
    return [(i + 1) % pattern != 0 for i in range(n)]


def gemma3_rope(config: Mapping[str, Any]) -> dict[str, tuple[float, dict[str, Any] | None]]:
    """``{SLIDING: (base, scaling), FULL: (base, scaling)}`` of a Gemma 3 config.

    ``scaling`` is None for plain RoPE. Local layers never scale (transformers and llama.cpp
    alike); a ``rope_scaling`` of the legacy form applies to global layers.
    """
    params = config.get("rope_parameters")
    local_base = float(
        config.get("rope_local_base_freq") or GEMMA3_DEFAULTS["rope_local_base_freq"]
    )
    if isinstance(params, Mapping) and (SLIDING in params or FULL in params):
        full = params.get(FULL) or {}
        sliding = params.get(SLIDING) or {}
        g_base, g_scaling, _ = rope_parameters(
            {
                "rope_parameters": full,
                "rope_theta": config.get("rope_theta") or GEMMA3_DEFAULTS["rope_theta"],
            }
        )
        l_base, l_scaling, _ = rope_parameters(
            {"rope_parameters": sliding, "rope_theta": local_base}
        )
        return {FULL: (g_base, g_scaling), SLIDING: (l_base, l_scaling)}
    g_base, g_scaling, _ = rope_parameters(config)
    return {FULL: (g_base, g_scaling), SLIDING: (local_base, None)}


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def config_from_gguf(
    metadata: Mapping[str, Any], config: Mapping[str, Any], *, hf_architecture: str
) -> dict[str, Any]:
    """The HF-style config of a ``gemma2`` / ``gemma3`` GGUF file.

    ``config`` is the generic mapping of the GGUF format (sizes, eps, window, softcaps, rope
    base and scaling, vocabulary, tying). Added here, as llama.cpp's loader has them:

    - the attention scale: ``query_pre_attn_scalar`` is not stored; llama.cpp uses
      ``hidden / heads`` for the 27B models (46 layers for Gemma 2, 62 for Gemma 3) and the
      head size otherwise, which is what their HF configs say;
    - which layers slide: ``attention.sliding_window_pattern`` when stored (a period or one
      flag per layer), else every 2nd (Gemma 2) / 6th (Gemma 3) layer is global;
    - Gemma 2's softcaps default to 50 (attention) and 30 (final logits), its window to 4096;
    - Gemma 3's local rope base: ``rope.freq_base_swa`` when stored, else 10000.
    """
    arch = metadata.get("general.architecture")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}")
        return default if value is None else _plain(value)

    gemma3 = arch == "gemma3"
    cfg = dict(config)
    cfg["architectures"] = [hf_architecture]
    cfg["model_type"] = "gemma3_text" if gemma3 else "gemma2"
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    for key, gguf_key in (
        ("num_attention_heads", "head_count"),
        ("num_key_value_heads", "head_count_kv"),
    ):
        value = _plain(cfg.get(key))
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise ValueError(
                    f"GGUF metadata {arch}.attention.{gguf_key}: per-layer values "
                    f"{sorted(set(value))} are not supported (one for all layers)"
                )
            cfg[key] = value[0]
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    cfg["head_dim"] = head_dim
    layers = int(cfg["num_hidden_layers"])
    is_27b = layers == (62 if gemma3 else 46)
    cfg["query_pre_attn_scalar"] = hidden // heads if is_27b else head_dim
    pattern = get("attention.sliding_window_pattern")
    cfg["sliding_window_pattern"] = pattern if pattern is not None else (6 if gemma3 else 2)
    cfg.pop("layer_types", None)
    if gemma3:
        cfg["attn_logit_softcapping"] = None
        cfg["final_logit_softcapping"] = None
        cfg["rope_local_base_freq"] = float(
            get("rope.freq_base_swa", GEMMA3_DEFAULTS["rope_local_base_freq"])
        )
    else:
        if cfg.get("sliding_window") is None:
            cfg["sliding_window"] = GEMMA2_DEFAULTS["sliding_window"]
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) is None:
                cfg[key] = float(get(key, GEMMA2_DEFAULTS[key]))
    defaults = GEMMA3_DEFAULTS if gemma3 else GEMMA2_DEFAULTS
    cfg["rope_theta"] = float(cfg.get("rope_theta") or defaults["rope_theta"])
    if not math.isfinite(cfg["rope_theta"]) or cfg["rope_theta"] <= 0:
        raise ValueError(
            f"GGUF metadata {arch}.rope.freq_base: expected a positive number, got "
            f"{cfg['rope_theta']!r}"
        )
    return with_defaults(cfg, defaults)
