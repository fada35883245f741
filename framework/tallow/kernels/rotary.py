"""Rotary position embedding on flat per-token q/k rows from a precomputed cos/sin cache.

``cos_sin_cache`` [max_position, rotary_dim] holds, per position, the rotary_dim/2 cosines
followed by the rotary_dim/2 sines (the layout ``tallow.layers.rotary`` builds, as vLLM's), so
any frequency schedule (plain, llama3, yarn, ...) works unchanged. Only the first rotary_dim
dims of each head rotate (partial rotary); the rest pass through.

Styles: neox rotates the pairs (i, i + rotary_dim/2); GPT-J rotates the interleaved pairs
(2i, 2i + 1). For a pair (a, b) at frequency i: ``a' = a cos - b sin``, ``b' = b cos + a sin``,
computed in float32 and rounded once to the input dtype.
"""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled
from .norm import rms_norm, rms_norm_ref


def _token_rows(name: str, x: torch.Tensor, n_tokens: int, head_size: int) -> torch.Tensor:
    """``x`` seen as [T, H, head_size] without copying (so in-place writes reach it)."""
    if x.shape[0] != n_tokens or x[0].numel() % head_size:
        raise ValueError(
            f"{name}: expected [{n_tokens}, heads * {head_size}] or [{n_tokens}, "
            f"heads, {head_size}], got {tuple(x.shape)}"
        )
    try:
        return x.view(n_tokens, -1, head_size)
    except RuntimeError as err:
        raise ValueError(
            f"{name}: each token's values must be contiguous (strides {x.stride()})"
        ) from err


def check_rotary_args(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_size: int,
) -> None:
    """Raise ValueError naming the argument that does not fit."""
    if positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"positions: expected a 1-D int32/int64 tensor, got "
            f"{positions.dtype} {tuple(positions.shape)}"
        )
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2:
        raise ValueError(
            f"cos_sin_cache: expected [max_position, rotary_dim] with an even "
            f"rotary_dim, got {tuple(cos_sin_cache.shape)}"
        )
    if not 0 < cos_sin_cache.shape[1] <= head_size:
        raise ValueError(
            f"cos_sin_cache: rotary_dim {cos_sin_cache.shape[1]} must be in "
            f"(0, head_size={head_size}]"
        )
    _token_rows("q", q, positions.shape[0], head_size)
    if k is not None:
        _token_rows("k", k, positions.shape[0], head_size)


def _check_qk_norm(
    k: torch.Tensor | None, qk_norm: tuple[torch.Tensor, torch.Tensor] | None, head_size: int
) -> None:
    if qk_norm is None:
        return
    if k is None:
        raise ValueError("qk_norm: needs k (the norms come as a (q weight, k weight) pair)")
    for name, w in zip(("q", "k"), qk_norm):
        if w.shape != (head_size,):
            raise ValueError(
                f"qk_norm: the {name} weight must have shape ({head_size},), got {tuple(w.shape)}"
            )


def _normed_heads(
    name: str,
    x: torch.Tensor,
    n_tokens: int,
    head_size: int,
    weight: torch.Tensor,
    eps: float,
    inplace: bool,
    fast: bool = False,
) -> torch.Tensor:
    """RMSNorm of every head of ``x`` (into ``x`` when ``inplace``, else into a copy); ``fast``
    takes the norm kernel's dispatch rather than the reference."""
    rows = _token_rows(name, x, n_tokens, head_size)
    normed: torch.Tensor = (rms_norm if fast else rms_norm_ref)(rows, weight, eps)  # type: ignore[assignment]  # one tensor without a residual
    if inplace:
        rows.copy_(normed)
        return x
    return normed.reshape(x.shape)


def rotary_embedding_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
    inplace: bool = True,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain-torch reference of ``rotary_embedding`` (same contract)."""
    check_rotary_args(positions, q, k, cos_sin_cache, head_size)
    _check_qk_norm(k, qk_norm, head_size)
    n_tokens = positions.shape[0]
    if qk_norm is not None:
        assert k is not None
        q = _normed_heads("q", q, n_tokens, head_size, qk_norm[0], norm_eps, inplace)
        k = _normed_heads("k", k, n_tokens, head_size, qk_norm[1], norm_eps, inplace)
        inplace = True  # q and k are the caller's tensors or fresh copies by now
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    cs = cos_sin_cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def apply(name: str, x: torch.Tensor) -> torch.Tensor:
        dst = x if inplace else x.clone()
        rows = _token_rows(name, dst, n_tokens, head_size)
        part = rows[..., :rot].float()
        if is_neox:
            a, b = part[..., :half], part[..., half:]
            rotated = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        else:
            a, b = part[..., 0::2], part[..., 1::2]
            rotated = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        rows[..., :rot] = rotated.to(x.dtype)
        return dst

    return apply("q", q), (apply("k", k) if k is not None else None)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
    inplace: bool = True,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate ``q`` [T, Hq*head_size] and ``k`` [T, Hkv*head_size] (or [T, H, head_size];
    k may be None) at ``positions`` [T] using ``cos_sin_cache`` [max_position, rotary_dim].

    Each token's values must be contiguous; the token stride is free (q and k may be column
    slices of a fused qkv tensor). ``inplace=True`` writes into q and k and returns them;
    otherwise new tensors are returned and the inputs are untouched. Positions must lie in
    [0, max_position). ``qk_norm`` = (q weight, k weight), each [head_size]: RMSNorm of every
    q and k head (eps ``norm_eps``, the Llama/Qwen form) before the rotation, as Qwen3 does —
    one launch instead of three. The Triton kernel on CUDA, the reference elsewhere.
    """
    check_rotary_args(positions, q, k, cos_sin_cache, head_size)
    _check_qk_norm(k, qk_norm, head_size)
    if triton_enabled(q) and positions.numel():
        from ._rotary_triton import rotary_embedding_triton

        if qk_norm is not None and cos_sin_cache.shape[1] != head_size:
            # partial rotary: the kernel's pairs do not cover the whole head; norm first
            assert k is not None
            n = positions.shape[0]
            q = _normed_heads("q", q, n, head_size, qk_norm[0], norm_eps, inplace, fast=True)
            k = _normed_heads("k", k, n, head_size, qk_norm[1], norm_eps, inplace, fast=True)
            qk_norm, inplace = None, True
        return rotary_embedding_triton(
            positions, q, k, cos_sin_cache, head_size, is_neox, inplace, qk_norm, norm_eps
        )
    return rotary_embedding_ref(
        positions, q, k, cos_sin_cache, head_size, is_neox, inplace, qk_norm, norm_eps
    )
