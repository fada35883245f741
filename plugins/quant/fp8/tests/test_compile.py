"""Compile the plugin's kernels with Triton's real compiler for Hopper (sm_90) and Ada (sm_89)
on any machine: no GPU is needed to build a cubin. Checks what the interpreter cannot: every
kernel type-checks and lowers with the launch parameters its entry point uses, spills no
registers, reads its weights in 16-byte vectors; the W8A8 GEMM multiplies e4m3 on the tensor
cores (Hopper's wgmma, Ada's mma) and the weights-only GEMM widens them first; the one-row GEMV
requests its first weight tile before PDL's wait and stores nothing before it."""

from __future__ import annotations

import re
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

if interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )

from tallow.kernels._gemv_triton import _gemv_kernel
from tallow_quant_fp8.kernels.gemm import A_FLOAT, A_GROUP, A_ROW, _gemm_kernel, gemm_config
from tallow_quant_fp8.kernels.gemv import gemv_config
from tallow_quant_fp8.kernels.quantize import _CHUNK, _quantize_kernel

ACT = "*bf16"


def compile_for(
    kernel: Any,
    constexprs: dict[str, Any],
    pointers: dict[str, str],
    capability: int = 90,
    **options: Any,
) -> Any:
    """Build ``kernel`` for ``sm_<capability>`` as the JIT would for 16-byte-aligned tensors
    whose row strides and K are multiples of 16 (true of llama-3-8b's shapes)."""
    return compile_for_gpu(
        kernel,
        constexprs,
        pointers,
        capability=capability,
        aligned=lambda n: n.endswith("_ptr") or n.startswith("stride_") or n in ("K", "N"),
        **options,
    )


def no_spills(compiled: Any, what: str) -> None:
    use = resource_usage(compiled)
    assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{what} spills registers: {use}"


def gemv(
    m: int = 1,
    blockwise: bool = False,
    gate: int = -1,
    pdl: bool = True,
    act: str = ACT,
    n: int = 4096,
    k: int = 4096,
    capability: int = 90,
) -> Any:
    """The core GEMV as it reads e4m3 weights (scales per row, or per 128 x 128 block)."""
    block_m, block_n, block_k, warps = gemv_config(m, n, k, blockwise)
    constexprs = dict(
        HAS_BIAS=False,
        SCALES=2 if blockwise else 1,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        VEC=16,
        EVEN_K=True,
        EVEN_N=True,
        GATE=gate,
        DOT_PRECISION="ieee" if act == "*fp32" else "tf32",
        USE_PDL=pdl,
    )
    pointers = {"x_ptr": act, "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "b_ptr": act, "y_ptr": act}
    return compile_for(
        _gemv_kernel, constexprs, pointers, capability, num_warps=warps, launch_pdl=pdl
    )


def gemm(mode: int, blockwise: bool, m: int = 4096, act: str = ACT, capability: int = 90) -> Any:
    block_m, block_n, block_k, warps, stages = gemm_config(
        m, mode != A_FLOAT, blockwise or mode == A_GROUP
    )
    constexprs = dict(
        A_SCALES=mode,
        BLOCKWISE=blockwise,
        HAS_BIAS=True,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        EVEN_K=True,
        DOT_PRECISION="tf32",
    )
    pointers = {
        "a_ptr": "*fp8e4nv" if mode != A_FLOAT else act,
        "sa_ptr": "*fp32",
        "w_ptr": "*fp8e4nv",
        "sw_ptr": "*fp32",
        "b_ptr": act,
        "y_ptr": act,
    }
    return compile_for(
        _gemm_kernel, constexprs, pointers, capability, num_warps=warps, num_stages=stages
    )


def quantize(group: int, static: bool = False, gate: int = -1, act: str = ACT) -> Any:
    constexprs = dict(GROUP=group, CHUNK=_CHUNK, STATIC=static, GATE=gate, MIN_S=1e-12)
    pointers = {"x_ptr": act, "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "static_ptr": "*fp32"}
    return compile_for(_quantize_kernel, constexprs, pointers, num_warps=4)


@pytest.mark.parametrize("blockwise", [False, True])
def test_one_row_gemv_compiles_streams_and_prefetches(blockwise):
    compiled = gemv(blockwise=blockwise)
    no_spills(compiled, "one-row GEMV")
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", compiled.asm["ptx"]), (
        "weights not read as 16-byte vectors"
    )
    loads, stores = pdl_order(compiled.asm["ptx"])
    assert loads > 0, "no weight load before the PDL wait"
    assert stores == 0, "a store before the PDL wait"
    assert "griddepcontrol" not in gemv(blockwise=blockwise, pdl=False).asm["ptx"]


#: the most SASS instructions per weight the one-row loop may spend. The floor is 2.5 (an
#: e4m3 pair widened to fp16 by one F2FP, each half to float32 by one HADD2, one FFMA); the
#: default tile (four rows on eight warps: two 16-byte loads a thread per step) spends the
#: loop's fixed cost over fewer weights than a 16 KB tile did (3.6 / 4.0), and still decoded
#: llama-3-8b 13 % faster on an H200 (more programs, more loads in flight per SM)
GEMV_BUDGET = {False: 4.0, True: 4.25}
#: the most registers of the one-row GEMV: at 80, six programs of 4 warps fit on an SM
GEMV_MAX_REGISTERS = 80


@pytest.mark.parametrize("blockwise", [False, True])
def test_one_row_gemv_spends_few_instructions_per_weight(blockwise):
    compiled = gemv(blockwise=blockwise)
    loop = [opcode(i) for i in sass_loops(compiled)[0]]
    _, block_n, block_k, warps = gemv_config(1, 4096, 4096, blockwise)
    per_thread = block_n * block_k // (32 * warps)
    per_weight = len(loop) / per_thread
    assert per_weight <= GEMV_BUDGET[blockwise], (round(per_weight, 2), sorted(set(loop)))
    # x is read once per tile and shared by the tile's rows through one exchange
    assert loop.count("BAR") <= 2, loop.count("BAR")


@pytest.mark.parametrize("blockwise", [False, True])
def test_one_row_gemv_keeps_8kb_in_flight_per_program_in_few_registers(blockwise):
    """The bandwidth of a GEMV is the bytes in flight per SM: each program requests an 8 KB
    weight tile per step (2 16-byte loads a thread on eight warps) and holds one accumulator
    per 16 weights, so its registers stay low and many programs share an SM."""
    compiled = gemv(blockwise=blockwise)
    _, block_n, block_k, warps = gemv_config(1, 4096, 4096, blockwise)
    assert block_n * block_k == 8192 and warps == 8
    loop = sass_loops(compiled)[0]
    wide_loads = sum(1 for i in loop if opcode(i) == "LDG" and ".128" in i)
    assert wide_loads >= block_n * block_k // (32 * warps * 16), loop
    regs = resource_usage(compiled)["REG"]
    assert regs <= GEMV_MAX_REGISTERS, regs


def test_gemv_variants_compile():
    for blockwise in (False, True):
        compiled = gemv(m=16, blockwise=blockwise)
        no_spills(compiled, "16-row GEMV")
        # several rows wait before reading anything (tl.dot's loop runs behind the wait)
        assert pdl_order(compiled.asm["ptx"]) == (0, 0)
        assert gemv(gate=0, blockwise=blockwise).asm["cubin"]
        assert gemv(m=8, gate=1, blockwise=blockwise, act="*fp16").asm["cubin"]
    assert gemv(act="*fp32", pdl=False).asm["cubin"]
    assert gemv(m=4, act="*fp32", pdl=False).asm["cubin"]
    assert gemv(capability=89, pdl=False, blockwise=True).asm["cubin"]


@pytest.mark.parametrize("mode,blockwise", [(A_ROW, False), (A_GROUP, True)])
def test_w8a8_gemm_multiplies_e4m3_on_the_tensor_cores(mode, blockwise):
    for m in (64, 4096):
        compiled = gemm(mode, blockwise, m)
        no_spills(compiled, f"W8A8 GEMM ({m} rows)")
        ptx = compiled.asm["ptx"]
        assert re.search(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx), "no e4m3 wgmma"
    ada = gemm(mode, blockwise, 4096, capability=89).asm["ptx"]
    assert re.search(r"mma\.sync\S*\.e4m3\.e4m3", ada), "no e4m3 mma on sm_89"


@pytest.mark.parametrize("blockwise", [False, True])
def test_weights_only_gemm_widens_the_weights_for_bf16_tensor_cores(blockwise):
    compiled = gemm(A_FLOAT, blockwise)
    no_spills(compiled, "weights-only GEMM")
    assert re.search(r"wgmma\.mma_async\S*\.bf16\.bf16", compiled.asm["ptx"])
    assert gemm(A_FLOAT, blockwise, act="*fp16").asm["cubin"]


def test_quantization_kernels_compile():
    for group in (0, 128):
        for static in (False, True):
            compiled = quantize(group, static)
            no_spills(compiled, f"quantize group={group} static={static}")
            # IEEE division: the reference's bits
            assert re.search(r"div\.rn\.f32", compiled.asm["ptx"]), "no IEEE division"
        assert quantize(group, gate=0).asm["cubin"]
        assert quantize(group, gate=1, act="*fp16").asm["cubin"]
