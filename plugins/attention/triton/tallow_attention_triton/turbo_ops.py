"""Host side of the turbo KV format (tallow-kvcache-turboquant's ``turbo8``/``turbo4``/
``turbo3``) in the Triton backend: recognising its layout, launching the store (rotation,
quantization and packing in one kernel), and the once-per-step transforms of the queries and
the attention output around the attention kernels.

Every launch here reads nothing back from the device, so a decode step stays capturable in a
CUDA graph.
"""

from __future__ import annotations

import torch

from tallow.kernels import LayerKVCache, pdl_enabled
from tallow.plugin import KVTensor

from .heuristics import TURBO_MAX_HEAD_DIM, dot_precision, next_pow2
from .kernels.turbo import store_turbo_kernel

#: code widths of the format, by bytes per vector of D codes: D*bits/8
BITS = (8, 4, 3)
#: bits whose encoder picks the scale as ``step * rms(y)`` (the others: ``max|y| / c``); the
#: format's constant (tallow_kvcache_turboquant.quantize.STEP_PER_RMS)
STEP_PER_RMS = {3: 0.5860}
PAGED = ("k_codes", "k_scales", "v_codes", "v_scales")
PER_LAYER = ("k_offset", "k_smooth", "v_offset", "rotation")


def is_turbo(kv_cache: LayerKVCache) -> bool:
    return "k_codes" in kv_cache


def bits_of(head_dim: int, code_bytes: int) -> int:
    """The code width of vectors of ``head_dim`` codes packed in ``code_bytes`` bytes (0 when
    no width of the format fits)."""
    for bits in BITS:
        if head_dim * bits == 8 * code_bytes:
            return bits
    return 0


def layout_reasons(layout: list[KVTensor]) -> list[str]:
    """Why the kernels cannot read a cache of ``layout`` as the turbo format: paged codes
    [bs, Hkv, D*bits/8] (uint8) and scales [bs, Hkv] (float16) of K and V, a rotation [D, D]
    and optional offsets and smoothing [Hkv, D] (float32)."""
    specs = {spec.name: spec for spec in layout}
    unknown = sorted(set(specs) - set(PAGED) - set(PER_LAYER))
    missing = [name for name in PAGED + ("rotation",) if name not in specs]
    if unknown or missing:
        return [
            "its cache layout is not the turbo format ("
            + "; ".join(
                part
                for part in (
                    f"unknown tensors {', '.join(unknown)}" if unknown else "",
                    f"missing {', '.join(missing)}" if missing else "",
                )
                if part
            )
            + "; the torch backend serves layouts without a rotation)"
        ]
    codes, rotation = specs["k_codes"], specs["rotation"]
    head_dim = rotation.shape[0]
    reasons = []
    if head_dim > TURBO_MAX_HEAD_DIM:
        reasons.append(
            f"head size {head_dim} in a turbo cache is not supported (its kernels stop at "
            f"{TURBO_MAX_HEAD_DIM}; kv codec auto or fp8 serves it)"
        )
    for name, want_dtype, shape in (
        ("k_codes", torch.uint8, codes.shape),
        ("v_codes", torch.uint8, codes.shape),
        ("k_scales", torch.float16, codes.shape[:2]),
        ("v_scales", torch.float16, codes.shape[:2]),
        ("rotation", torch.float32, (head_dim, head_dim)),
        *((name, torch.float32, (codes.shape[1], head_dim)) for name in PER_LAYER[:3]),
    ):
        spec = specs.get(name)
        if spec is None:
            continue
        if (
            spec.dtype != want_dtype
            or tuple(spec.shape) != tuple(shape)
            or spec.per_block != (name in PAGED)
        ):
            reasons.append(
                f"turbo tensor {name} is {list(spec.shape)} {spec.dtype}, expected "
                f"{list(shape)} {want_dtype}"
            )
    if len(codes.shape) != 3 or not bits_of(head_dim, codes.shape[2]):
        reasons.append(
            f"turbo codes of {list(codes.shape)} for head size {head_dim}: not "
            "8, 4 or 3 bits per code"
        )
    return reasons


def store_turbo_spec(
    *, num_kv_heads: int, head_dim: int, block_size: int, bits: int, pdl: bool = False
) -> dict[str, object]:
    segments = {8: 1, 4: 2, 3: 8}[bits]
    seg_w = head_dim // segments
    # the rotation's product runs over 16 input coordinates at a time; 32 where the eight
    # 3-bit segments of a 256-wide head need fewer, larger steps (both: no register spills
    # on sm_90, test_compile.py)
    k_chunk = 32 if segments == 8 and head_dim > 128 else 16
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        H_PAD=max(16, next_pow2(num_kv_heads)),
        D_PAD=max(k_chunk, next_pow2(head_dim)),
        K_CHUNK=k_chunk,
        BLOCK_SIZE=block_size,
        BITS=bits,
        SEGMENTS=segments,
        SEG_W=seg_w,
        SEG_PAD=max(16, next_pow2(seg_w)),
        RMS_STEP=STEP_PER_RMS.get(bits, 0.0),
        PRECISION=_fp32_precision(),
        num_warps=4,
        USE_PDL=pdl,
        launch_pdl=pdl,
    )


def _fp32_precision() -> str:
    from . import ops

    return "ieee" if ops.interpreting() else dot_precision(4)


def store_turbo(
    kv_cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Encode ``k``/``v`` [T, Hkv, D] into the turbo cache at ``slot_mapping`` (-1 skips a
    row), as the codec's reference ``encode`` does."""
    n_tokens, n_kv, head_dim = k.shape
    if n_tokens == 0:
        return
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    codes, scales = kv_cache["k_codes"], kv_cache["k_scales"]
    spec = store_turbo_spec(
        num_kv_heads=n_kv,
        head_dim=head_dim,
        block_size=codes.shape[1],
        bits=bits_of(head_dim, codes.shape[3]),
        pdl=pdl_enabled(codes),
    )
    rotation = kv_cache["rotation"]
    k_offset, k_smooth, v_offset = (kv_cache.get(name) for name in PER_LAYER[:3])
    store_turbo_kernel[(n_tokens,)](
        k,
        v,
        slot_mapping,
        codes,
        scales,
        kv_cache["v_codes"],
        kv_cache["v_scales"],
        rotation if k_offset is None else k_offset,
        rotation if k_smooth is None else k_smooth,
        rotation if v_offset is None else v_offset,
        rotation,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        codes.stride(0),
        codes.stride(1),
        codes.stride(2),
        scales.stride(0),
        scales.stride(1),
        HAS_K_OFFSET=k_offset is not None,
        HAS_K_SMOOTH=k_smooth is not None,
        HAS_V_OFFSET=v_offset is not None,
        **spec,
    )


def rotate_queries(q: torch.Tensor, kv_cache: LayerKVCache) -> torch.Tensor:
    """``(q * s) @ R.T`` per KV group, in ``q``'s dtype: the queries as the stored keys'
    coordinates expect them (the keys' offset is left out: the softmax cancels it)."""
    n, n_heads, head_dim = q.shape
    n_kv = kv_cache.num_kv_heads
    x = q.float()
    smooth = kv_cache.get("k_smooth")
    if smooth is not None:
        x = (x.view(n, n_kv, n_heads // n_kv, head_dim) * smooth[None, :, None, :]).view(
            n, n_heads, head_dim
        )
    return (x @ kv_cache["rotation"].T).to(q.dtype)


def restore_output(out: torch.Tensor, kv_cache: LayerKVCache) -> torch.Tensor:
    """``out @ R + m_v`` per KV group, in ``out``'s dtype: the attention output back in the
    values' own coordinates (softmax weights sum to one, so the values' offset comes back
    whole)."""
    n, n_heads, head_dim = out.shape
    x = out.float() @ kv_cache["rotation"]
    offset = kv_cache.get("v_offset")
    if offset is not None:
        n_kv = kv_cache.num_kv_heads
        x = (x.view(n, n_kv, n_heads // n_kv, head_dim) + offset[None, :, None, :]).view(
            n, n_heads, head_dim
        )
    return x.to(out.dtype)
