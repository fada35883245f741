"""The packed-weight GEMM (:mod:`tallow.kernels.packed_gemm`) against its torch reference.

Under ``TRITON_INTERPRET=1`` (``test_interpreter.py`` launches this module that way) at tiny
shapes chosen to reach every edge: K not a multiple of the K block nor of the split, N an odd
multiple of the N tile and N not a multiple of it, groups smaller and larger than the K
block, every code kind, zeros as a tensor and as a constant, mins, block scales. On a CUDA
machine the same cases run on the GPU, and :func:`test_llama_shapes_on_gpu` (defined only
there: the interpreter run must skip nothing) at llama-3-8b's shapes (``pytest -m gpu
tests/kernels/test_packed_gemm_kernels.py``).

The decoding is checked bit for bit (the kernels' own decoding, written out, against
:func:`dequantize_packed_ref`); products within :func:`packed_gemm_tolerance` (its docstring
derives the bound).
"""

from __future__ import annotations

import os

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import (
    PackedGemmConfig,
    dequantize_packed,
    dequantize_packed_ref,
    packed_gemm,
    packed_gemm_config,
    packed_gemm_tolerance,
    packed_weight,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def rng(seed_hint: int) -> torch.Generator:
    seed = base_seed() ^ seed_hint
    print(f"input seed {seed} (TALLOW_TEST_SEED={base_seed()} replays it)")
    return torch.Generator(device="cpu").manual_seed(seed)


def make_weight(kind: str, n: int, k: int, group: int, variant: str, g: torch.Generator):
    """A random weight of ``kind``; ``variant`` picks the zero/min/scale form."""
    groups = -(-k // group)
    scales = torch.rand(n, groups, generator=g) * 0.05 + 0.001
    if kind == "fp8":
        codes = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        if variant == "block":
            s = scales[: -(-n // 128)]
            return packed_weight("fp8", codes.to(DEVICE), s.to(DEVICE), group=group, scale_cols=128)
        return packed_weight("fp8", codes.to(DEVICE), scales.to(DEVICE), group=group)
    if kind == "e2m1":  # MXFP4: powers of two per 32 (bfloat16 holds them exactly)
        codes = torch.randint(0, 16, (n, k), generator=g)
        exps = torch.randint(-8, 2, (n, groups), generator=g)
        scales = torch.ldexp(torch.ones(n, groups), exps).bfloat16()
        return packed_weight("e2m1", codes.to(DEVICE), scales.to(DEVICE), group=group)
    top = 16 if kind == "u4" else 256
    codes = torch.randint(0, top, (n, k), generator=g)
    zeros = mins = None
    zero_point = 0.0
    if variant == "zeros":
        zeros = torch.randint(0, top, (n, groups), generator=g)
        scales = scales.half()
    elif variant == "mins":  # GGUF K-quants: float32 scale and min
        mins = torch.rand(n, groups, generator=g) * 0.1
    else:  # a constant zero point, bfloat16 scales
        zero_point = top // 2
        scales = scales.bfloat16()
    dev = lambda t: None if t is None else t.to(DEVICE)
    return packed_weight(
        kind,
        dev(codes),
        dev(scales),
        group=group,
        zeros=dev(zeros),
        zero_point=zero_point,
        mins=dev(mins),
    )


CASES = [  # kind, N, K, group, variant
    ("u4", 48, 160, 32, "zeros"),
    ("u4", 40, 256, 128, "constant"),
    ("u4", 48, 96, 32, "mins"),
    ("u8", 48, 160, 32, "constant"),
    ("u8", 40, 128, 64, "zeros"),
    ("fp8", 48, 160, 160, "channel"),
    ("fp8", 40, 200, 128, "block"),
    ("e2m1", 48, 160, 32, "mx"),
]
#: explicit tiles per batch: split-K for the few-row batches (uneven splits of K), a plain
#: tiled GEMM for 256 rows; the transposed product at 1 and 16 rows (it runs for float16: the
#: interpreter's bfloat16 products take the plain form)
TILES = {
    1: PackedGemmConfig(16, 16, 32, 3, swap_ab=True),
    7: PackedGemmConfig(16, 16, 64, 2),
    16: PackedGemmConfig(16, 32, 32, 1, swap_ab=True),
    256: PackedGemmConfig(64, 32, 32, 1),
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_decoding_is_bit_exact(case):
    kind, n, k, group, variant = case
    w = make_weight(kind, n, k, group, variant, rng(n * k))
    got, want = dequantize_packed(w), dequantize_packed_ref(w)
    assert got.dtype == torch.float32 and got.shape == (n, k)
    assert torch.equal(got.cpu(), want.cpu())


#: bfloat16 at every batch, float16 at two (the interpreter is slow)
RUNS = [(m, torch.bfloat16) for m in (1, 7, 16, 256)] + [(m, torch.float16) for m in (1, 16)]


@pytest.mark.parametrize("m,dtype", RUNS, ids=lambda r: str(r))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_product_within_rounding(case, m, dtype):
    kind, n, k, group, variant = case
    g = rng(m * n + k)
    w = make_weight(kind, n, k, group, variant, g)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=g).to(dtype).to(DEVICE) if m == 7 else None
    config = TILES[m]
    if group < k and group % config.block_k and config.block_k % group:
        config = PackedGemmConfig(
            config.block_m, config.block_n, 64, config.split_k, swap_ab=config.swap_ab
        )
    y = packed_gemm(x, w, bias, config=config)
    assert y.dtype == dtype and y.shape == (m, n)
    weight = dequantize_packed_ref(w).cpu()
    want = x.cpu().float() @ weight.T
    tol = packed_gemm_tolerance(x.cpu(), weight, config.split_k)
    if bias is not None:
        want += bias.cpu().float()
        tol += torch.finfo(dtype).eps * bias.cpu().float().abs()  # joins before the last rounding
    err = (y.cpu().float() - want).abs()
    assert bool((err <= tol).all()), f"max excess {float((err - tol).max())}"


def test_default_config_runs():
    """The untuned rule's tiles (split-K for 2 rows) on a small weight."""
    g = rng(5)
    w = make_weight("u4", 64, 256, 128, "zeros", g)
    x = torch.randn(2, 256, generator=g).bfloat16().to(DEVICE)
    cfg = packed_gemm_config(2, 64, 256, "u4")
    assert cfg.split_k > 1
    y = packed_gemm(x, w)
    weight = dequantize_packed_ref(w).cpu()
    err = (y.cpu().float() - x.cpu().float() @ weight.T).abs()
    assert bool((err <= packed_gemm_tolerance(x.cpu(), weight, cfg.split_k)).all())


if not INTERPRET:

    @pytest.mark.parametrize(
        "kind,group", [("u4", 128), ("u4", 32), ("u8", 32), ("fp8", 0), ("e2m1", 32)]
    )
    @pytest.mark.parametrize("m", [1, 16, 256])
    @pytest.mark.parametrize("nk", [(6144, 4096), (4096, 14336), (28672, 4096)])
    def test_llama_shapes_on_gpu(kind, group, m, nk):
        """Every kind at llama-3-8b's qkv, down and gate_up shapes, default tiles."""
        n, k = nk
        g = rng(m + n)
        variant = (
            ("zeros" if group == 128 else "mins")
            if kind == "u4"
            else {"u8": "constant", "fp8": "channel", "e2m1": "mx"}[kind]
        )
        w = make_weight(kind, n, k, group or k, variant, g)
        x = torch.randn(m, k, generator=g).bfloat16().to(DEVICE)
        y = packed_gemm(x, w)
        weight = dequantize_packed(w)
        assert torch.equal(weight, dequantize_packed_ref(w))
        cfg = packed_gemm_config(m, n, k, kind)
        err = (y.float() - x.float() @ weight.T).abs()
        assert bool((err <= packed_gemm_tolerance(x, weight, cfg.split_k)).all())
