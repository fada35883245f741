"""What every paged attention backend checks of a layer and of a step's inputs before its
kernels run, with the same words: backends add only what their own kernels need."""

from __future__ import annotations

import torch

from .attention import AttentionLayer, AttentionMetadata


def layer_reasons(layer: AttentionLayer, *, chunks: bool = False) -> list[str]:
    """Reasons a paged backend cannot run ``layer``: query heads that do not share the KV
    heads evenly, a sliding window on a bidirectional layer, chunked local attention unless
    the backend's kernels mask keys outside a query's chunk (``chunks``: pass the backend's
    ``supports_chunked_attention``), or a chunk together with a sliding window."""
    reasons = []
    if layer.num_kv_heads < 1 or layer.num_heads % layer.num_kv_heads:
        reasons.append(
            f"num_heads {layer.num_heads} is not a multiple of num_kv_heads {layer.num_kv_heads}"
        )
    if not layer.causal and layer.sliding_window:
        reasons.append("a sliding window on a bidirectional (causal=False) layer")
    if layer.attention_chunk_size and not chunks:
        # refusing sends the layer to a backend that masks by chunk (the torch one) instead
        # of computing full attention
        reasons.append(
            f"chunked local attention (attention_chunk_size {layer.attention_chunk_size})"
        )
    elif layer.attention_chunk_size and layer.sliding_window:
        reasons.append(
            f"chunked local attention (attention_chunk_size {layer.attention_chunk_size}) "
            f"together with a sliding window ({layer.sliding_window})"
        )
    return reasons


def check_rows(
    backend: str,
    layer: AttentionLayer,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    """ValueError unless ``q``, ``k``, ``v`` and ``meta.slot_mapping`` have one row per token
    of the step (``backend`` names the backend in the message)."""
    n = q.shape[0]
    if k.shape[0] != n or v.shape[0] != n or meta.slot_mapping.shape[0] != n:
        raise ValueError(
            f"{backend} attention, layer {layer.layer_index}: q, k, v and meta.slot_mapping "
            f"must have the same number of rows, got {n}, {k.shape[0]}, {v.shape[0]}, "
            f"{meta.slot_mapping.shape[0]}"
        )


def qkv_shape_reasons(
    layer: AttentionLayer,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    contiguous_heads: bool = False,
) -> list[str]:
    """Reasons ``q`` is not [T, Hq, D] and ``k``, ``v`` not [T, Hkv, D] for ``layer`` (with
    ``contiguous_heads``, also a ``q`` whose head elements are not contiguous)."""
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    reasons = []
    if q.dim() != 3 or tuple(q.shape[1:]) != (hq, d) or (contiguous_heads and q.stride(-1) != 1):
        reasons.append(
            f"q must be [T, {hq}, {d}]"
            + (" with contiguous heads" if contiguous_heads else "")
            + f", got {list(q.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != (hkv, d):
            reasons.append(f"{name} must be [T, {hkv}, {d}], got {list(t.shape)}")
    return reasons
