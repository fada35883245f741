"""The plugin's Triton kernels against their torch references, at small shapes.

Not collected on its own (no ``test_`` prefix): ``test_interpret.py`` runs it in a subprocess
with ``TRITON_INTERPRET=1`` so the kernels execute on the CPU, and on a CUDA machine
``python -m pytest plugins/quant/gguf/tests/kernel_cases.py`` runs it on the GPU (the
``quanttests`` item of ``bench/gpu/run_all.sh`` does). Random blocks from the test seed; set
TALLOW_TEST_SEED to replay one.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import interpreting
from tallow_quant_gguf import ops
from tallow_quant_gguf.kernels.dequant import dequantize_triton
from tallow_quant_gguf.kernels.gemv import gemv_triton
from tallow_quant_gguf.kernels.matmul import qmatmul_triton
from tallow_quant_gguf.packing import dense, pack
from tallow_quant_gguf.qtypes import QUANT_TYPES
from tallow_quant_gguf.reference import dequantize_ref
from tallow_quant_gguf.scheme import KernelPolicy

if interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
        "(test_interpret.py runs this module that way)",
        allow_module_level=True,
    )

TYPES = sorted(QUANT_TYPES)
BASE_SEED = base_seed()


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def weight(qtype: str, rows: int, cols: int, *parts: object, extremes: bool = False):
    """(GGML blocks as numpy, the packed weight on DEVICE) with the case's seed."""
    blocks = random_blocks(
        qtype,
        rows,
        cols // QUANT_TYPES[qtype].block,
        seed=seed_of(qtype, rows, cols, *parts),
        extremes=extremes,
        d_range=(1e-3, 2e-2),
    )
    return blocks, pack(torch.from_numpy(blocks).to(DEVICE), qtype)


def same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    got, expected = got.cpu(), expected.cpu()
    both_nan = torch.isnan(got) & torch.isnan(expected)
    differ = (got.view(torch.int32) != expected.view(torch.int32)) & ~both_nan
    assert not differ.any(), (
        f"{what} (TALLOW_TEST_SEED={BASE_SEED}): {int(differ.sum())} "
        f"values differ, first at {differ.nonzero()[0].tolist()}"
    )


def close(
    got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str
) -> None:
    """``got`` is ``x @ w.T + bias`` up to accumulation order and x's dtype: each value within
    a fraction of ``|x| @ |w|.T`` (the scale of its terms)."""
    x64, w64 = x.double(), w.double()  # on the inputs' device: GPU shapes are large
    ref = x64 @ w64.T + (bias.double() if bias is not None else 0)
    scale = x64.abs() @ w64.abs().T + 1e-6
    tol = 1e-4 if x.dtype == torch.float32 else 2e-2
    err = ((got.double() - ref).abs() / scale).max().item()
    assert err <= tol, f"{what} (TALLOW_TEST_SEED={BASE_SEED}): relative error {err:.3g}"


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_bit_identical_to_gguf(qtype):
    import gguf

    blocks, packed = weight(qtype, 19, 512, "dequant", extremes=True)
    with np.errstate(all="ignore"):
        expected = torch.from_numpy(
            np.ascontiguousarray(
                gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]), dtype=np.float32
            )
        )
    same_bits(dequantize_triton(packed), expected, qtype)
    ids = torch.tensor([18, 0, 7, 7, 3], device=DEVICE)
    same_bits(dequantize_triton(packed, ids=ids), expected[ids.cpu()], f"{qtype} rows")
    half = dequantize_triton(packed, torch.bfloat16, ids=ids).float().cpu()
    rounded = expected[ids.cpu()].to(torch.bfloat16).float()
    if DEVICE == "cuda":  # rounded to nearest even, as torch rounds
        same_bits(half, rounded, f"{qtype} bf16")
    else:  # the interpreter's float32 -> bfloat16 conversion may truncate instead
        finite = torch.isfinite(rounded)
        assert torch.equal(torch.isfinite(half), finite)
        ulp = rounded[finite].abs() * 2.0**-7
        assert ((half[finite] - rounded[finite]).abs() <= ulp).all(), f"{qtype} bf16"


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_whole_and_partial_tiles(qtype):
    """Whole tiles (no masks; a program walks two row blocks), a partial column block, and the
    half-precision workspaces: the values of the torch reference, rounded as torch rounds."""
    small = QUANT_TYPES[qtype].block == 32
    # rows, cols: whole tiles of 16 rows by 256 columns; then a ragged last column block
    for rows, cols in ((32, 512), (20, 96 if small else 768)):
        _, packed = weight(qtype, rows, cols, "tiles")
        expected = dequantize_ref(packed)
        same_bits(dequantize_triton(packed), expected, f"{qtype} [{rows}, {cols}]")
        for dtype in (torch.float16, torch.bfloat16):
            got = dequantize_triton(packed, dtype).float().cpu()
            rounded = expected.to(dtype).float().cpu()
            if DEVICE == "cuda":
                same_bits(got, rounded, f"{qtype} [{rows}, {cols}] {dtype}")
            else:  # the interpreter may truncate instead of rounding (see above)
                assert ((got - rounded).abs() <= rounded.abs() * 2.0**-7).all(), qtype


def x_of(m: int, k: int, *parts: object, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed_of("x", m, k, *parts))
    return torch.randn(m, k, device=DEVICE, generator=g).to(dtype)


#: GEMV configurations (rows per program, warps, K slices, prefetch): whole row blocks, two
#: warps side by side along K, split-K without prefetch
GEMV_CONFIGS = [(4, 1, 1, True), (8, 2, 1, True), (4, 1, 3, False)]


@pytest.mark.parametrize("qtype", TYPES)
def test_gemv_every_type(qtype):
    k = 1024 if QUANT_TYPES[qtype].byte else 2048  # a K step of two warps is 64 quads
    _, packed = weight(qtype, 24, k, "gemv")
    w = dequantize_ref(packed)
    bias = torch.randn(24, device=DEVICE)
    x = x_of(1, k, qtype)
    for config in GEMV_CONFIGS:
        close(gemv_triton(x, packed, bias, config=config), x, w, bias, f"{qtype} {config}")
    ragged = packed.map(lambda t: t[:21])  # not a whole number of row blocks
    close(gemv_triton(x, ragged, config=(4, 1, 2, True)), x, w[:21], None, f"{qtype} ragged")


#: tensor-core configurations (BM, BN, quads per step, warps, stages, K slices, decoding: the
#: generic one, fp16 pairs in PTX (on a GPU), float32 from exponent bits); from 64 rows of x
#: the weights are the right operand
MMA_CONFIGS = [(16, 32, 8, 4, 2, 1, 1), (32, 32, 4, 4, 2, 3, 0), (64, 32, 8, 4, 2, 1, 2)]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 5, 40])
def test_mma_every_type(qtype, m):
    _, packed = weight(qtype, 48, 512, "mma", m)
    w = dequantize_ref(packed)
    x = x_of(m, 512, qtype)
    bias = torch.randn(48, device=DEVICE)
    for config in MMA_CONFIGS:
        close(qmatmul_triton(x, packed, bias, config=config), x, w, bias, f"{qtype} m={m} {config}")


# The interpreter turns a float32 -> bfloat16 cast fed to tl.dot into garbage (a 16x16 dot of
# such a cast is off by 1e10 there, exact on the GPU), so it checks float16 only. On a GPU the
# half-precision activations take the fp16 decoding of the types that have one.
HALF = [torch.float16] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_0", "Q8_0", "Q6_K"])
def test_half_activations(dtype, qtype):
    _, packed = weight(qtype, 64, 768, "half")
    w = dequantize_ref(packed)
    for m in (1, 5, 33):
        x = x_of(m, 768, qtype, dtype=dtype)
        for decoding in (0, 1, 2):
            got = qmatmul_triton(x, packed, config=(16, 32, 8, 4, 2, 1, decoding))
            assert got.dtype == dtype
            close(got, x, w, None, f"{qtype} {dtype} m={m} decoding {decoding}")
    x = x_of(1, 768, qtype, "gemv", dtype=dtype)
    close(gemv_triton(x, packed, config=(4, 1, 1, True)), x, w, None, f"{qtype} {dtype} gemv")


def test_output_slices():
    _, packed = weight("Q4_K", 32, 512, "slices")
    w = dequantize_ref(packed)
    for m, run in (
        (1, lambda x, o: gemv_triton(x, packed, out=o, config=(4, 1, 2, True))),
        (3, lambda x, o: qmatmul_triton(x, packed, out=o, config=(16, 32, 4, 4, 2, 2, 1))),
    ):
        x = x_of(m, 512, "slices")
        wide = torch.full((m, 40), 7.0, device=DEVICE)
        run(x, wide[:, 5:37])
        close(wide[:, 5:37], x, w, None, f"slice m={m}")
        assert (wide[:, :5] == 7).all() and (wide[:, 37:] == 7).all()


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q8_0"])
def test_gated_input(kind, qtype):
    _, packed = weight(qtype, 32, 512, "gate", kind)
    w = dequantize_ref(packed)
    x = x_of(4, 1024, kind, qtype)
    activated = ops._act(x, kind)
    close(
        gemv_triton(x[:1], packed, gate=kind, config=(4, 1, 1, True)),
        activated[:1],
        w,
        None,
        f"gemv {kind}",
    )
    for decoding in (1, 2):
        close(
            qmatmul_triton(x, packed, gate=kind, config=(16, 32, 4, 4, 2, 1, decoding)),
            activated,
            w,
            None,
            f"mma {kind} decoding {decoding}",
        )


@pytest.mark.parametrize("matmul", ["auto", "fused", "dequant"])
def test_linear_of_mixed_partitions(matmul):
    parts = [
        weight(t, rows, 256, "mixed", matmul)[1]
        for t, rows in (("Q4_K", 32), ("Q6_K", 16), ("Q8_0", 16))
    ]
    parts.append(dense(torch.randn(8, 256, device=DEVICE)))
    w = torch.cat([dequantize_ref(p) for p in parts])
    bias = torch.randn(72, device=DEVICE)
    policy = KernelPolicy(matmul=matmul, dequant_min_rows=20)
    for m in (1, 6, 24):
        x = torch.randn(2, m, 256, device=DEVICE)
        got = ops.linear(x, parts, bias, policy=policy)
        assert got.shape == (2, m, 72)
        close(got.reshape(-1, 72), x.reshape(-1, 256), w, bias, f"{matmul} m={m}")


def test_embedding_gathers_exact_rows():
    _, packed = weight("Q5_0", 50, 128, "embed")
    ids = torch.tensor([[3, 49], [0, 3]], device=DEVICE)
    got = ops.embedding(packed, ids, torch.float32)
    assert got.shape == (2, 2, 128)
    same_bits(got.reshape(4, 128), dequantize_ref(packed)[ids.reshape(-1)], "embedding")


def test_warm_up_runs_every_variant_of_every_part():
    parts = [weight(t, 64, 512, "warm")[1] for t in ("Q4_K", "IQ4_NL", "Q8_0")]
    dtype = torch.float16 if DEVICE == "cpu" else torch.bfloat16
    ops.warm_up(parts + [dense(torch.randn(4, 512, device=DEVICE))], dtype)
    ops.warm_up(parts[:1], dtype, gated="silu")
