"""The Gated DeltaNet kernels built for sm_90 by Triton's real compiler, on a machine without a
GPU: with the arguments and tiles their launchers pass for Qwen3-Next's head sizes (16 key
heads and 32 value heads of 128, an 8192-channel conv) each lowers for the hardware, which the
interpreter cannot show, and the kernels that keep no large tile in flight use no local
memory."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton", reason="the kernels are Triton's")
if os.environ.get("TRITON_INTERPRET", "") == "1":
    pytest.skip("the interpreter does not compile", allow_module_level=True)

from tallow.kernels import compile_for_gpu, resource_usage  # noqa: E402
from tallow.kernels import _causal_conv_triton as conv  # noqa: E402
from tallow.kernels import _gated_delta_triton as delta  # noqa: E402
from tallow.kernels import _gated_norm_triton as norm  # noqa: E402

BF16, F32, I32, I64 = "*bf16", "*fp32", "*i32", "*i64"
ROWS = dict(
    q_ptr=BF16,
    k_ptr=BF16,
    v_ptr=BF16,
    out_ptr=BF16,
    g_ptr=F32,
    beta_ptr=F32,
    state_ptr=F32,
    slots_ptr=I64,
    qsl_ptr=I32,
    inv_ptr=F32,
    scale="fp32",
)
HEADS = dict(HEADS_PER_K=2, QK_L2NORM=True)

CASES = {
    # name: (kernel, constexprs, argument types, options, may use a stack)
    "chunk_inverse": (
        delta._chunk_inverse,
        dict(HEADS, BT=delta.CHUNK, BK=128, PRECISION="tf32"),
        ROWS,
        dict(num_warps=8),
        False,
    ),
    "chunk_scan_bf16": (
        delta._chunk_scan,
        dict(HEADS, BT=delta.CHUNK, BK=128, BV=32, PRECISION="tf32"),
        ROWS,
        dict(num_warps=8),
        True,
    ),
    "chunk_scan_fp32": (
        delta._chunk_scan,
        dict(HEADS, BT=delta.CHUNK, BK=128, BV=32, PRECISION="ieee"),
        dict(ROWS, q_ptr=F32, k_ptr=F32, v_ptr=F32, out_ptr=F32),
        dict(num_warps=8),
        True,
    ),
    "step": (
        delta._step,
        dict(HEADS, BK=128, BV=32),
        dict(ROWS, a_ptr=BF16, b_ptr=BF16, alog_ptr=BF16, dt_ptr=BF16),
        {},
        False,
    ),
    "conv_prefill": (
        conv._conv_prefill,
        dict(TAPS=4, HAS_BIAS=False, SILU=True, BT=conv.BLOCK_T, BC=conv.BLOCK_C),
        dict(
            x_ptr=BF16,
            w_ptr=BF16,
            bias_ptr=BF16,
            state_ptr=BF16,
            slots_ptr=I64,
            qsl_ptr=I32,
            out_ptr=BF16,
        ),
        {},
        False,
    ),
    "conv_update": (
        conv._conv_update,
        dict(TAPS=4, HAS_BIAS=True, SILU=True, BC=conv.BLOCK_C),
        dict(x_ptr=BF16, w_ptr=BF16, bias_ptr=BF16, state_ptr=BF16, slots_ptr=I64, out_ptr=BF16),
        {},
        False,
    ),
    "gated_rms_norm": (
        norm._gated_rms_norm,
        dict(ROWS=norm.ROWS, BLOCK=128),
        dict(x_ptr=BF16, z_ptr=BF16, w_ptr=BF16, out_ptr=BF16, eps="fp32"),
        {},
        False,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_builds_for_sm90(name):
    kernel, constexprs, types, options, may_spill = CASES[name]
    compiled = compile_for_gpu(kernel, constexprs, types, **options)
    usage = resource_usage(compiled)
    assert usage.get("REG", 0) > 0, usage
    assert usage.get("LOCAL", 0) == 0, f"{name} uses local memory: {usage}"
    if not may_spill:
        assert usage.get("STACK", 0) == 0, f"{name} spills to the stack: {usage}"
