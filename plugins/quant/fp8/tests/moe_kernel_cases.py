"""The fp8 fused-MoE kernels against their torch reference, on random inputs from the test seed.

Not collected on its own (no ``test_`` prefix): ``test_moe_interpret.py`` runs it with
``TRITON_INTERPRET=1`` (small hidden sizes, real expert counts, top-k and token counts); on a
CUDA GPU of compute capability 8.9+ ``python -m pytest plugins/quant/fp8/tests/moe_kernel_cases.py``
adds Qwen3-30B-A3B's shapes (E=128, H=2048, I=768, top-8) in bfloat16. Experts no token
selected are NaN (weights and scales): a read of one would poison the output. Set
TALLOW_TEST_SEED to replay a run.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import MoEConfig, interpreting
from tallow_quant_fp8.moe_ops import Fp8Experts, fused_moe_fp8, fused_moe_fp8_ref
from tallow_quant_fp8.weights import BLOCK, FP8

if interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU of compute capability 8.9+ or TRITON_INTERPRET=1 set before "
        "triton is imported (test_moe_interpret.py runs this module that way)",
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


def random_experts(e: int, h: int, i: int, layout: str, g: torch.Generator) -> Fp8Experts:
    """e4m3 values over the whole range and scales that keep the products near unit size."""

    def data(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 100).clamp(-448, 448).to(FP8)

    def scale(rows: int, cols: int) -> torch.Tensor:
        shape = (e, rows) if layout == "row" else (e, -(-rows // BLOCK), -(-cols // BLOCK))
        return (torch.rand(*shape, generator=g) + 0.5) / (100 * cols**0.5)

    return Fp8Experts(data(e, 2 * i, h), scale(2 * i, h), data(e, h, i), scale(h, i), layout)


def poison_unused(experts: Fp8Experts, ids: torch.Tensor) -> Fp8Experts:
    unused = torch.ones(experts.w13.shape[0], dtype=torch.bool)
    unused[ids.reshape(-1).cpu()] = False
    nan_byte = 0x7F  # e4m3fn NaN
    for t in (experts.w13, experts.w2):
        t.view(torch.uint8)[unused] = nan_byte
    for s in (experts.w13_scale, experts.w2_scale):
        s[unused] = float("nan")
    return experts


def routing(tokens: int, e: int, top_k: int, g: torch.Generator):
    weights, ids = torch.randn(tokens, e, generator=g).softmax(-1).topk(top_k, dim=-1)
    return weights, ids


def to_device(experts: Fp8Experts) -> Fp8Experts:
    return Fp8Experts(
        *(t.to(DEVICE) for t in (experts.w13, experts.w13_scale, experts.w2, experts.w2_scale)),
        experts.layout,
    )


def check(
    tokens: int,
    e: int,
    top_k: int,
    h: int,
    i: int,
    layout: str,
    dtype: torch.dtype,
    config: MoEConfig | None,
    what: str,
) -> None:
    g = gen(what, tokens, e, top_k, h, i, layout, str(dtype))
    experts = random_experts(e, h, i, layout, g)
    weights, ids = routing(tokens, e, top_k, g)
    x = torch.randn(tokens, h, generator=g).to(dtype)
    expected = fused_moe_fp8_ref(x.float(), experts, weights, ids).to(dtype)
    experts = to_device(poison_unused(experts, ids))
    got = fused_moe_fp8(
        x.to(DEVICE), experts, weights.to(DEVICE), ids.to(DEVICE), config=config
    ).cpu()
    assert got.dtype == dtype and got.shape == (tokens, h)
    assert torch.isfinite(got.float()).all(), f"{what}: an unselected expert was read"
    rel = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((got.float() - expected.float()).abs().max())
    assert err <= rel * scale, (
        f"{what} {layout} T={tokens} E={e} top-{top_k} "
        f"(TALLOW_TEST_SEED={BASE_SEED}): error {err:.3g} > {rel} x "
        f"{scale:.3g}"
    )


SMALL = [(1, 128, 8), (2, 64, 4), (4, 8, 2), (3, 8, 1)]
MANY = [(5, 8, 1), (33, 8, 2), (64, 64, 4), (130, 128, 8), (512, 8, 2)]


@pytest.mark.parametrize("layout", ["row", "block"])
@pytest.mark.parametrize("tokens,e,top_k", SMALL)
def test_decode_gemv_reads_only_the_selected_experts(tokens, e, top_k, layout):
    check(tokens, e, top_k, 256, 128, layout, torch.float32, GEMV, "gemv")


@pytest.mark.parametrize("layout", ["row", "block"])
@pytest.mark.parametrize("tokens,e,top_k", MANY)
def test_grouped_gemm_dequantizes_in_the_k_loop(tokens, e, top_k, layout):
    check(tokens, e, top_k, 128, 128, layout, torch.float32, GEMM, "gemm")


@pytest.mark.parametrize("tokens", [1, 7])
def test_default_config_by_token_count(tokens):
    """The path and tiles chosen by token count (GEMV up to 4 tokens, then the GEMM)."""
    check(tokens, 8, 2, 128, 128, "block", torch.float32, None, "default")


if DEVICE == "cuda":

    @pytest.mark.gpu
    @pytest.mark.parametrize("layout", ["row", "block"])
    @pytest.mark.parametrize("tokens", [1, 4, 16, 64, 512])
    def test_qwen3_30b_a3b_shapes_in_bfloat16(tokens, layout):
        check(tokens, 128, 8, 2048, 768, layout, torch.bfloat16, None, "real")
