"""A plain transcription of llama.cpp's reference k-quant quantizers, and tests of it.

This is the oracle of the vectorised quantizer (``tallow_quant_gguf.quantize``): the functions
below follow ``quantize_row_q{2,3,4,5,6}_K_ref`` of llama.cpp's ggml-quants.c and their helpers
(``nearest_int``, ``make_qkx2_quants``, ``make_q3_quants``, ``make_qx_quants``) statement by
statement — one super-block at a time, one weight at a time in every sum, in numpy float32
scalars so that each operation rounds as C's ``float`` does (no fused multiply-add). They are
slow on purpose: nothing is vectorised that could change an order of operations.

llama.cpp itself is the authority (``test_quantize_llama_cpp.py`` compares ``tallow
quantize`` with its ``llama_model_quantize`` byte for byte); this transcription stays as the
fast check of single blocks, and it agrees with llama.cpp's bytes on the blocks where an
earlier, not correctly rounded square root made the vectorised quantizer differ.

The tests here check the transcription itself against the ``gguf`` package: its bytes
dequantize (``gguf.quants.dequantize``) to values close to the input, and its search beats a
naive absolute-maximum quantizer of the same layout, which it exists to do.
"""

from __future__ import annotations

import numpy as np
import pytest

f32 = np.float32
QK_K = 256
GROUP_MAX_EPS = f32(1e-15)


def nearest_int(v: np.float32) -> int:
    val = np.array(f32(v) + f32(12582912.0), dtype=np.float32)
    bits = int(val.view(np.int32))
    return (bits & 0x007FFFFF) - 0x00400000


def fp16(v: np.float32) -> np.float16:
    return np.float16(v)


def fp16_to_fp32(h: np.float16) -> np.float32:
    return f32(h)


def clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def first_absmax(values) -> tuple[np.float32, np.float32]:
    """``(amax, signed max)`` as ``if (ax > amax) { amax = ax; max = x[i]; }`` from 0 finds
    them."""
    mx = f32(0)
    amax = f32(0)
    for v in values:
        if abs(v) > amax:
            amax = abs(v)
            mx = v
    return amax, mx


def symmetric_subblocks(x: np.ndarray, search) -> tuple[list[int], list, np.float32, np.float32]:
    """The 16 sub-block searches of Q3_K/Q6_K: ``(L, scales, max_scale, max_abs_scale)``."""
    L = [0] * QK_K
    scales = [f32(0)] * 16
    for j in range(16):
        scales[j], L[16 * j : 16 * j + 16] = search(x[16 * j : 16 * j + 16])
    amax, max_scale = first_absmax(scales)
    return L, scales, max_scale, amax


def affine_subblocks(
    x: np.ndarray,
    n: int,
    weights_of,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
):
    """The sub-block searches of Q2_K/Q4_K/Q5_K: ``(L, scales, mins, max_scale, max_min)``,
    the maxima as ``if (v > m) m = v`` from 0 finds them."""
    count = QK_K // n
    L = [0] * QK_K
    scales = [f32(0)] * count
    mins = [f32(0)] * count
    max_scale = f32(0)
    max_min = f32(0)
    for j in range(count):
        xs = x[n * j : n * j + n]
        scales[j], mins[j], L[n * j : n * j + n] = make_qkx2_quants(
            n, nmax, xs, weights_of(xs), rmin, rdelta, nstep, use_mad
        )
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    return L, scales, mins, max_scale, max_min


def make_qkx2_quants(n, nmax, x, weights, rmin, rdelta, nstep, use_mad):
    """Returns (scale, the_min, L)."""
    L = [0] * n
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w = sum_w + w
        sum_x = sum_x + w * x[i]
    if mn > 0:
        mn = f32(0)
    if mx == mn:
        return f32(0), -mn, [0] * n
    iscale = f32(nmax) / (mx - mn)
    scale = f32(1) / iscale
    best_error = f32(0)
    for i in range(n):
        L[i] = clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax)
        diff = scale * f32(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error = best_error + weights[i] * diff
    for step in range(nstep + 1):
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / (mx - mn)
        sum_l = sum_l2 = sum_xl = f32(0)
        laux = [0] * n
        for i in range(n):
            l = clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax)
            laux[i] = l
            w = weights[i]
            sum_l = sum_l + w * f32(l)
            sum_l2 = sum_l2 + w * f32(l) * f32(l)
            sum_xl = sum_xl + w * f32(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = f32(0)
                this_scale = sum_xl / sum_l2
            cur_error = f32(0)
            for i in range(n):
                diff = this_scale * f32(laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error = cur_error + weights[i] * diff
            if cur_error < best_error:
                L = list(laux)
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn, L


def make_qx_quants(n, nmax, x):
    """rmse_type 1, no importance weights. Returns (scale, L)."""
    amax, mx = first_absmax(x)
    if amax < GROUP_MAX_EPS:
        return f32(0), [0] * n
    L = [0] * n
    iscale = f32(-nmax) / mx
    sumlx = suml2 = f32(0)
    for i in range(n):
        l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l + nmax
        w = x[i] * x[i]
        sumlx = sumlx + w * x[i] * f32(l)
        suml2 = suml2 + w * f32(l) * f32(l)
    scale = sumlx / suml2 if suml2 != 0 else f32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(f32(nmax) + f32(0.1) * f32(step)) / mx
        sumlx = suml2 = f32(0)
        for i in range(n):
            l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
            w = x[i] * x[i]
            sumlx = sumlx + w * x[i] * f32(l)
            suml2 = suml2 + w * f32(l) * f32(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale, L


def make_q3_quants(n, nmax, x):
    """do_rmse = true. Returns (scale, L)."""
    amax, mx = first_absmax(x)
    if amax < GROUP_MAX_EPS:
        return f32(0), [0] * n
    iscale = f32(-nmax) / mx
    L = [0] * n
    sumlx = suml2 = f32(0)
    for i in range(n):
        l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l
        w = x[i] * x[i]
        sumlx = sumlx + w * x[i] * f32(l)
        suml2 = suml2 + w * f32(l) * f32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * f32(L[i])
            if slx > 0:
                sl2 = suml2 - w * f32(L[i]) * f32(L[i])
                new_l = clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                if new_l != L[i]:
                    slx = slx + w * x[i] * f32(new_l)
                    sl2 = sl2 + w * f32(new_l) * f32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if not n_changed:
            break
    L = [v + nmax for v in L]
    return (sumlx / suml2 if suml2 > 0 else f32(0)), L


def _u16(h: np.float16) -> list[int]:
    return list(np.array([h], dtype=np.float16).view(np.uint8))


def _pack_2bit(L: list[int]) -> list[int]:
    qs = [0] * (QK_K // 4)
    for j in range(0, QK_K, 128):
        for l in range(32):
            qs[j // 4 + l] = (
                L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
            ) & 0xFF
    return qs


def _scale_min_k4(j: int, q: list[int]) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """One super-block (256 float32) → 84 bytes."""
    L, scales, mins, max_scale, max_min = affine_subblocks(
        x, 16, lambda xs: [abs(v) for v in xs], 3, -0.5, 0.1, 15, True
    )
    sc = [0] * 16
    if max_scale > 0:
        iscale = f32(15) / max_scale
        sc = [nearest_int(iscale * scales[j]) & 0xFF for j in range(16)]
        d = fp16(max_scale / f32(15))
    else:
        d = fp16(f32(0))
    if max_min > 0:
        iscale = f32(15) / max_min
        sc = [(sc[j] | (nearest_int(iscale * mins[j]) << 4)) & 0xFF for j in range(16)]
        dmin = fp16(max_min / f32(15))
    else:
        dmin = fp16(f32(0))
    for j in range(16):
        dd = fp16_to_fp32(d) * f32(sc[j] & 0xF)
        if not dd:
            continue
        dm = fp16_to_fp32(dmin) * f32(sc[j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int((x[16 * j + ii] + dm) / dd), 0, 3)
    return np.array(sc + _pack_2bit(L) + _u16(d) + _u16(dmin), dtype=np.uint8)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """One super-block → 110 bytes."""
    L, scales, max_scale, _ = symmetric_subblocks(x, lambda xs: make_q3_quants(16, 4, xs))
    sb = [0] * 12
    if max_scale:
        iscale = f32(-32) / max_scale
        for j in range(16):
            l = nearest_int(iscale * scales[j])
            l = ((l + 128) & 0xFF) - 128  # int8_t
            l = clamp(l, -32, 31) + 32
            if j < 8:
                sb[j] = l & 0xF
            else:
                sb[j - 8] |= (l & 0xF) << 4
            l >>= 4
            sb[j % 4 + 8] |= l << (2 * (j // 4))
        d = fp16(f32(1) / iscale)
    else:
        d = fp16(f32(0))
    for j in range(16):
        sc = sb[j] & 0xF if j < 8 else sb[j - 8] >> 4
        sc = (sc | (((sb[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dd = fp16_to_fp32(d) * f32(sc)
        if not dd:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / dd), -4, 3) + 4
    hmask = [0] * 32
    m, hm = 0, 1
    for j in range(QK_K):
        if L[j] > 3:
            hmask[m] |= hm
            L[j] -= 4
        m += 1
        if m == 32:
            m, hm = 0, hm << 1
    return np.array(hmask + _pack_2bit(L) + sb + _u16(d), dtype=np.uint8)


def _rms_plus_abs(xs) -> list[np.float32]:
    """Q4_K/Q5_K's weights: the sub-block's RMS plus each weight's magnitude."""
    sum_x2 = f32(0)
    for v in xs:
        sum_x2 = sum_x2 + v * v
    av_x = np.sqrt(sum_x2 / f32(len(xs)))
    return [av_x + abs(v) for v in xs]


def _quantize_affine_k(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    L, scales, mins, max_scale, max_min = affine_subblocks(
        x, 32, _rms_plus_abs, nmax, rmin, rdelta, nstep, False
    )
    inv_scale = f32(63) / max_scale if max_scale > 0 else f32(0)
    inv_min = f32(63) / max_min if max_min > 0 else f32(0)
    sb = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            sb[j] = ls
            sb[j + 4] = lm
        else:
            sb[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sb[j - 4] |= (ls >> 4) << 6
            sb[j] |= (lm >> 4) << 6
    d = fp16(max_scale / f32(63))
    dmin = fp16(max_min / f32(63))
    for j in range(8):
        sc, m = _scale_min_k4(j, sb)
        dd = fp16_to_fp32(d) * f32(sc)
        if not dd:
            continue
        dm = fp16_to_fp32(dmin) * f32(m)
        for ii in range(32):
            L[32 * j + ii] = clamp(nearest_int((x[32 * j + ii] + dm) / dd), 0, nmax)
    return L, _u16(d) + _u16(dmin) + sb


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """One super-block → 144 bytes."""
    L, header = _quantize_affine_k(x, 15, -1.0, 0.1, 20)
    qs = []
    for j in range(0, QK_K, 64):
        qs += [L[j + l] | (L[j + l + 32] << 4) for l in range(32)]
    return np.array(header + qs, dtype=np.uint8)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """One super-block → 176 bytes."""
    L, header = _quantize_affine_k(x, 31, -0.5, 0.1, 15)
    qh = [0] * 32
    ql = []
    m1, m2 = 1, 2
    for n in range(0, QK_K, 64):
        for j in range(32):
            l1, l2 = L[n + j], L[n + j + 32]
            if l1 > 15:
                l1 -= 16
                qh[j] |= m1
            if l2 > 15:
                l2 -= 16
                qh[j] |= m2
            ql.append(l1 | (l2 << 4))
        m1 <<= 2
        m2 <<= 2
    return np.array(header + qh + ql, dtype=np.uint8)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """One super-block → 210 bytes."""
    L, scales, max_scale, max_abs_scale = symmetric_subblocks(
        x, lambda xs: make_qx_quants(16, 32, xs)
    )
    if max_abs_scale < GROUP_MAX_EPS:
        return np.zeros(210, dtype=np.uint8)
    iscale = f32(-128) / max_scale
    d = fp16(f32(1) / iscale)
    sc = [min(127, nearest_int(iscale * scales[ib])) for ib in range(16)]
    sc = [((v + 128) & 0xFF) - 128 for v in sc]  # int8_t
    for j in range(16):
        dd = fp16_to_fp32(d) * f32(sc[j])
        if not dd:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / dd), -32, 31) + 32
    ql = [0] * 128
    qh = [0] * 64
    for c, j in enumerate(range(0, QK_K, 128)):
        for l in range(32):
            q1, q2 = L[j + l] & 0xF, L[j + l + 32] & 0xF
            q3, q4 = L[j + l + 64] & 0xF, L[j + l + 96] & 0xF
            ql[64 * c + l] = q1 | (q3 << 4)
            ql[64 * c + l + 32] = q2 | (q4 << 4)
            qh[32 * c + l] = (
                (L[j + l] >> 4)
                | ((L[j + l + 32] >> 4) << 2)
                | ((L[j + l + 64] >> 4) << 4)
                | ((L[j + l + 96] >> 4) << 6)
            )
    return np.array(ql + qh + [v & 0xFF for v in sc] + _u16(d), dtype=np.uint8)


REFERENCE_QUANTIZERS = {
    "q2_k": quantize_q2_k,
    "q3_k": quantize_q3_k,
    "q4_k": quantize_q4_k,
    "q5_k": quantize_q5_k,
    "q6_k": quantize_q6_k,
}


def reference_quantize(rows: np.ndarray, qtype: str) -> np.ndarray:
    """[rows, cols] float32 → [rows, bytes] uint8, one super-block at a time."""
    fn = REFERENCE_QUANTIZERS[qtype]
    blocks = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, QK_K)
    with np.errstate(all="ignore"):
        out = np.stack([fn(b) for b in blocks])
    return out.reshape(rows.shape[0], -1)


# ---------------------------------------------------------------------------------------------
# Tests of the transcription itself
# ---------------------------------------------------------------------------------------------
def _gguf_type(qtype: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[qtype.upper()]


def _naive_absmax(rows: np.ndarray, qtype: str) -> np.ndarray:
    """Dequantized values of a quantizer without any search, for comparison: as many levels
    as the type has codes, spread evenly over each sub-block's ``[-absmax, absmax]`` with an
    exact (unquantized) float64 scale."""
    bits = {"q2_k": 2, "q3_k": 3, "q4_k": 4, "q5_k": 5, "q6_k": 6}[qtype]
    sub = 16 if qtype in ("q2_k", "q3_k", "q6_k") else 32
    x = rows.reshape(-1, sub).astype(np.float64)
    half = 2 ** (bits - 1)
    d = np.abs(x).max(axis=1, keepdims=True) / (half - 0.5)
    d[d == 0] = 1
    return (np.clip(np.floor(x / d), -half, half - 1) + 0.5) * d


@pytest.mark.parametrize("qtype", sorted(REFERENCE_QUANTIZERS))
def test_reference_round_trips_through_gguf_and_beats_absmax(qtype: str) -> None:
    from gguf.quants import dequantize

    rng = np.random.default_rng(3)
    rows = rng.standard_normal((2, 2 * QK_K)).astype(np.float32)
    q = reference_quantize(rows, qtype)
    back = dequantize(q, _gguf_type(qtype))
    assert back.shape == rows.shape
    err = float(np.mean((back - rows) ** 2))
    naive = float(np.mean((_naive_absmax(rows, qtype).reshape(rows.shape) - rows) ** 2))
    # Relative MSE of a 2-bit quantizer of Gaussian data is ~0.1; of a 6-bit one ~1e-3.
    assert err < {"q2_k": 0.15, "q3_k": 0.05, "q4_k": 0.012, "q5_k": 0.003, "q6_k": 0.001}[qtype]
    assert err < naive


def test_nearest_int_rounds_half_to_even() -> None:
    assert [nearest_int(f32(v)) for v in (0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998)] == [
        0,
        2,
        2,
        0,
        -2,
        2,
    ]
