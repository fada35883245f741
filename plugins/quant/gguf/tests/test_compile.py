"""Compile the plugin's kernels with Triton's real compiler for Hopper (sm_90) and Ampere
(sm_80) on any machine: no GPU is needed to build a cubin. Checks what the interpreter cannot:
every type's kernels type-check and lower with the launch parameters the entry points use; the
one-row GEMV spills no registers, reads its codes in 16-byte vectors, exchanges nothing between
lanes in its loop and spends few instructions per weight (the budget that keeps it at memory
speed on an H200); the tensor-core kernel uses Hopper's wgmma and, with the fp16 decoding, no
conversion instructions on the weights; PDL's wait comes after the first weight tile; the
dequantization has no fused multiply-adds (its values must be ggml's bits), stores only 16-byte
vectors, exchanges nothing through shared memory and spends few instructions per weight."""

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
from tallow_quant_gguf.kernels.decode import type_constants
from tallow_quant_gguf.kernels import dequant
from tallow_quant_gguf.kernels.gemv import _gemv_kernel, gemv_mode
from tallow_quant_gguf.kernels.matmul import _mma_kernel, decode_mode, weights_left
from tallow_quant_gguf.packing import PackedWeight
from tallow_quant_gguf.qtypes import QUANT_TYPES, SCALE_PACKED

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )

TYPES = sorted(QUANT_TYPES)


def _weight(qtype: str) -> PackedWeight:
    return PackedWeight(QUANT_TYPES[qtype], 0, 0, {})


def _pointer_types(qtype: str, act: str, out: str) -> dict[str, str]:
    qt = QUANT_TYPES[qtype]
    return {
        "x_ptr": act,
        "nib_ptr": "*i32",
        "pair_ptr": "*i16",
        "bit_ptr": "*u8",
        "byte_ptr": "*i32",
        "d_ptr": "*fp16",
        "dm_ptr": "*fp16",
        "sc_ptr": "*u8" if qt.scales == SCALE_PACKED else "*i8",
        "mn_ptr": "*i8",
        "lut_ptr": "*fp32",
        "b_ptr": act,
        "y_ptr": out,
        "ws_ptr": "*fp32",
        "cnt_ptr": "*i32",
        "ids_ptr": "*i64",
        "out_ptr": out,
    }


def compile_for(
    kernel: Any,
    constexprs: dict[str, Any],
    pointers: dict[str, str],
    capability: int = 90,
    **options: Any,
) -> Any:
    """Build ``kernel`` for ``sm_<capability>`` as the JIT would for 16-byte-aligned tensors
    whose row strides are multiples of 16 elements (true of llama-3-8b's shapes)."""
    return compile_for_gpu(
        kernel,
        constexprs,
        pointers,
        capability=capability,
        aligned=lambda n: n.endswith("_ptr") or n.startswith(("s_", "stride_")) or n == "K",
        **options,
    )


def gemv(
    qtype: str,
    rows: int = 4,
    warps: int = 1,
    *,
    prefetch: bool = True,
    even: bool = True,
    split: bool = False,
    gate: int = -1,
    pdl: bool = True,
    act: str = "*bf16",
) -> Any:
    p = _weight(qtype)
    constexprs = dict(
        BN=rows,
        Q=32 * warps,
        **type_constants(p),
        MODE=gemv_mode(p),
        PREFETCH=prefetch,
        EVEN=even,
        HAS_BIAS=False,
        SPLIT=split,
        GATE=gate,
        USE_PDL=pdl,
    )
    return compile_for(
        _gemv_kernel, constexprs, _pointer_types(qtype, act, act), num_warps=warps, num_stages=1
    )


def mma(
    qtype: str,
    bm: int = 16,
    bn: int = 64,
    q: int = 8,
    warps: int = 4,
    stages: int = 3,
    *,
    decoding: int = 1,
    even: bool = True,
    split: bool = False,
    gate: int = -1,
    pdl: bool = True,
    act: str = "*bf16",
    capability: int = 90,
) -> Any:
    import torch

    p = _weight(qtype)
    x_dtype = {"*bf16": torch.bfloat16, "*fp16": torch.float16, "*fp32": torch.float32}[act]
    constexprs = dict(
        BM=bm,
        BN=bn,
        Q=q,
        **type_constants(p),
        FAST=decode_mode(p, decoding, x_dtype),
        W_LEFT=weights_left(bm),
        EVEN=even,
        HAS_BIAS=False,
        SPLIT=split,
        GATE=gate,
        DOT_PRECISION="ieee" if act == "*fp32" else "tf32",
        USE_PDL=pdl,
    )
    return compile_for(
        _mma_kernel,
        constexprs,
        _pointer_types(qtype, act, act),
        capability,
        num_warps=warps,
        num_stages=stages,
    )


def loop_profile(compiled: Any) -> Counter:
    """Opcode counts of the kernel's main loop."""
    return Counter(opcode(i) for i in sass_loops(compiled)[0])


@pytest.mark.parametrize("qtype", TYPES)
def test_every_type_compiles_for_decode_batches(qtype):
    assert gemv(qtype).asm["cubin"], qtype
    assert gemv(qtype, even=False, split=True).asm["cubin"], qtype
    assert mma(qtype, decoding=0).asm["cubin"], qtype


#: the most SASS instructions per weight the one-row loop may spend: at about 60% of the
#: H200's issue rate, 4.6 for Q4_K is ~2.8 TB/s of weights, 5.5 for Q8_0 is memory speed
GEMV_BUDGET = {"Q4_K": 4.6, "Q4_0": 4.6, "Q8_0": 5.5, "Q6_K": 8.5, "Q5_0": 8.0}


@pytest.mark.parametrize("qtype", sorted(GEMV_BUDGET))
def test_gemv_spends_few_instructions_per_weight(qtype):
    compiled = gemv(qtype)
    use = resource_usage(compiled)
    assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{qtype} GEMV spills registers: {use}"
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", compiled.asm["ptx"]), (
        f"{qtype}: codes not read as 16-byte vectors"
    )
    profile = loop_profile(compiled)
    # no exchange between lanes: every plane and the activations share the codes' layout
    assert not {"BAR", "SHFL", "STS", "LDS"} & set(profile), (qtype, profile)
    weights = 4 * 32 * (16 if QUANT_TYPES[qtype].byte else 32) // 32  # per thread and step
    per_weight = sum(profile.values()) / weights
    assert per_weight <= GEMV_BUDGET[qtype], (qtype, round(per_weight, 2), profile)


def test_gemv_prefetches_its_first_tile_before_the_pdl_wait():
    loads, stores = pdl_order(gemv("Q4_K").asm["ptx"])
    assert loads > 0, "no weight load before the wait"
    assert stores == 0, "a store before the wait"
    assert "griddepcontrol" not in gemv("Q4_K", pdl=False).asm["ptx"]


def test_split_gemv_counts_its_tiles_with_one_atomic_per_program():
    ptx = gemv("Q4_K", split=True).asm["ptx"]
    assert len(re.findall(r"\batom\.[\w.]*add", ptx)) == 1, "one counter increment"
    assert re.search(r"\batom\.[\w.]*exch", ptx), "the last program resets the counter"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_0", "Q8_0"])
def test_tensor_core_kernel_decodes_without_conversions(qtype):
    for decoding in (1, 2):
        compiled = mma(qtype, decoding=decoding)
        assert "wgmma" in compiled.asm["ptx"], qtype
        assert resource_usage(compiled)["STACK"] == 0, qtype
        profile = loop_profile(compiled)
        # the weights come from bit operations: no int-to-float conversion per value
        assert profile["I2F"] + profile["I2FP"] <= 32, (qtype, decoding, profile)
        if decoding == 1:  # fp16 pairs: two values per instruction
            assert profile["HFMA2"] + profile["HMUL2"] + profile["HADD2"] >= 32, profile


def test_tensor_core_variants_compile():
    for qtype in ("Q4_K", "Q8_0", "Q6_K"):  # the large-batch tiles: Hopper's wgmma
        compiled = mma(qtype, 128, 128, 4, 8, 3, decoding=2 if qtype != "Q6_K" else 0)
        assert "wgmma" in compiled.asm["ptx"], qtype
        assert resource_usage(compiled)["STACK"] == 0, qtype
    assert mma("Q4_K", 64, 64, 8, 4, 3, split=True).asm["cubin"]
    assert mma("Q5_K", gate=1, act="*fp16", decoding=0).asm["cubin"]
    assert mma("Q4_0", act="*fp32").asm["cubin"]
    # Ampere: mma.sync, no PDL (its launches never ask for it below compute capability 9.0)
    assert "mma.sync" in mma("Q8_0", 64, 64, 8, 4, 2, pdl=False, capability=80).asm["ptx"]


def dequantize_kernel(
    qtype: str, out: str = "*bf16", *, gather: bool = False, even: bool = True
) -> Any:
    p = _weight(qtype)
    constexprs = dict(
        GATHER=gather,
        BN=dequant.BLOCK_ROWS,
        C=dequant.BLOCK_CHUNKS,
        EVEN=even,
        BITS=dequant.bits_mode(p),
        PTX=True,
        **type_constants(p),
    )
    return compile_for(
        dequant._dequant_kernel,
        constexprs,
        _pointer_types(qtype, out, out),
        num_warps=dequant.WARPS,
        enable_fp_fusion=False,
    )


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_compiles_without_fused_multiply_adds(qtype):
    variants = (
        (("*fp32", False, True), ("*bf16", True, False), ("*fp16", False, False))
        if qtype == "Q4_K"
        else (("*fp32", False, True), ("*bf16", False, False))
    )
    for out, gather, even in variants:
        compiled = dequantize_kernel(qtype, out, gather=gather, even=even)
        assert not re.search(r"\bfma\.", compiled.asm["ptx"]), f"{qtype}: fused multiply-add"
        assert resource_usage(compiled)["STACK"] == 0


#: the most SASS instructions per weight the workspace loop may spend (bf16 out, whole tiles):
#: at ~60% of the H200's issue rate, 11 per weight decode gate_up (117M weights) in ~55 us,
#: below the ~90 us its 300 MB of reads and writes take
DEQUANT_BUDGET = {"Q4_K": 10.5, "Q4_0": 9.5, "Q8_0": 8.0, "Q6_K": 13.5, "Q5_K": 16.0}


@pytest.mark.parametrize("qtype", sorted(DEQUANT_BUDGET))
def test_dequantize_writes_whole_vectors_with_few_instructions(qtype):
    compiled = dequantize_kernel(qtype)
    ptx = compiled.asm["ptx"]
    # every store a 16-byte vector: a warp writes 512 contiguous bytes, whole sectors
    stores = re.findall(r"\bst\.global(?:\.\w+)*", ptx)
    assert stores and all(s.endswith(".v4.b32") for s in stores), (qtype, set(stores))
    assert resource_usage(compiled)["LOCAL"] == 0
    profile = loop_profile(compiled)
    # the pieces are joined in registers: nothing crosses lanes or goes through shared memory
    assert not {"BAR", "SHFL", "STS", "LDS"} & set(profile), (qtype, profile)
    weights = dequant.BLOCK_ROWS * dequant.BLOCK_CHUNKS * 32 // (32 * dequant.WARPS)
    per_weight = sum(profile.values()) / weights
    assert per_weight <= DEQUANT_BUDGET[qtype], (qtype, round(per_weight, 2), profile)
    if dequant.bits_mode(_weight(qtype)):  # codes become floats without conversions
        assert profile["I2F"] + profile["I2FP"] <= 8, (qtype, profile)  # the sub-scales only


def moe_kernel(
    qtype: str,
    down: bool = False,
    rows: int = 4,
    warps: int = 1,
    *,
    prefetch: bool = True,
    even: bool = True,
    swiglu: bool = True,
    act: str = "*bf16",
) -> Any:
    from tallow_quant_gguf.kernels.moe import _moe_down_kernel, _moe_up_kernel

    p = _weight(qtype)
    constexprs = dict(
        BN=rows, Q=32 * warps, **type_constants(p), MODE=gemv_mode(p), PREFETCH=prefetch, EVEN=even
    )
    if not down:
        constexprs["SWIGLU"] = swiglu
    pointers = {**_pointer_types(qtype, act, act), "w_ptr": "*fp32"}
    return compile_for(
        _moe_down_kernel if down else _moe_up_kernel,
        constexprs,
        pointers,
        num_warps=warps,
        num_stages=1,
    )


@pytest.mark.parametrize("qtype", TYPES)
def test_every_type_compiles_the_expert_kernels(qtype):
    assert moe_kernel(qtype).asm["cubin"], qtype
    assert moe_kernel(qtype, swiglu=False, even=False, prefetch=False).asm["cubin"], qtype
    assert moe_kernel(qtype, down=True).asm["cubin"], qtype
    assert moe_kernel(qtype, down=True, even=False, act="*fp32").asm["cubin"], qtype


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_expert_kernels_stream_like_the_gemv(qtype):
    """The experts' loop is the GEMV's: no spills, 16-byte code loads, nothing exchanged
    between lanes, and the GEMV's instruction budget per weight in the gate/up kernel (whose
    programs take twice the rows: gate and up side by side)."""
    for compiled in (moe_kernel(qtype), moe_kernel(qtype, down=True)):
        use = resource_usage(compiled)
        assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{qtype} expert kernel spills: {use}"
        assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", compiled.asm["ptx"]), qtype
    profile = loop_profile(moe_kernel(qtype))
    assert not {"BAR", "SHFL", "STS", "LDS"} & set(profile), (qtype, profile)
    weights = 2 * 4 * 32 * (16 if QUANT_TYPES[qtype].byte else 32) // 32
    per_weight = sum(profile.values()) / weights
    assert per_weight <= GEMV_BUDGET[qtype], (qtype, round(per_weight, 2), profile)
