"""The plugin's Triton kernels against their torch references, at small shapes.

Not collected on its own (no ``test_`` prefix): ``test_interpret.py`` runs it in a subprocess
with ``TRITON_INTERPRET=1`` so the kernels execute on the CPU, and on a CUDA machine
``python -m pytest plugins/quant/gguf/tests/kernel_cases.py`` runs it on the GPU (the
``quanttests`` item of ``bench/gpu/run_all.sh`` does). Fresh random blocks every run; set
TALLOW_TEST_SEED to replay one.
"""

from __future__ import annotations

import os
import random
import zlib

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow.kernels._dispatch import interpreting
from tallow_quant_gguf import ops
from tallow_quant_gguf.kernels.dequant import dequantize_triton
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
    pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
                "(test_interpret.py runs this module that way)", allow_module_level=True)

TYPES = sorted(QUANT_TYPES)
BASE_SEED = int(os.environ.get("TALLOW_TEST_SEED") or random.SystemRandom().randrange(2**31))


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def weight(qtype: str, rows: int, cols: int, *parts: object, extremes: bool = False):
    """(GGML blocks as numpy, the packed weight on DEVICE) with a fresh seed."""
    blocks = random_blocks(qtype, rows, cols // QUANT_TYPES[qtype].block,
                           seed=seed_of(qtype, rows, cols, *parts), extremes=extremes,
                           d_range=(1e-3, 2e-2))
    return blocks, pack(torch.from_numpy(blocks).to(DEVICE), qtype)


def same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    got, expected = got.cpu(), expected.cpu()
    both_nan = torch.isnan(got) & torch.isnan(expected)
    differ = (got.view(torch.int32) != expected.view(torch.int32)) & ~both_nan
    assert not differ.any(), (f"{what} (TALLOW_TEST_SEED={BASE_SEED}): {int(differ.sum())} "
                              f"values differ, first at {differ.nonzero()[0].tolist()}")


def close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
          what: str) -> None:
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
        expected = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(
            blocks, gguf.GGMLQuantizationType[qtype]), dtype=np.float32))
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
        ulp = rounded[finite].abs() * 2.0 ** -7
        assert ((half[finite] - rounded[finite]).abs() <= ulp).all(), f"{qtype} bf16"


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 40])
def test_fused_matmul_every_type(qtype, m):
    k = 512
    _, packed = weight(qtype, 24, k, "mm", m)
    w = dequantize_ref(packed)
    g = torch.Generator(device=DEVICE).manual_seed(seed_of("x", qtype, m))
    x = torch.randn(m, k, device=DEVICE, generator=g)
    bias = torch.randn(24, device=DEVICE, generator=g)
    close(qmatmul_triton(x, packed, bias), x, w, bias, f"{qtype} m={m}")


# The interpreter turns a float32 -> bfloat16 cast fed to tl.dot into garbage (a 16x16 dot of
# such a cast is off by 1e10 there, exact on the GPU), so it checks float16 only.
HALF = [torch.float16] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_fused_matmul_half_activations(dtype, m):
    _, packed = weight("Q4_K", 40, 768, "half", m)
    x = torch.randn(m, 768, device=DEVICE,
                    generator=torch.Generator(device=DEVICE).manual_seed(seed_of(m))).to(dtype)
    got = qmatmul_triton(x, packed)
    assert got.dtype == dtype
    close(got, x, dequantize_ref(packed), None, f"Q4_K {dtype} m={m}")


@pytest.mark.parametrize("m", [1, 9])
def test_split_k_and_output_slices(m):
    _, packed = weight("Q6_K", 12, 1024, "split", m)
    x = torch.randn(m, 1024, device=DEVICE,
                    generator=torch.Generator(device=DEVICE).manual_seed(seed_of("s", m)))
    bias = torch.randn(12, device=DEVICE)
    wide = torch.full((m, 20), 7.0, device=DEVICE)
    qmatmul_triton(x, packed, bias, out=wide[:, 5:17], split=3)
    close(wide[:, 5:17], x, dequantize_ref(packed), bias, f"split m={m}")
    assert (wide[:, :5] == 7).all() and (wide[:, 17:] == 7).all()


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m", [1, 4])
def test_gated_input(kind, m):
    _, packed = weight("Q5_K", 16, 256, "gate", kind, m)
    x = torch.randn(m, 512, device=DEVICE,
                    generator=torch.Generator(device=DEVICE).manual_seed(seed_of(kind, m)))
    got = qmatmul_triton(x, packed, gate=kind)
    activated = ops._act(x, kind)
    close(got, activated, dequantize_ref(packed), None, f"gate {kind} m={m}")


@pytest.mark.parametrize("matmul", ["auto", "fused", "dequant"])
def test_linear_of_mixed_partitions(matmul):
    parts = [weight(t, rows, 256, "mixed", matmul)[1]
             for t, rows in (("Q4_K", 32), ("Q6_K", 16), ("Q8_0", 16))]
    parts.append(dense(torch.randn(8, 256, device=DEVICE)))
    w = torch.cat([dequantize_ref(p) for p in parts])
    bias = torch.randn(72, device=DEVICE)
    policy = KernelPolicy(matmul=matmul, gemv_max_rows=4, dequant_min_rows=20)
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


def test_warm_up_decodes_a_row_of_every_part():
    parts = [weight(t, 8, 256, "warm")[1] for t in ("Q4_K", "IQ4_NL")]
    ops.warm_up(parts + [dense(torch.randn(4, 256, device=DEVICE))], torch.bfloat16)
