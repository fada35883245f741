"""The packed GEMM built with Triton's real compiler for Hopper (sm_90), on any machine: every
code kind at the default rule's split-K tiles (a few rows) and large-batch tiles type-checks,
lowers, spills no registers and multiplies on tensor cores (``HMMA``/``HGMMA`` in its main
loop); the decoding kernel builds too."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tallow.kernels import (
    compile_for_gpu,
    interpreting,
    packed_gemm_config,
    resource_usage,
    sass_loops,
    sass_opcode,
)

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )

from tallow.kernels._packed_gemm_triton import (  # noqa: E402
    _KIND_IDS,
    _dequantize_kernel,
    _packed_gemm_kernel,
)

CODES = {"u4": "*i32", "e2m1": "*i32", "u8": "*u8", "fp8": "*fp8e4nv"}
#: (kind, group, zeros, mins, scale type): int4 g128 with zeros, Q4_K (float32 scale and
#: min per 32), Q8_0, fp8 per channel, MXFP4
WEIGHTS = [
    ("u4", 128, True, False, "*fp16"),
    ("u4", 32, False, True, "*fp32"),
    ("u8", 32, False, False, "*fp16"),
    ("fp8", 4096, False, False, "*fp32"),
    ("e2m1", 32, False, False, "*bf16"),
]


def _aligned(name: str) -> bool:
    return name.endswith("_ptr") or name in ("N", "K", "stride_xm", "scale_stride")


def build(kind: str, group: int, zeros: bool, mins: bool, scales: str, m: int) -> Any:
    cfg = packed_gemm_config(m, 4096, 4096, kind)
    sub = group if group < cfg.block_k else cfg.block_k
    partial = cfg.split_k > 1
    constexprs = dict(
        KIND=_KIND_IDS[kind],
        GROUP=group,
        SUB=sub,
        SCALE_COLS=1,
        HAS_ZEROS=zeros,
        HAS_MINS=mins,
        HAS_BIAS=not partial,
        PARTIAL=partial,
        UPCAST=False,
        SWAP=cfg.swap_ab,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
    )
    types = {
        "x_ptr": "*bf16",
        "codes_ptr": CODES[kind],
        "scales_ptr": scales,
        "zeros_ptr": "*u8",
        "mins_ptr": scales,
        "bias_ptr": "*bf16",
        "y_ptr": "*fp32" if partial else "*bf16",
        "zero_point": "fp32",
    }
    return compile_for_gpu(
        _packed_gemm_kernel,
        constexprs,
        types,
        aligned=_aligned,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


@pytest.mark.parametrize("m", [1, 256])
@pytest.mark.parametrize("weight", WEIGHTS, ids=lambda w: f"{w[0]}-g{w[1]}")
def test_default_tiles_build_for_hopper(weight, m):
    compiled = build(*weight, m=m)
    usage = resource_usage(compiled)
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0, usage
    loop = Counter(sass_opcode(i) for body in sass_loops(compiled) for i in body)
    assert loop["HMMA"] + loop["HGMMA"] > 0, f"no tensor-core instruction in the loop: {loop}"


@pytest.mark.parametrize("kind", sorted(CODES))
def test_decoding_kernel_builds(kind):
    constexprs = dict(
        KIND=_KIND_IDS[kind],
        GROUP=32,
        SUB=32,
        SCALE_COLS=1,
        HAS_ZEROS=False,
        HAS_MINS=False,
        BLOCK_K=64,
        BLOCK_N=32,
    )
    types = {
        "codes_ptr": CODES[kind],
        "scales_ptr": "*fp16",
        "zeros_ptr": "*u8",
        "mins_ptr": "*fp16",
        "out_ptr": "*fp32",
        "zero_point": "fp32",
    }
    compiled = compile_for_gpu(_dequantize_kernel, constexprs, types, aligned=_aligned, num_warps=4)
    assert resource_usage(compiled)["LOCAL"] == 0
