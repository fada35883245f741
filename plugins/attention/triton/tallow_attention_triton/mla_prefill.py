"""Latent attention (MLA) for sequences with several queries (prompts, chunks): K and V
expanded from the latent rows of the blocks those sequences read, then the paged prefill
kernel of this plugin (:func:`tallow_attention_triton.ops.prefill_attention`) over them.

The expanded cache holds only the blocks of the step's multi-query sequences, renumbered
``0..n-1``: per block and head the key ``[W_UK c, k_pe]`` and the value ``W_UV c``, both
zero-padded to one head size ``D`` (a multiple of 16, at least ``Dn + Dr`` and ``Dv``; the
zeros change no product). The kernel never materialises the ``[queries, keys]`` scores, so a
long context's chunk costs the expanded K/V (``blocks x block_size x H x D x 2`` elements),
not scores. Single-query rows are left to the decode kernels (``skip_single_query``).
"""

from __future__ import annotations

import torch

from tallow.kernels import CastKVCodec, allocate_layer
from tallow.layers import AttentionMetadata, MLALayer

from .ops import prefill_attention


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def prefill_expanded(
    layer: MLALayer,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    meta: AttentionMetadata,
    prompts: list[int],
    qsl: list[int],
    lens: list[int],
    out: torch.Tensor,
) -> None:
    """Write the attention output of the sequences ``prompts`` (those with several queries;
    host copies ``qsl``/``lens`` of the step) into their rows of ``out`` [T, H, Dv]."""
    heads, nope, rope, v_dim = (
        layer.num_heads,
        layer.qk_nope_head_dim,
        layer.qk_rope_head_dim,
        layer.v_head_dim,
    )
    rank, block_size = layer.kv_lora_rank, cache.shape[1]
    dtype, device = q_nope.dtype, q_nope.device
    width = _round16(max(nope + rope, v_dim))
    # the blocks the prompts read, renumbered densely
    rows = meta.block_tables[prompts].tolist()
    used: dict[int, int] = {}
    tables = torch.zeros(
        meta.num_seqs, max(1, max(-(-lens[i] // block_size) for i in prompts)), dtype=torch.int32
    )
    for i, table in zip(prompts, rows):
        for j, block in enumerate(table[: -(-lens[i] // block_size)]):
            tables[i, j] = used.setdefault(int(block), len(used))
    blocks = torch.tensor(list(used), dtype=torch.int64, device=device)
    # [n, block_size, W]; an 8-bit cache gathered as bytes (not every gather takes float8)
    raw = (
        cache.view(torch.uint8)[blocks].view(cache.dtype)
        if cache.element_size() == 1
        else cache[blocks]
    )
    latent = raw.to(dtype)
    c, k_pe = latent[..., :rank], latent[..., rank:]
    expanded = allocate_layer(
        CastKVCodec(),
        num_kv_heads=heads,
        head_dim=width,
        block_size=block_size,
        num_blocks=len(used),
        model_dtype=dtype,
        device=device,
    )
    k, v = expanded["k"], expanded["v"]
    k[..., :nope] = torch.einsum("nbr,hdr->nbhd", c, w_uk.to(dtype))
    k[..., nope : nope + rope] = k_pe[:, :, None, :]
    v[..., :v_dim] = torch.einsum("nbr,hdr->nbhd", c, w_uv.to(dtype))
    q = q_nope.new_zeros(q_nope.shape[0], heads, width)
    q[..., :nope] = q_nope
    q[..., nope : nope + rope] = q_pe
    result = torch.zeros_like(q)
    prefill_attention(
        q,
        expanded,
        result,
        query_start_loc=meta.query_start_loc,
        seq_lens=meta.seq_lens,
        block_tables=tables.to(device),
        num_seqs=meta.num_seqs,
        scale=layer.scale,
        skip_single_query=True,
    )
    for i in prompts:
        out[qsl[i] : qsl[i + 1]] = result[qsl[i] : qsl[i + 1], :, :v_dim]
