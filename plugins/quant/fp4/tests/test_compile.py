"""The FP4 kernels built for Hopper (sm_90) with Triton's compiler on any machine: every
variant the entry points launch lowers without spilling, reads its codes in 16-byte vectors,
moves next to nothing between lanes in the small-batch loop, and the dequantization writes
16-byte vectors. The loop's instructions per weight are recorded against a budget (the e2m1
decoding costs more than the integer codes' exponent-bits trick)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tallow.kernels import (
    compile_for_gpu,
    interpreting,
    resource_usage,
    sass_loops,
    sass_opcode as opcode,
)
from tallow_quant_fp4.kernels.dequant import BLOCK_QUADS, BLOCK_ROWS, _dequant_kernel
from tallow_quant_fp4.kernels.gemv import DEFAULT_CONFIGS, NV_CONFIGS, _gemv_kernel

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )

#: SASS instructions per weight and row of x the small-batch loop (MXFP4) may spend: what it
#: spends now (5.8, 4.0, 3.4; before the paired decoding 10.6, 6.4, 4.7), not yet what batch-1
#: decode at memory speed would need (~3)
BUDGET = {1: 6.2, 2: 4.3, 4: 3.7}


def _aligned(name: str) -> bool:
    return name.endswith("_ptr") or name.startswith("stride") or name == "K"


def gemv(nv: bool, bm: int, bn: int, warps: int = 1, act: str = "*bf16", gate: int = -1):
    constexprs = dict(
        BM=bm,
        BN=bn,
        Q=32 * warps,
        NV=nv,
        PREFETCH=True,
        EVEN_N=True,
        HAS_BIAS=False,
        GATE=gate,
        USE_PDL=True,
    )
    types = {
        "x_ptr": act,
        "q_ptr": "*i32",
        "s_ptr": "*u8",
        "b_ptr": act,
        "y_ptr": act,
        "global_scale": "fp32",
    }
    return compile_for_gpu(
        _gemv_kernel, constexprs, types, aligned=_aligned, num_warps=warps, num_stages=1
    )


@pytest.mark.parametrize("nv", [False, True])
def test_every_variant_compiles_and_keeps_its_registers(nv):
    for bm, bn, warps, _ in sorted(set((NV_CONFIGS if nv else DEFAULT_CONFIGS).values())):
        use = resource_usage(gemv(nv, bm, bn, warps))
        assert use["STACK"] == 0 and use["LOCAL"] == 0, (nv, bm, bn, use)
    assert gemv(nv, 1, 8, gate=0).asm["cubin"]
    for out in ("*bf16", "*fp16", "*fp32"):
        k = compile_for_gpu(
            _dequant_kernel,
            dict(BR=BLOCK_ROWS, BQ=BLOCK_QUADS, NV=nv),
            {"q_ptr": "*i32", "s_ptr": "*u8", "out_ptr": out, "global_scale": "fp32"},
            aligned=_aligned,
            num_warps=4,
        )
        assert re.search(r"st\.global(\.\w+)*\.v4\.b32", k.asm["ptx"]), out


@pytest.mark.parametrize("bm", sorted(BUDGET))
def test_the_small_batch_loop_cost(bm):
    _, bn, warps, _ = DEFAULT_CONFIGS[bm]
    compiled = gemv(False, bm, bn, warps)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", compiled.asm["ptx"])
    profile = Counter(opcode(i) for i in sass_loops(compiled)[0])
    # the scales' layout meets the products' through a few shared-memory or shuffle moves per
    # iteration: a handful against the hundreds of decoding instructions
    moves = profile["SHFL"] + profile["STS"] + profile["LDS"]
    assert moves <= 0.02 * sum(profile.values()), profile
    per = sum(profile.values()) / (bn * 32) / bm
    assert per <= BUDGET[bm], (bm, round(per, 2), profile)


@pytest.mark.parametrize("nv", [False, True])
@pytest.mark.parametrize("warps", [2, 4])
def test_warps_along_k_compile_without_spills(nv, warps):
    use = resource_usage(gemv(nv, 1, 2 if nv else 8, warps))
    assert use["STACK"] == 0 and use["LOCAL"] == 0, (nv, warps, use)


@pytest.mark.parametrize("act", ["*bf16", "*fp16", "*fp32"])
def test_moe_kernels_compile_without_spills(act):
    """The MXFP4 experts' kernels (kernels/moe.py) at the launch parameters of moe_ops: every
    activation, with and without biases, read their bytes in 16-byte vectors."""
    from tallow_quant_fp4.kernels.moe import _dequant_kernel as moe_dequant
    from tallow_quant_fp4.kernels.moe import _down_kernel, _gate_up_kernel
    from tallow_quant_fp4.moe_ops import BLOCK_N, DEQUANT_BLOCK_R, GROUPS

    packed = {
        "w_ptr": "*u8",
        "s_ptr": "*u8",
        "ids_ptr": "*i64",
        "alpha": "fp32",
        "limit": "fp32",
        "topk_w_ptr": "*fp32",
        "used_ptr": "*i32",
    }
    kernels = [
        compile_for_gpu(
            _gate_up_kernel,
            dict(TOP_K=4, ACT=a, HAS_BIAS=b, BLOCK_N=BLOCK_N, GROUPS=GROUPS),
            packed,
            default_pointer=act,
            aligned=_aligned,
            num_warps=4,
        )
        for a in (0, 1)
        for b in (False, True)
    ]
    kernels.append(
        compile_for_gpu(
            _down_kernel,
            dict(TOP_K=4, HAS_BIAS=True, BLOCK_N=BLOCK_N, GROUPS=GROUPS),
            packed,
            default_pointer=act,
            aligned=_aligned,
            num_warps=4,
        )
    )
    kernels.append(
        compile_for_gpu(
            moe_dequant,
            dict(BLOCK_R=DEQUANT_BLOCK_R, GROUPS=GROUPS),
            packed,
            default_pointer=act,
            aligned=_aligned,
            num_warps=4,
        )
    )
    for k in kernels:
        use = resource_usage(k)
        assert use["STACK"] == 0 and use["LOCAL"] == 0, use
    for k in kernels[:-1]:
        assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", k.asm["ptx"]), "no 16-byte loads"
