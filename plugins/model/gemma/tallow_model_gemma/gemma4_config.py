"""Gemma 4 (text) configs: the family's defaults and what each layer is.

A ``Gemma4TextConfig`` describes its layers by kind (``layer_types``: sliding or full
attention) plus per-layer overrides, and the model reads from it, per layer
(:func:`layer_plans`):

- the head size and KV heads: ``per_layer_config`` (transformers 5 writes it: layer index →
  ``head_dim`` / ``num_key_value_heads``), or, in configs written without it, every full
  layer gets ``global_head_dim`` (default 512) and, with ``attention_k_eq_v``,
  ``num_global_key_value_heads`` KV heads;
- whether its values are its keys (``attention_k_eq_v``: full layers have no ``v_proj``);
- KV sharing: the last ``num_kv_shared_layers`` layers compute no K/V and attend over the
  cache of the last earlier layer of their kind; with ``use_double_wide_mlp`` their MLP is
  twice as wide.

As in transformers, ``layer_types`` defaults to five sliding layers then a full one, and the
last layer is always a full one. RoPE is per layer kind (``rope_parameters``:
``{"sliding_attention": ..., "full_attention": ...}``): ``default`` or ``proportional``
(the first ``partial_rotary_factor`` of each head's frequency pairs rotate, with exponents
over the whole head size, the rest pass through), over that kind's head size
(:func:`rope_inv_freq`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

SLIDING, FULL = "sliding_attention", "full_attention"

#: transformers' ``Gemma4TextConfig`` defaults (sparse configs leave these out)
GEMMA4_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262144,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=30,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    sliding_window=512,
    final_logit_softcapping=None,
    use_bidirectional_attention=None,
    vocab_size_per_layer_input=262144,
    hidden_size_per_layer_input=256,
    attention_k_eq_v=False,
    num_kv_shared_layers=0,
    enable_moe_block=False,
    use_double_wide_mlp=False,
    num_experts=None,
    top_k_experts=None,
    moe_intermediate_size=None,
)

DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

#: the per-layer overrides this model reads (anything else in ``per_layer_config`` is refused)
_OVERRIDES = ("head_dim", "num_key_value_heads")


@dataclass(frozen=True)
class LayerPlan:
    """What layer ``index`` of a Gemma 4 model is."""

    index: int
    kind: str  # SLIDING or FULL
    head_dim: int
    num_kv_heads: int
    k_eq_v: bool  # values are the (unnormed, unrotated) key projection
    shared_from: int | None  # the layer whose K/V cache this one reads (KV sharing)
    double_mlp: bool  # twice the intermediate size (a KV-sharing layer)


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every key it lacks taken from :data:`GEMMA4_DEFAULTS`."""
    out = dict(config)
    for key, value in GEMMA4_DEFAULTS.items():
        out.setdefault(key, value)
    return out


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """Each layer's kind; the last is always full attention, as transformers makes it."""
    n = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
        raise ValueError(
            f"model config: layer_types must list {n} entries, each {SLIDING!r} or "
            f"{FULL!r}; got {types!r}"
        )
    types[-1] = FULL
    return types


def _overrides(config: Mapping[str, Any], types: list[str]) -> dict[int, dict[str, Any]]:
    per_layer = config.get("per_layer_config")
    if per_layer is None:
        layer: dict[str, Any] = {"head_dim": int(config.get("global_head_dim") or 512)}
        global_kv = config.get("num_global_key_value_heads")
        if config.get("attention_k_eq_v") and global_kv is not None:
            layer["num_key_value_heads"] = int(global_kv)
        return {i: layer for i, t in enumerate(types) if t == FULL}
    if not isinstance(per_layer, Mapping):
        raise ValueError(
            "model config: per_layer_config must map layer indices to overrides, got "
            f"{type(per_layer).__name__}"
        )
    out: dict[int, dict[str, Any]] = {}
    for key, values in per_layer.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise ValueError(
                f"model config: per_layer_config key {key!r} is not a layer index"
            ) from None
        if not 0 <= index < len(types):
            raise ValueError(
                f"model config: per_layer_config names layer {index}, but the model has "
                f"{len(types)} layers"
            )
        unknown = sorted(set(values) - set(_OVERRIDES))
        if unknown:
            raise ValueError(
                f"model config: per_layer_config[{key!r}] overrides {unknown}; only "
                f"{list(_OVERRIDES)} may differ between Gemma 4 layers"
            )
        out[index] = dict(values)
    return out


def kv_sources(config: Mapping[str, Any], types: list[str]) -> list[int | None]:
    """Per layer, the earlier layer whose K/V it reuses (None: it computes its own): each of
    the last ``num_kv_shared_layers`` layers reads the last unshared layer of its kind."""
    n = len(types)
    shared = int(config.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < n:
        raise ValueError(
            f"model config: num_kv_shared_layers must be between 0 and "
            f"num_hidden_layers - 1 ({n - 1}), got {shared}"
        )
    first = n - shared
    sources: list[int | None] = [None] * n
    for i in range(first, n):
        owners = [j for j in range(first) if types[j] == types[i]]
        if not owners:
            raise ValueError(
                f"model config: num_kv_shared_layers {shared} makes layer {i} "
                f"({types[i]}) reuse K/V, but no earlier unshared layer is of that kind"
            )
        sources[i] = owners[-1]
    return sources


def layer_plans(config: Mapping[str, Any]) -> list[LayerPlan]:
    """What every layer is (see the module docstring)."""
    types = layer_types(config)
    overrides = _overrides(config, types)
    sources = kv_sources(config, types)
    head_dim = int(config["head_dim"])
    kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    k_eq_v = bool(config.get("attention_k_eq_v"))
    double = bool(config.get("use_double_wide_mlp"))
    plans = []
    for i, kind in enumerate(types):
        own = overrides.get(i, {})
        plans.append(
            LayerPlan(
                index=i,
                kind=kind,
                head_dim=int(own.get("head_dim") or head_dim),
                num_kv_heads=int(own.get("num_key_value_heads") or kv_heads),
                k_eq_v=k_eq_v and kind == FULL,
                shared_from=sources[i],
                double_mlp=double and sources[i] is not None,
            )
        )
    for plan in plans:
        src = plan.shared_from
        if src is not None and (plans[src].head_dim, plans[src].num_kv_heads) != (
            plan.head_dim,
            plan.num_kv_heads,
        ):
            raise ValueError(
                f"model config: layer {plan.index} reuses the K/V of layer {src}, whose "
                f"head size / KV heads ({plans[src].head_dim}, {plans[src].num_kv_heads}) "
                f"differ from its own ({plan.head_dim}, {plan.num_kv_heads})"
            )
    return plans


def kind_head_dims(plans: list[LayerPlan]) -> dict[str, int]:
    """The head size of each layer kind (RoPE is built per kind, so all of a kind share it)."""
    dims: dict[str, int] = {}
    for plan in plans:
        if dims.setdefault(plan.kind, plan.head_dim) != plan.head_dim:
            raise ValueError(
                f"model config: {plan.kind} layers have different head sizes "
                f"({dims[plan.kind]} and {plan.head_dim}); Gemma 4 rotates each kind alike"
            )
    return dims


def rope_inv_freq(config: Mapping[str, Any], kind: str, head_dim: int) -> torch.Tensor:
    """The ``head_dim / 2`` inverse frequencies of layer kind ``kind`` (zeros for the pairs
    that proportional RoPE leaves unrotated)."""
    params = config.get("rope_parameters") or DEFAULT_ROPE
    rope = params.get(kind) if isinstance(params, Mapping) else None
    if rope is None:
        rope = DEFAULT_ROPE[kind]
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    base = float(rope.get("rope_theta") or DEFAULT_ROPE[kind]["rope_theta"])
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope_type == "default":
        return 1.0 / (base**exponents)
    if rope_type != "proportional":
        raise ValueError(
            f"model config: rope_parameters[{kind!r}].rope_type {rope_type!r} is not "
            "supported for Gemma 4 (default or proportional)"
        )
    fraction = float(rope.get("partial_rotary_factor", 1.0))
    rotated = int(fraction * head_dim // 2)
    inv_freq = torch.zeros(head_dim // 2)
    inv_freq[:rotated] = 1.0 / (base ** exponents[:rotated])
    return inv_freq / float(rope.get("factor", 1.0))
