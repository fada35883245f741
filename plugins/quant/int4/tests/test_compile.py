"""Compile the plugin's kernels with Triton's real compiler for Hopper (sm_90) on any machine:
no GPU is needed to build a cubin. Checks what the interpreter cannot: every variant the
entry points launch type-checks and lowers, spills no registers and reads its codes in 16-byte
vectors; the small-batch kernel exchanges nothing between lanes in its loop and stays within
its budget of instructions per weight (what keeps batch-1 decode near memory speed); PDL's
wait comes after the first weight tile; the dequantization writes 16-byte vectors."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from tallow.kernels import (
    compile_for_gpu,
    interpreting,
    pdl_order,
    resource_usage,
    sass_loops,
    sass_opcode as opcode,
)
from tallow_quant_int4.kernels.dequant import BLOCK_QUADS, BLOCK_ROWS, _dequant_kernel
from tallow_quant_int4.kernels.gemv import DEFAULT_CONFIGS, _gemv_kernel

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )


def _aligned(name: str) -> bool:
    return name.endswith("_ptr") or name.startswith("stride") or name == "K"


def gemv(
    bits: int = 4,
    bm: int = 1,
    bn: int = 8,
    warps: int = 1,
    *,
    zeros: bool = False,
    prefetch: bool = True,
    even: bool = True,
    gate: int = -1,
    pdl: bool = True,
    bias: bool = False,
    act: str = "*bf16",
    scales: str = "*fp16",
    capability: int = 90,
) -> Any:
    constexprs = dict(
        BM=bm,
        BN=bn,
        Q=32 * warps,
        BITS=bits,
        GROUP=128,
        ZEROS=zeros,
        PREFETCH=prefetch,
        EVEN_N=even,
        HAS_BIAS=bias,
        GATE=gate,
        USE_PDL=pdl,
    )
    types = {
        "x_ptr": act,
        "q_ptr": "*i32",
        "s_ptr": scales,
        "z_ptr": "*u8",
        "b_ptr": act,
        "y_ptr": act,
    }
    return compile_for_gpu(
        _gemv_kernel,
        constexprs,
        types,
        capability=capability,
        aligned=_aligned,
        num_warps=warps,
        num_stages=1,
    )


def dequant(bits: int = 4, *, zeros: bool = False, gather: bool = False, out: str = "*bf16") -> Any:
    constexprs = dict(
        BR=BLOCK_ROWS, BQ=BLOCK_QUADS, BITS=bits, GROUP=128, ZEROS=zeros, GATHER=gather
    )
    types = {"q_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "ids_ptr": "*i64", "out_ptr": out}
    return compile_for_gpu(_dequant_kernel, constexprs, types, aligned=_aligned, num_warps=4)


def loop_profile(compiled: Any) -> Counter:
    """Opcode counts of the kernel's main loop."""
    return Counter(opcode(i) for i in sass_loops(compiled)[0])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zeros", [False, True])
def test_every_variant_compiles(bits, zeros):
    for bm, bn, warps, prefetch in sorted(set(DEFAULT_CONFIGS.values())):
        for act in ("*bf16", "*fp16", "*fp32"):
            k = gemv(bits, bm, bn, warps, zeros=zeros, prefetch=prefetch, act=act)
            use = resource_usage(k)
            if act != "*fp32":  # float32 activations (a float32 model on a GPU) may spill
                assert use["STACK"] == 0 and use["LOCAL"] == 0, (bits, bm, bn, act, use)
    assert gemv(bits, even=False, gate=0, bias=True, scales="*bf16").asm["cubin"]
    assert gemv(bits, gate=1, pdl=False, scales="*fp32", capability=80).asm["cubin"]
    for out in ("*bf16", "*fp16", "*fp32"):
        assert dequant(bits, zeros=zeros, out=out).asm["cubin"]
    assert dequant(bits, gather=True).asm["cubin"]


#: the most SASS instructions per weight and row of x the small-batch loop may spend (counted:
#: 3.5 at one row with 8 weight rows per program, ~3.0-3.3 per row of x from two rows on)
BUDGET = {(4, 1): 3.7, (4, 2): 3.3, (4, 4): 3.5, (8, 1): 6.0}


@pytest.mark.parametrize("bits,bm", sorted(BUDGET))
def test_the_small_batch_loop_spends_few_instructions_per_weight(bits, bm):
    bm_, bn, warps, prefetch = DEFAULT_CONFIGS[bm]
    compiled = gemv(bits, bm_, bn, warps, prefetch=prefetch)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", compiled.asm["ptx"]), (
        "codes not read as 16-byte vectors"
    )
    profile = loop_profile(compiled)
    # no exchange between lanes: the activations and the codes share one layout
    assert not {"BAR", "SHFL", "STS", "LDS"} & set(profile), profile
    weights = bn * 4 * 32 // bits  # per thread and iteration
    per_weight_row = sum(profile.values()) / weights / bm_
    assert per_weight_row <= BUDGET[(bits, bm)], (bits, bm, round(per_weight_row, 2), profile)


def test_the_gemv_prefetches_its_first_tile_before_the_pdl_wait():
    loads, stores = pdl_order(gemv().asm["ptx"])
    assert loads > 0 and stores == 0


def test_the_dequantization_writes_16_byte_vectors():
    ptx = dequant().asm["ptx"]
    assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx), "workspace not written in 16 bytes"
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx), "codes not read in 16 bytes"


@pytest.mark.parametrize("warps", [2, 4, 8])
def test_warps_along_k_exchange_nothing_in_the_loop(warps):
    """The widened launches (:func:`tallow.kernels.quad_gemv.launch_config`): the warps share
    the work along K and meet only after the loop; no spills."""
    compiled = gemv(4, 1, 8, warps, zeros=True)
    use = resource_usage(compiled)
    assert use["STACK"] == 0 and use["LOCAL"] == 0, use
    profile = loop_profile(compiled)
    assert not {"BAR", "SHFL", "STS", "LDS"} & set(profile), profile
    assert sum(profile.values()) / (8 * 32) <= BUDGET[(4, 1)] + 0.2, profile
