"""Gemma 4 text models from GGUF files of llama.cpp's ``gemma4`` architecture.

The config (:func:`config_from_gguf`), from llama.cpp's converter (its ``Gemma4Model`` class):

- ``attention.sliding_window_pattern``: one flag per layer, true for a sliding layer;
- ``attention.key_length`` / ``value_length``: the full layers' head size,
  ``attention.key_length_swa`` / ``value_length_swa``: the sliding layers';
- ``attention.head_count_kv``: one count, or one per layer (sliding layers' and full layers'
  differ when the model has ``num_global_key_value_heads``);
- ``feed_forward_length``: one width, or one per layer (KV-shared layers twice as wide under
  ``use_double_wide_mlp``);
- ``attention.shared_kv_layers``, ``embedding_length_per_layer_input`` (0: none);
- ``rope.freq_base`` (full layers) and ``rope.freq_base_swa``; ``rope.dimension_count`` is the
  full head, and full layers' partial rotation is the ``rope_freqs`` tensor: factor 1 for the
  rotated frequency pairs, 1e30 for the rest (:meth:`Gemma4ForCausalLM.load_rope_freqs
  <tallow_model_gemma.gemma4.Gemma4ForCausalLM.load_rope_freqs>` divides the frequencies by it);
- ``attention_k_eq_v`` is not stated: full layers with ``attn_k`` and no ``attn_v`` say it
  (the format's ``gguf_value_from_key_layers``);
- experts: ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``.

Tensors (:class:`Gemma4GGUFNames`) are the Hugging Face tensors renamed; norms are stored as
they are (Gemma 4's RMSNorm scales by ``weight``: the converter adds no 1). The router's
``scale`` is ``ffn_gate_inp.scale``, its ``per_expert_scale`` ``ffn_down_exps.scale``; the
experts' ``gate_up_proj`` is ``ffn_gate_up_exps`` (gate rows first). Vision and audio towers
live in a separate ``mmproj`` file, which tallow does not read.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from tallow.layers import WeightMatch, WeightNameMap, WeightRule

from .gemma4_config import FULL, SLIDING
from .gemma4_naming import Gemma4Names

ARCH = "gemma4"

#: block tensor (name without ``blk.i.``) → the Hugging Face name under ``model.layers.i.``
_BLOCK: dict[str, str] = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    "layer_output_scale.weight": "layer_scalar",
}
_GLOBAL: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")
_E = "model.layers.{i}.experts"


def _separate_experts() -> WeightNameMap:
    """The experts' gate and up halves as separate tensors (a file whose converter did not fuse
    them)."""
    return WeightNameMap(
        [
            WeightRule("blk.{i}.ffn_gate_exps.weight", f"{_E}.w13_weight", shard=("*", "gate")),
            WeightRule("blk.{i}.ffn_up_exps.weight", f"{_E}.w13_weight", shard=("*", "up")),
        ]
    )


class Gemma4GGUFNames:
    """llama.cpp's ``gemma4`` tensor names, matched as the Hugging Face names they stand for
    (:class:`~tallow_model_gemma.gemma4_naming.Gemma4Names`); ``rope_freqs`` goes to the
    model's ``load_rope_freqs``."""

    def __init__(self, text: Gemma4Names) -> None:
        self.text = text
        self.experts = _separate_experts()

    def match(self, name: str) -> WeightMatch | None:
        if name == "rope_freqs.weight":
            return WeightMatch(WeightRule(name, handler="load_rope_freqs"), {})
        if name in _GLOBAL:
            return self.text.match(_GLOBAL[name])
        found = _BLK.fullmatch(name)
        if found is None:
            return None
        hf = _BLOCK.get(found.group(2))
        if hf is None:
            return self.experts.match(name)
        return self.text.match(f"model.layers.{found.group(1)}.{hf}")


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


class _Metadata:
    """The ``gemma4.*`` keys of a file, each required one named when missing."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self.metadata = metadata

    def get(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(f"{ARCH}.{key}")
        return default if value is None else _plain(value)

    def need(self, key: str, what: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(
                f"GGUF metadata key '{ARCH}.{key}' is missing; it is needed for {what}"
            )
        return value


def _per_layer(value: Any, n: int, key: str) -> list[int]:
    """A count stated once or once per layer, as one per layer."""
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(
                f"GGUF metadata {ARCH}.{key}: {len(value)} values for {n} layers "
                "(expected one, or one per layer)"
            )
        return [int(v) for v in value]
    return [int(value)] * n


def _one_per_kind(values: list[int], types: list[str], kind: str, key: str) -> int | None:
    seen = {v for v, t in zip(values, types) if t == kind}
    if len(seen) > 1:
        raise ValueError(
            f"GGUF metadata {ARCH}.{key}: {kind} layers differ ({sorted(seen)}); Gemma 4 has "
            "one value per layer kind"
        )
    return seen.pop() if seen else None


def _layer_types(meta: _Metadata, n: int) -> list[str]:
    pattern = meta.need("attention.sliding_window_pattern", "which layers slide")
    if not isinstance(pattern, list) or len(pattern) != n:
        raise ValueError(
            f"GGUF metadata {ARCH}.attention.sliding_window_pattern: expected {n} flags "
            f"(one per layer), got {pattern!r}"
        )
    types = [SLIDING if bool(p) else FULL for p in pattern]
    if types[-1] != FULL:
        raise ValueError(
            f"GGUF metadata {ARCH}.attention.sliding_window_pattern: the last layer must be "
            "a full-attention layer (flag false) in Gemma 4"
        )
    return types


def _head_dims(meta: _Metadata) -> tuple[int, int]:
    """(sliding, full) head sizes; values and keys are the same size, as Gemma 4 has them."""
    full = int(meta.need("attention.key_length", "the full layers' head size"))
    swa = int(meta.need("attention.key_length_swa", "the sliding layers' head size"))
    for key, expected in (("attention.value_length", full), ("attention.value_length_swa", swa)):
        value = meta.get(key)
        if value is not None and int(value) != expected:
            raise ValueError(
                f"GGUF metadata {ARCH}.{key} is {value}, but Gemma 4's values are as wide "
                f"as its keys ({expected})"
            )
    for key, expected in (("rope.dimension_count", full), ("rope.dimension_count_swa", swa)):
        value = meta.get(key)
        if value is not None and int(value) != expected:
            raise ValueError(
                f"GGUF metadata {ARCH}.{key} is {value}; expected the whole head ({expected}): "
                "Gemma 4 files state partial rotation in the rope_freqs tensor"
            )
    return swa, full


def _k_eq_v(config: dict[str, Any], types: list[str], shared: int) -> bool:
    """Whether full layers take their values from their keys: the layers the format found with
    ``attn_k`` and no ``attn_v`` are exactly the full layers that compute K/V."""
    found = sorted(int(i) for i in config.pop("gguf_value_from_key_layers", None) or [])
    if not found:
        return False
    owners = [i for i, t in enumerate(types[: len(types) - shared]) if t == FULL]
    if found != owners:
        raise ValueError(
            f"GGUF tensors: blocks {found} have attn_k but no attn_v; Gemma 4 shares keys as "
            f"values on every full layer that computes K/V ({owners}) or on none"
        )
    return True


def _mlp_width(meta: _Metadata, config: dict[str, Any], n: int, shared: int) -> tuple[int, bool]:
    """(intermediate size, use_double_wide_mlp)."""
    if config.get("intermediate_size") is None:
        meta.need("feed_forward_length", "the MLP width")
    widths = _per_layer(config["intermediate_size"], n, "feed_forward_length")
    base = widths[0]
    if widths == [base] * n:
        return base, False
    doubled = [base] * (n - shared) + [2 * base] * shared
    if widths != doubled:
        raise ValueError(
            f"GGUF metadata {ARCH}.feed_forward_length: per-layer widths {widths}; Gemma 4 "
            f"has one width, doubled on its {shared} KV-shared layers only"
        )
    return base, True


def config_from_gguf(metadata: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Gemma4TextConfig``-style config of a ``gemma4`` GGUF file (see the module
    docstring); ``config`` is the format's generic one. Raises ``ValueError`` naming the key
    that is missing or holds what Gemma 4 cannot be."""
    meta = _Metadata(metadata)
    cfg = dict(config)
    n = int(cfg["num_hidden_layers"])
    types = _layer_types(meta, n)
    swa_dim, full_dim = _head_dims(meta)
    shared = int(meta.need("attention.shared_kv_layers", "KV sharing (0: none)"))
    per_layer_input = int(
        meta.need("embedding_length_per_layer_input", "the per-layer inputs (0: none)")
    )
    heads = _per_layer(cfg["num_attention_heads"], n, "attention.head_count")
    if len(set(heads)) != 1:
        raise ValueError(f"GGUF metadata {ARCH}.attention.head_count: per-layer {heads}")
    kv = _per_layer(cfg.get("num_key_value_heads") or heads[0], n, "attention.head_count_kv")
    swa_kv = _one_per_kind(kv, types, SLIDING, "attention.head_count_kv")
    full_kv = _one_per_kind(kv, types, FULL, "attention.head_count_kv")
    inter, double = _mlp_width(meta, cfg, n, shared)
    if cfg.get("rope_scaling"):
        raise ValueError(
            f"GGUF metadata {ARCH}.rope.scaling.type: {cfg['rope_scaling']!r} is not "
            "supported for Gemma 4 (none)"
        )
    for key in ("rope_scaling", "partial_rotary_factor", "v_head_dim", "layer_types"):
        cfg.pop(key, None)
    sliding_base = float(meta.get("rope.freq_base_swa", 10000.0))
    full_base = float(cfg.pop("rope_theta", None) or meta.need("rope.freq_base", "RoPE"))
    if cfg.get("sliding_window") is None:
        meta.need("attention.sliding_window", "the sliding layers' window")
    experts = int(cfg.get("num_experts") or 0)
    cfg.update(
        architectures=["Gemma4ForCausalLM"],
        model_type="gemma4_text",
        hidden_activation="gelu_pytorch_tanh",
        num_attention_heads=heads[0],
        layer_types=types,
        head_dim=swa_dim,
        global_head_dim=full_dim,
        num_key_value_heads=swa_kv if swa_kv is not None else full_kv,
        num_global_key_value_heads=full_kv,
        # every layer's head size and KV heads, so that full layers may differ without k=v
        per_layer_config={
            str(i): {
                "head_dim": swa_dim if t == SLIDING else full_dim,
                "num_key_value_heads": kv[i],
            }
            for i, t in enumerate(types)
        },
        attention_k_eq_v=_k_eq_v(cfg, types, shared),
        intermediate_size=inter,
        use_double_wide_mlp=double,
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=per_layer_input,
        vocab_size_per_layer_input=int(cfg["vocab_size"]),
        # full layers rotate the whole head here; rope_freqs then stops the unrotated pairs
        rope_parameters={
            SLIDING: {"rope_type": "default", "rope_theta": sliding_base},
            FULL: {"rope_type": "default", "rope_theta": full_base},
        },
        enable_moe_block=experts > 0,
        top_k_experts=cfg.pop("num_experts_per_tok", None) if experts else None,
        num_experts=experts or None,
        moe_intermediate_size=cfg.get("moe_intermediate_size") if experts else None,
        use_bidirectional_attention=None,
    )
    if experts and cfg["top_k_experts"] is None:
        meta.need("expert_used_count", "the experts each token uses")
    if experts and cfg["moe_intermediate_size"] is None:
        meta.need("expert_feed_forward_length", "the experts' width")
    return cfg
