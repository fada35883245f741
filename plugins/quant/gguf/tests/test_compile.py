"""Compile the plugin's kernels with Triton's real compiler for Hopper (sm_90) and Ampere
(sm_80) on any machine: no GPU is needed to build a cubin. Checks what the interpreter cannot:
every type's kernels type-check and lower with the launch parameters the entry points use;
the decode-path configurations spill no registers and read their codes in vector loads; the
GEMM uses tensor cores; PDL's wait comes after the first weight tile; the dequantization has
no fused multiply-adds (its values must be ggml's bits)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tallow.kernels._dispatch import interpreting
from tallow.kernels.offline import compile_for_gpu, pdl_order, resource_usage
from tallow_quant_gguf.kernels.dequant import BLOCK_HALVES, BLOCK_ROWS, _dequant_kernel
from tallow_quant_gguf.kernels.matmul import _qmatmul_kernel, matmul_config
from tallow_quant_gguf.packing import PackedWeight
from tallow_quant_gguf.qtypes import QUANT_TYPES, SCALE_PACKED

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip("TRITON_INTERPRET=1 replaces compiled kernels with the interpreter",
                allow_module_level=True)

TYPES = sorted(QUANT_TYPES)


def _constants(qtype: str) -> dict[str, Any]:
    from tallow_quant_gguf.kernels.decode import type_constants

    return type_constants(PackedWeight(QUANT_TYPES[qtype], 0, 0, {}))


def _pointer_types(qtype: str, act: str, out: str) -> dict[str, str]:
    qt = QUANT_TYPES[qtype]
    return {"x_ptr": act, "nib_ptr": "*u8", "pair_ptr": "*i32", "bit_ptr": "*i32",
            "byte_ptr": "*i8", "d_ptr": "*fp16", "dm_ptr": "*fp16",
            "sc_ptr": "*u8" if qt.scales == SCALE_PACKED else "*i8", "mn_ptr": "*i8",
            "lut_ptr": "*fp32", "b_ptr": act, "y_ptr": out, "ids_ptr": "*i64", "out_ptr": out}


def compile_for(kernel: Any, constexprs: dict[str, Any], pointers: dict[str, str],
                capability: int = 90, **options: Any) -> Any:
    """Build ``kernel`` for ``sm_<capability>`` as the JIT would for 16-byte-aligned tensors
    whose row strides are multiples of 16 elements (true of llama-3-8b's shapes)."""
    return compile_for_gpu(
        kernel, constexprs, pointers, capability=capability,
        aligned=lambda n: n.endswith("_ptr") or n.startswith(("s_", "stride_")) or n == "K",
        **options)


def matmul(qtype: str, m: int, *, k: int = 4096, act: str = "*bf16", partial: bool = False,
           gate: int = -1, pdl: bool = True, capability: int = 90) -> Any:
    bm, bn, h, warps, stages = matmul_config(m, 4096, k)
    constexprs = dict(BM=bm, BN=bn, H=h, **_constants(qtype), HAS_BIAS=False, PARTIAL=partial,
                      GATE=gate, DOT_PRECISION="tf32", USE_PDL=pdl)
    pointers = _pointer_types(qtype, act, "*fp32" if partial else act)
    return compile_for(_qmatmul_kernel, constexprs, pointers, capability, num_warps=warps,
                       num_stages=stages)


@pytest.mark.parametrize("qtype", TYPES)
def test_every_type_compiles_for_decode_batches(qtype):
    for m in (1, 8):
        assert matmul(qtype, m).asm["cubin"], (qtype, m)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "Q5_0"])
def test_decode_gemv_spills_nothing_and_loads_vectors(qtype):
    compiled = matmul(qtype, 1)
    use = resource_usage(compiled)
    assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{qtype} GEMV spills registers: {use}"
    ptx = compiled.asm["ptx"]
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx), f"{qtype}: codes not read as vectors"


def test_pdl_waits_after_the_first_weight_tile():
    loads, stores = pdl_order(matmul("Q4_K", 1).asm["ptx"])
    assert loads > 0, "no weight load before the wait"
    assert stores == 0, "a store before the wait"
    assert "griddepcontrol" not in matmul("Q4_K", 1, pdl=False).asm["ptx"]


def test_batched_products_use_tensor_cores():
    assert "mma.sync" in matmul("Q4_K", 8).asm["ptx"]
    for qtype in ("Q4_K", "Q8_0", "Q6_K"):  # the large-batch GEMM: Hopper's wgmma
        compiled = matmul(qtype, 256)
        assert "wgmma" in compiled.asm["ptx"], qtype
        assert resource_usage(compiled)["STACK"] == 0, qtype
    # Ampere: no PDL (its launches never ask for it below compute capability 9.0)
    assert "mma" in matmul("Q8_0", 256, capability=80, pdl=False).asm["ptx"]


def test_split_k_gate_and_float32_variants_compile():
    assert matmul("Q4_K", 8, partial=True).asm["cubin"]
    assert matmul("Q6_K", 1, gate=0).asm["cubin"]
    assert matmul("Q5_K", 4, gate=1, act="*fp16").asm["cubin"]
    assert matmul("Q4_0", 1, act="*fp32").asm["cubin"]


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_compiles_without_fused_multiply_adds(qtype):
    variants = (("*fp32", False), ("*bf16", True)) if qtype == "Q4_K" else (("*fp32", False),)
    for out, gather in variants:
        constexprs = dict(GATHER=gather, BN=BLOCK_ROWS, H=BLOCK_HALVES, **_constants(qtype))
        compiled = compile_for(_dequant_kernel, constexprs, _pointer_types(qtype, out, out),
                               num_warps=4, enable_fp_fusion=False)
        assert not re.search(r"\bfma\.", compiled.asm["ptx"]), f"{qtype}: fused multiply-add"
        assert resource_usage(compiled)["STACK"] == 0
