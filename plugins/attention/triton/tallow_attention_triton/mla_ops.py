"""Host-side launchers of the latent attention (MLA) kernels (:mod:`.kernels.mla`), and the
backend's MLA step.

Decode rows (every row of a decode-only step, and the single-query sequences of a step with
prompts) run the absorbed form: ``q_lat = q_nope W_UK`` for every head (one batched
product), the split-K latent decode kernel (each program reads a tile of latent rows once for
``BLOCK_H`` heads), the reduce of the splits, then ``W_UV`` on the latent output. Grids depend
on host integers only (sequence count, heads, the split count chosen from the sequence count
and the SM count), so a decode step may be captured in a CUDA graph. Sequences with several
queries (prompts, chunks) run the paged prefill kernel over K/V expanded from the latent
blocks they read (:mod:`.mla_prefill`).
"""

from __future__ import annotations

import torch

from tallow.kernels import capability, cache_saturation, float8_reasons
from tallow.layers import AttentionMetadata, MLALayer

from .heuristics import MAX_SPLITS, cdiv, dot_precision, next_pow2
from .kernels.mla import mla_decode_reduce_kernel, mla_decode_split_kernel, store_latent_kernel
from .mla_prefill import prefill_expanded
from .ops import LOG2E, device_facts, interpreting

#: heads per decode program (tl.dot needs 16 rows)
BLOCK_H = 16
#: cache dtypes the kernels read and write
MLA_CACHE_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def mla_reasons(layer: MLALayer, cache: torch.Tensor, q: torch.Tensor) -> list[str]:
    """Why the kernels cannot run ``layer`` over ``cache`` with queries of ``q``'s dtype."""
    reasons = []
    if cache.dim() != 3 or cache.shape[-1] != layer.latent_width or cache.stride(-1) != 1:
        reasons.append(
            f"the latent cache must be [blocks, block_size, {layer.latent_width}] "
            f"contiguous in its last dimension, got {list(cache.shape)}"
        )
    if cache.dtype not in MLA_CACHE_DTYPES:
        reasons.append(f"latent cache dtype {cache.dtype} is not supported")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        reasons.append(f"query dtype {q.dtype} is not supported")
    if q.device.type != "cuda" and not interpreting():
        reasons.append(f"tensors are on {q.device}; the triton backend needs CUDA tensors")
    if q.device.type == "cuda":
        reasons += float8_reasons(cache.dtype, capability(q.device.index))
    return reasons


def store_latent(cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``latent`` [T, W] into ``cache`` at ``slot_mapping`` (-1: skipped), converted as
    :func:`tallow.kernels.store_latent_ref` does."""
    tokens, width = latent.shape
    if tokens == 0:
        return
    if latent.stride(-1) != 1:
        latent = latent.contiguous()
    store_latent_kernel[(tokens,)](
        latent,
        cache,
        slot_mapping,
        latent.stride(0),
        cache.stride(0),
        cache.stride(1),
        WIDTH=width,
        W_PAD=next_pow2(width),
        BLOCK_SIZE=cache.shape[1],
        SATURATE=cache_saturation(cache.dtype),
    )


def mla_num_splits(num_seqs: int, head_blocks: int, device: torch.device) -> int:
    """Splits of each context so that (sequence, head block, split) programs cover the SMs
    twice; from host integers only (one count serves every context length of a CUDA graph:
    the kernel cuts each sequence's own length on the device)."""
    sm_count = device_facts(device)[0]
    splits = cdiv(2 * sm_count, max(1, num_seqs * head_blocks))
    return min(next_pow2(max(1, splits)), MAX_SPLITS)


def mla_decode(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    *,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_seqs: int,
    scale: float,
    num_splits: int | None = None,
    query_start_loc: torch.Tensor | None = None,
) -> torch.Tensor:
    """Latent attention output (float32, [T, H, RANK]) of the single-query sequences
    (``q_lat`` [T, H, RANK], ``q_pe`` [T, H, ROPE]): sequence ``i``'s query is row ``i``, or
    with ``query_start_loc`` (a step with prompts too) row ``query_start_loc[i]``, and the
    rows of sequences with several queries are left zero."""
    heads, rank = q_lat.shape[1], q_lat.shape[2]
    rope = q_pe.shape[2]
    head_blocks = cdiv(heads, BLOCK_H)
    splits = num_splits or mla_num_splits(num_seqs, head_blocks, q_lat.device)
    acc = torch.empty(num_seqs, splits, heads, rank, dtype=torch.float32, device=q_lat.device)
    ml = torch.empty(num_seqs, splits, heads, 2, dtype=torch.float32, device=q_lat.device)
    mixed = query_start_loc is not None
    out = (torch.zeros if mixed else torch.empty)(
        q_lat.shape[0] if mixed else num_seqs, heads, rank, dtype=torch.float32, device=q_lat.device
    )
    qsl = query_start_loc if query_start_loc is not None else seq_lens  # unread unless mixed
    if num_seqs == 0:
        return out
    r_pad, p_pad = max(16, next_pow2(rank)), max(16, next_pow2(rope))
    # wide latents: shorter key tiles and more warps keep the tiles in registers
    block_n, warps = (32, 8) if r_pad >= 256 else (64, 4)
    upcast = interpreting() and q_lat.dtype == torch.bfloat16
    mla_decode_split_kernel[(num_seqs, head_blocks, splits)](
        q_lat,
        q_pe,
        cache,
        seq_lens,
        block_tables,
        qsl,
        acc,
        ml,
        q_lat.stride(0),
        q_lat.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        cache.stride(0),
        cache.stride(1),
        block_tables.stride(0),
        scale * LOG2E,
        NUM_HEADS=heads,
        RANK=rank,
        ROPE=rope,
        R_PAD=r_pad,
        P_PAD=p_pad,
        BLOCK_H=BLOCK_H,
        BLOCK_N=block_n,
        BLOCK_SIZE=cache.shape[1],
        NUM_SPLITS=splits,
        PRECISION=dot_precision(q_lat.element_size()),
        UPCAST=upcast,
        MIXED=mixed,
        num_warps=warps,
    )
    mla_decode_reduce_kernel[(num_seqs, heads)](
        acc,
        ml,
        out,
        qsl,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=heads,
        RANK=rank,
        R_PAD=r_pad,
        NUM_SPLITS=splits,
        S_PAD=max(2, next_pow2(splits)),
        MIXED=mixed,
    )
    return out


def forward_mla(
    layer: MLALayer,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    meta: AttentionMetadata,
    num_splits: int | None = None,
) -> torch.Tensor:
    """The triton backend's :meth:`~tallow.plugin.AttentionBackend.forward_mla`: decode
    rows (every row of a decode-only step, the single-query sequences of a mixed one) through
    the absorbed kernels, sequences with several queries through the prefill kernel over K/V
    expanded from their blocks (:mod:`.mla_prefill`)."""
    store_latent(cache, latent, meta.slot_mapping)
    decode_only = meta.is_decode_only
    n = meta.num_seqs if decode_only else q_nope.shape[0]
    prompts: list[int] = []
    if not decode_only:
        qsl = meta.query_start_loc_cpu or meta.query_start_loc.tolist()
        prompts = [i for i in range(meta.num_seqs) if qsl[i + 1] - qsl[i] > 1]
    out = q_nope.new_zeros(q_nope.shape[0], layer.num_heads, layer.v_head_dim)
    if len(prompts) < meta.num_seqs:
        # [H, T, Dn] @ [H, Dn, R]: every head's latent query in one batched product
        q_lat = torch.bmm(q_nope[:n].transpose(0, 1), w_uk.to(q_nope.dtype)).transpose(0, 1)
        o_lat = mla_decode(
            q_lat,
            q_pe[:n],
            cache,
            seq_lens=meta.seq_lens,
            block_tables=meta.block_tables,
            num_seqs=meta.num_seqs,
            scale=layer.scale,
            num_splits=num_splits,
            query_start_loc=None if decode_only else meta.query_start_loc,
        )
        out[:n] = torch.bmm(
            o_lat.to(q_nope.dtype).transpose(0, 1), w_uv.to(q_nope.dtype).transpose(1, 2)
        ).transpose(0, 1)
    if prompts:
        lens = meta.seq_lens_cpu or meta.seq_lens.tolist()
        prefill_expanded(layer, q_nope, q_pe, cache, w_uk, w_uv, meta, prompts, qsl, lens, out)
    return out
