"""The integer fused-MoE kernels against their torch reference, on random inputs from the test seed.

Not collected on its own (no ``test_`` prefix): ``test_moe_interpret.py`` runs it with
``TRITON_INTERPRET=1`` (small hidden sizes, real expert counts, top-k and token counts); on a
CUDA GPU ``python -m pytest plugins/quant/int4/tests/moe_kernel_cases.py`` adds
Qwen3-30B-A3B's shapes (E=128, H=2048, I=768, top-8) in bfloat16. Experts no token selected
have NaN scales: a read of one would poison the output. Set TALLOW_TEST_SEED to replay a run.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import MoEConfig, interpreting
from tallow_quant_int4.layout import from_codes
from tallow_quant_int4.moe_ops import IntExperts, StackedInt, fused_moe_int, fused_moe_int_ref

if interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
        "(test_moe_interpret.py runs this module that way)",
        allow_module_level=True,
    )

BASE_SEED = base_seed()
GEMV = MoEConfig(
    "gemv", block_m=1, block_n=64 if DEVICE == "cpu" else 8, block_k=128, num_warps=4, num_stages=1
)
# the interpreter's cost is per program: large tiles there
GEMM = (
    MoEConfig("gemm", block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=1)
    if DEVICE == "cpu"
    else MoEConfig("gemm", block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=2)
)


def gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed((zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % 2**31)


def stacked(
    e: int, rows: int, cols: int, bits: int, group: int, zeros: bool, g: torch.Generator
) -> StackedInt:
    """Random codes, scales near ``1 / (2^bits sqrt(cols))`` and zero points."""
    weights = []
    for _ in range(e):
        codes = torch.randint(0, 1 << bits, (rows, cols), generator=g, dtype=torch.uint8)
        scales = (
            (torch.rand(rows, cols // group, generator=g) + 0.5) / ((1 << bits) * cols**0.5)
        ).to(torch.float16)
        zp = (
            torch.randint(0, 1 << bits, (rows, cols // group), generator=g, dtype=torch.uint8)
            if zeros
            else None
        )
        weights.append(from_codes(codes, scales, zp, bits))
    return StackedInt.stack(weights, "test")


def check(
    tokens: int,
    e: int,
    top_k: int,
    h: int,
    i: int,
    bits: int,
    group: int,
    zeros: bool,
    dtype: torch.dtype,
    config: MoEConfig | None,
    what: str,
) -> None:
    g = gen(what, tokens, e, top_k, h, i, bits, group, zeros, str(dtype))
    experts = IntExperts(
        stacked(e, 2 * i, h, bits, group, zeros, g), stacked(e, h, i, bits, group, zeros, g)
    )
    weights, ids = torch.randn(tokens, e, generator=g).softmax(-1).topk(top_k, dim=-1)
    x = torch.randn(tokens, h, generator=g).to(dtype)
    expected = fused_moe_int_ref(x.float(), experts, weights, ids).to(dtype)
    unused = torch.ones(e, dtype=torch.bool)
    unused[ids.reshape(-1)] = False
    for w in (experts.w13, experts.w2):
        w.scales[unused] = float("nan")
    dev = IntExperts(
        *(
            StackedInt(
                w.bits,
                w.group,
                w.codes.to(DEVICE),
                w.scales.to(DEVICE),
                None if w.zeros is None else w.zeros.to(DEVICE),
            )
            for w in (experts.w13, experts.w2)
        )
    )
    got = fused_moe_int(x.to(DEVICE), dev, weights.to(DEVICE), ids.to(DEVICE), config=config).cpu()
    assert got.dtype == dtype and got.shape == (tokens, h)
    assert torch.isfinite(got.float()).all(), f"{what}: an unselected expert was read"
    rel = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((got.float() - expected.float()).abs().max())
    assert err <= rel * scale, (
        f"{what} int{bits} g{group} zeros={zeros} T={tokens} E={e} "
        f"top-{top_k} (TALLOW_TEST_SEED={BASE_SEED}): error {err:.3g} "
        f"> {rel} x {scale:.3g}"
    )


# (tokens, experts, top_k, bits, group, zero points): every layout, and every expert count,
# top-k and token range, without the whole product (the interpreter is slow)
SMALL = [
    (1, 128, 8, 4, 128, False),
    (2, 64, 4, 4, 32, True),
    (4, 8, 2, 8, 64, True),
    (3, 8, 1, 4, 128, True),
]
MANY = [
    (5, 8, 1, 4, 32, True),
    (33, 8, 2, 8, 64, True),
    (64, 64, 4, 4, 128, False),
    (130, 128, 8, 4, 128, True),
    (512, 8, 2, 4, 128, False),
]


@pytest.mark.parametrize("tokens,e,top_k,bits,group,zeros", SMALL)
def test_decode_gemv_reads_only_the_selected_experts(tokens, e, top_k, bits, group, zeros):
    check(tokens, e, top_k, 256, 128, bits, group, zeros, torch.float32, GEMV, "gemv")


@pytest.mark.parametrize("tokens,e,top_k,bits,group,zeros", MANY)
def test_grouped_gemm_decodes_in_the_k_loop(tokens, e, top_k, bits, group, zeros):
    check(tokens, e, top_k, 128, 128, bits, group, zeros, torch.float32, GEMM, "gemm")


@pytest.mark.parametrize("tokens", [1, 7])
def test_default_config_by_token_count(tokens):
    check(tokens, 8, 2, 128, 128, 4, 128, True, torch.float32, None, "default")


if DEVICE == "cuda":

    @pytest.mark.gpu
    @pytest.mark.parametrize("bits,group,zeros", [(4, 128, False), (4, 128, True)])
    @pytest.mark.parametrize("tokens", [1, 4, 16, 64, 512])
    def test_qwen3_30b_a3b_shapes_in_bfloat16(tokens, bits, group, zeros):
        check(tokens, 128, 8, 2048, 768, bits, group, zeros, torch.bfloat16, None, "real")
