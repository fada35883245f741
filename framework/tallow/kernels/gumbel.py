"""Counter-based Gumbel noise for sampling: the plain-torch reference.

A sampled token is ``argmax(logits * inv_temperature + g)`` where ``g`` is Gumbel noise drawn
from a hash of ``(seed, step, token index)``. Because the noise of a token depends on nothing
else, a seeded row samples the same token whatever else is in the batch, and on any device.

The same arithmetic is written twice, here in torch and in ``_sampling_triton.py`` in Triton, and
the two must agree to the bit. That is why:

* the hash works on 32-bit words held in int64 tensors, with the 32x32-bit products split into
  16-bit halves so that no int64 operation overflows (signed overflow means different things to
  different compilers); the Triton side uses wrapping uint32 arithmetic, which is the same
  function modulo 2**32;
* the logarithm is our own (exponent/mantissa split and an odd series in float32 mul/add and one
  correctly rounded division), because ``torch.log`` on CPU, on CUDA and Triton's ``tl.log``
  may differ in the last bit;
* every float constant below is already a float32 value, so it means the same whether a backend
  computes a scalar op in float32 or in float64 (double rounding of one float32 op is harmless).
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
# lowbias32 multipliers (a well-mixing 32-bit integer finaliser).
MIX_MUL_1 = 0x7FEB352D
MIX_MUL_2 = 0x846CA68B
# Domain-separation constants for the row keys (first fractional bits of sqrt(2), sqrt(3)).
ROW_SALT_1 = 0x6A09E667
ROW_SALT_2 = 0xBB67AE85

# float32 values written out exactly (see the module docstring).
F32_SQRT2 = 1.4142135381698608
F32_LN2 = 0.6931471824645996
F32_C3 = 0.3333333432674408
F32_C5 = 0.20000000298023224
F32_C7 = 0.1428571492433548
F32_C9 = 0.1111111119389534
F32_C11 = 0.09090909361839294
F32_2POW_M24 = 5.960464477539063e-08

# Rows of noise generated at once, bounded so that the int64 temporaries stay small.
_NOISE_CHUNK_ELEMS = 1 << 22


def _mix32_np(x: np.ndarray) -> np.ndarray:
    """The 32-bit mixer on a uint64 array of values in [0, 2**32) (products stay < 2**64)."""
    m = np.uint64(MASK32)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(MIX_MUL_1)) & m
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(MIX_MUL_2)) & m
    return x ^ (x >> np.uint64(16))


def row_keys_array(seeds: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two 32-bit noise keys (as int64 arrays) of rows with ``seeds`` (uint64: the seed
    modulo 2**64) at ``steps`` (the index of the token being sampled, taken modulo 2**32)."""
    m = np.uint64(MASK32)
    seeds = seeds.astype(np.uint64, copy=False)
    a = _mix32_np((seeds & m) ^ np.uint64(ROW_SALT_1))
    a = _mix32_np(a ^ (seeds >> np.uint64(32)))
    a = _mix32_np(a ^ (steps.astype(np.uint64) & m))
    b = _mix32_np(a ^ np.uint64(ROW_SALT_2))
    return a.astype(np.int64), b.astype(np.int64)


def row_keys(seed: int, step: int) -> tuple[int, int]:
    """The two 32-bit keys of one row's noise at one step (``row_keys_array`` for one row);
    ``seed`` is any Python int, taken modulo 2**64."""
    a, b = row_keys_array(
        np.array([seed & ((1 << 64) - 1)], dtype=np.uint64),
        np.array([step & MASK32], dtype=np.uint64),
    )
    return int(a[0]), int(b[0])


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in [0, 2**32) without int64 overflow."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # only the low 16 bits of x*c_hi survive mod 2**32
    return (lo + hi) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit mixer on an int64 tensor of values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL_1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL_2)
    return x ^ (x >> 16)


def log_f32(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive normal float32 values, bit-reproducible across devices.

    ``x = m * 2**e`` with m in [sqrt(1/2), sqrt(2)); ``log(m) = 2 atanh(s)``, ``s = (m-1)/(m+1)``,
    ``|s| <= 0.172``, summed to s**11 (truncation error below 1e-9).
    """
    bits = x.contiguous().view(torch.int32)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).view(torch.float32)
    big = m > F32_SQRT2
    m = torch.where(big, m * 0.5, m)
    e = torch.where(big, e + 1, e)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = s2 * F32_C11 + F32_C9
    p = p * s2 + F32_C7
    p = p * s2 + F32_C5
    p = p * s2 + F32_C3
    p = p * s2 + 1.0
    t = s * p
    t = t + t
    return t + e.to(torch.float32) * F32_LN2


def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """Map 32-bit hashes to float32 uniforms in (0, 1): ``(2r + 1) / 2**24`` with r the top 23
    bits, so 0 and 1 are never produced and every value is exact in float32."""
    r = h >> 9
    return (r * 2 + 1).to(torch.float32) * F32_2POW_M24


def gumbel_noise_ref(key1: torch.Tensor, key2: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [N, vocab_size] float32 for rows with keys ``key1``, ``key2`` [N] int64.

    Token ``t`` of a row gets ``-log(-log(u))`` with ``u`` from
    ``mix32(mix32(t ^ key1) ^ key2)``.
    """
    n = key1.shape[0]
    out = torch.empty(n, vocab_size, dtype=torch.float32, device=key1.device)
    if n == 0 or vocab_size == 0:
        return out
    idx = torch.arange(vocab_size, dtype=torch.int64, device=key1.device)
    rows_per_chunk = max(1, _NOISE_CHUNK_ELEMS // vocab_size)
    for start in range(0, n, rows_per_chunk):
        k1 = key1[start : start + rows_per_chunk, None]
        k2 = key2[start : start + rows_per_chunk, None]
        h = mix32(mix32(idx[None, :] ^ k1) ^ k2)
        u = uniform_from_hash(h)
        out[start : start + rows_per_chunk] = -log_f32(-log_f32(u))
    return out


def gumbel_argmax_ref(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    greedy: torch.Tensor,
    key1: torch.Tensor,
    key2: torch.Tensor,
) -> torch.Tensor:
    """The token of each row: ``argmax(logits)`` where ``greedy``, else
    ``argmax(logits * inv_temperature + gumbel)``; ties go to the lowest index.

    logits [N, V] float32; inv_temperature [N] float32; greedy [N] bool; keys [N] int64.
    Returns [N] int64.
    """
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise ValueError(
            f"logits: expected a 2-D float32 tensor, got {logits.dtype} {tuple(logits.shape)}"
        )
    n, vocab = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    greedy_rows = greedy.nonzero().flatten()
    sampled_rows = (~greedy).nonzero().flatten()
    if greedy_rows.numel():
        out[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
    if sampled_rows.numel():
        scores = logits[sampled_rows] * inv_temperature[sampled_rows, None]
        scores = scores + gumbel_noise_ref(key1[sampled_rows], key2[sampled_rows], vocab)
        out[sampled_rows] = scores.argmax(dim=-1)
    return out
