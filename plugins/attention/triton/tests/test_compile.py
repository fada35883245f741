"""Compile the kernels with Triton's real compiler for Ampere (sm_80) and Hopper (sm_90), on
any machine: no GPU is needed to build a cubin. Checks what the interpreter cannot: that the
kernels type-check and lower for real hardware with the launch parameters :mod:`ops` uses, that
their loads are vectorised and pipelined, that Hopper gets its wgmma tensor-core products, and
that the 16-bit configurations (the speed path) spill no registers.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import pytest
import torch

from tallow.kernels import compile_for_gpu, resource_usage
from tallow_attention_triton import ops
from tallow_attention_triton.kernels.decode import decode_reduce_kernel, decode_split_kernel
from tallow_attention_triton.kernels.prefill import prefill_kernel
from tallow_attention_triton.kernels.store import store_kv_kernel

if ops.interpreting():  # pragma: no cover - the interpreter replaces triton.jit
    pytest.skip(
        "TRITON_INTERPRET=1 replaces compiled kernels with the interpreter", allow_module_level=True
    )

INT_POINTERS = {
    "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "qsl_ptr": "*i32",
    "slot_ptr": "*i64",
}
F32_POINTERS = {
    "part_acc_ptr",
    "part_ml_ptr",
    "sinks_ptr",
    "k_scale_ptr",
    "v_scale_ptr",
    "k_offset_ptr",
}
F32_SCALARS = {"qk_scale", "softcap"}
TT = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


CACHE_POINTERS = {"k_cache_ptr", "v_cache_ptr"}
#: the turbo format's tensors (kernels/turbo.py); in the cast kernels the scale pointers are
#: unused
TURBO_POINTERS = {
    "k_codes_ptr": "*u8",
    "v_codes_ptr": "*u8",
    "k_scales_ptr": "*fp16",
    "v_scales_ptr": "*fp16",
    "k_offset_ptr": "*fp32",
    "k_smooth_ptr": "*fp32",
    "v_offset_ptr": "*fp32",
    "rot_ptr": "*fp32",
}


def compile_for(
    kernel: Any, spec: dict[str, Any], dtype: torch.dtype, capability: int, cache: str | None = None
) -> Any:
    """Build ``kernel`` for ``sm_<capability>`` as the JIT would for 16-byte-aligned tensors
    whose strides are multiples of 16 elements (true of every supported head size); ``cache``
    is the Triton pointer type of the KV cache when it is not ``dtype``'s."""
    spec = dict(spec)
    options = {"num_warps": spec.pop("num_warps"), "num_stages": spec.pop("num_stages", 3)}
    types: dict[str, str] = {}
    for name in kernel.arg_names:
        if name in INT_POINTERS:
            types[name] = INT_POINTERS[name]
        elif name in F32_POINTERS:
            types[name] = "*fp32"
        elif cache and name in CACHE_POINTERS:
            types[name] = cache
        elif name in TURBO_POINTERS:
            types[name] = TURBO_POINTERS[name]
        elif name in F32_SCALARS:
            types[name] = "fp32"
    return compile_for_gpu(
        kernel,
        spec,
        types,
        capability=capability,
        default_pointer=TT[dtype],
        aligned=lambda n: n.endswith("_ptr") or (n.startswith("stride_") and n != "stride_bt"),
        **options,
    )


def assert_fast(compiled: Any, what: str, *, tensor_op: str) -> None:
    use = resource_usage(compiled)
    assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{what} spills registers: {use}"
    ptx = compiled.asm["ptx"]
    assert re.search(r"ld\.global(\.\w+)*\.v[248]", ptx) or "cp.async" in ptx, (
        f"{what}: no vectorised or asynchronous global loads"
    )
    assert tensor_op in ptx, f"{what}: no {tensor_op} tensor-core instructions"


@pytest.mark.parametrize("head_dim", [64, 80, 128, 256, 512])
def test_prefill_compiles_for_hopper_without_spills(head_dim: int) -> None:
    spec = ops.prefill_spec(
        head_dim=head_dim,
        group=4,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        skip_single_query=True,
    )
    compiled = compile_for(prefill_kernel, spec, torch.bfloat16, 90)
    # a 512-wide head's 64-row wgmma accumulator would take 256 registers a thread: its
    # 32-row blocks take mma.sync
    op = "wgmma.mma_async" if head_dim <= 256 else "mma.sync"
    assert_fast(compiled, f"prefill D={head_dim}", tensor_op=op)


@pytest.mark.parametrize(("capability", "head_dim"), [(80, 32), (90, 32), (90, 64)])
def test_bidirectional_prefill_compiles_without_spills(capability: int, head_dim: int) -> None:
    """The encoder variant (causal=False), at BERT-family head sizes (all-MiniLM-L6-v2: 32)."""
    spec = ops.prefill_spec(
        head_dim=head_dim,
        group=1,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        skip_single_query=True,
        capability=capability,
        causal=False,
    )
    compiled = compile_for(prefill_kernel, spec, torch.bfloat16, capability)
    assert_fast(
        compiled,
        f"bidirectional prefill D={head_dim} sm_{capability}",
        tensor_op="wgmma.mma_async" if capability == 90 else "mma",
    )
    # one-token inputs beside them go to the decode kernel
    spec = ops.decode_spec(
        num_heads=12,
        group=1,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=True,
        single_split=True,
        fused_store=False,
    )
    assert_fast(
        compile_for(decode_split_kernel, spec, torch.bfloat16, capability),
        f"decode D={head_dim} sm_{capability}",
        tensor_op="mma.sync",
    )


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256, 512])
def test_decode_compiles_for_hopper_without_spills(head_dim: int) -> None:
    spec = ops.decode_spec(
        num_heads=32,
        group=4,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=False,
        single_split=False,
        fused_store=True,
    )
    compiled = compile_for(decode_split_kernel, spec, torch.bfloat16, 90)
    assert_fast(compiled, f"decode D={head_dim}", tensor_op="mma.sync")


@pytest.mark.parametrize(
    ("capability", "head_dim"), [(80, 128), (90, 64), (90, 128), (90, 256), (80, 512), (90, 512)]
)
def test_window_softcap_variants_compile_without_spills(capability: int, head_dim: int) -> None:
    spec = ops.prefill_spec(
        head_dim=head_dim,
        group=8,
        dtype=torch.float16,
        block_size=32,
        sliding_window=512,
        logit_softcap=30.0,
        skip_single_query=False,
        capability=capability,
    )
    assert_fast(
        compile_for(prefill_kernel, spec, torch.float16, capability),
        f"prefill window+softcap D={head_dim} sm_{capability}",
        tensor_op="mma",
    )
    spec = ops.decode_spec(
        num_heads=16,
        group=8,
        head_dim=head_dim,
        dtype=torch.float16,
        block_size=32,
        sliding_window=512,
        logit_softcap=30.0,
        mixed=True,
        single_split=True,
        fused_store=False,
    )
    assert_fast(
        compile_for(decode_split_kernel, spec, torch.float16, capability),
        f"decode window+softcap D={head_dim} sm_{capability}",
        tensor_op="mma.sync",
    )


@pytest.mark.parametrize("cache", ["*fp8e4nv", "*fp8e5"])
def test_fp8_cache_variants_compile_for_hopper_without_spills(cache: str) -> None:
    """The 8-bit float cache paths, with the parameters ops uses for them (``cache_bytes`` 1:
    fp16 tile products, V widened in registers, one-warp decode programs), build for sm_90 with the clamp before the
    cast where a kernel stores (store kernel, decode with the store fused) and with fp16
    tensor-core products on the widened tiles."""
    limit = 448.0 if cache == "*fp8e4nv" else 57344.0
    # The clamp's bound as a PTX literal: product_operand's fp16-range clamp of q also emits
    # min.f32, so the store's clamp is told apart by its constant.
    bound = "0f%08X" % struct.unpack(">I", struct.pack(">f", limit))[0]
    decode = dict(
        num_heads=32,
        group=4,
        head_dim=128,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=False,
        single_split=False,
    )
    for fused in (True, False):
        spec = ops.decode_spec(**decode, fused_store=fused, saturate=limit, cache_bytes=1)
        assert spec["SATURATE"] == (limit if fused else 0.0)
        assert spec["F16_PRODUCTS"] and spec["WIDEN_V_IN_REGISTERS"]
        assert (spec["num_warps"], spec["TILE_N"]) == (1, 32)  # the one-warp programs
        compiled = compile_for(decode_split_kernel, spec, torch.bfloat16, 90, cache)
        assert_fast(
            compiled,
            f"decode {cache} fused={fused}",
            tensor_op="mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        )
        ptx = compiled.asm["ptx"]
        assert (bound in ptx) == fused
        # V widened by the inline PTX and staged as fp16 for transposed 16-bit matrix loads;
        # byte loads from shared memory would mean Triton staged the 8-bit tile instead.
        assert spec["WIDEN_V_IN_PTX"] and spec["LAZY_RESCALE"]
        assert ("cvt.rn.f16x2.e4m3x2" if cache == "*fp8e4nv" else "0x1404") in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
        assert "ld.shared.b8" not in ptx, f"decode {cache}: V read from shared memory bytewise"
    spec = ops.prefill_spec(
        head_dim=128,
        group=4,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        skip_single_query=True,
        cache_bytes=1,
    )
    assert spec["F16_PRODUCTS"]
    compiled = compile_for(prefill_kernel, spec, torch.bfloat16, 90, cache)
    assert_fast(compiled, f"prefill {cache}", tensor_op="wgmma.mma_async")
    assert re.search(r"wgmma\.mma_async[\w.]*\.f32\.f16\.f16", compiled.asm["ptx"])
    spec = ops.store_spec(num_kv_heads=8, head_dim=128, block_size=16, saturate=limit)
    compiled = compile_for(store_kv_kernel, spec, torch.bfloat16, 90, cache)
    assert resource_usage(compiled)["STACK"] == 0
    assert "min.f32" in compiled.asm["ptx"] and "max.f32" in compiled.asm["ptx"]
    assert "div.rn.f32" not in compiled.asm["ptx"]
    # with a scale per KV head (checkpoint scales): divided, correctly rounded, as torch does;
    # and with centred keys (an offset subtracted first)
    for offset in (False, True):
        spec = ops.store_spec(
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            saturate=limit,
            head_scales=True,
            key_offset=offset,
        )
        compiled = compile_for(store_kv_kernel, spec, torch.bfloat16, 90, cache)
        assert resource_usage(compiled)["STACK"] == 0
        assert "div.rn.f32" in compiled.asm["ptx"]
        assert ("sub.f32" in compiled.asm["ptx"]) == offset


def test_reduce_store_and_fp32_paths_compile() -> None:
    spec = ops.reduce_spec(
        num_heads=32, head_dim=128, num_splits=64, tile_n=64, sliding_window=None, mixed=False
    )
    use = resource_usage(compile_for(decode_reduce_kernel, spec, torch.bfloat16, 90))
    assert use["STACK"] == 0, f"decode reduce spills: {use}"
    spec = ops.store_spec(num_kv_heads=8, head_dim=128, block_size=16)
    use = resource_usage(compile_for(store_kv_kernel, spec, torch.bfloat16, 90))
    assert use["STACK"] == 0, f"store spills: {use}"
    # fp32 is a correctness path (three-pass TF32 products): it must build, spills allowed
    for kernel, spec in (
        (
            prefill_kernel,
            ops.prefill_spec(
                head_dim=128,
                group=4,
                dtype=torch.float32,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                skip_single_query=False,
            ),
        ),
        (
            decode_split_kernel,
            ops.decode_spec(
                num_heads=8,
                group=4,
                head_dim=128,
                dtype=torch.float32,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                mixed=False,
                single_split=False,
                fused_store=True,
            ),
        ),
    ):
        assert compile_for(kernel, spec, torch.float32, 90).asm["cubin"]


def test_attention_sinks_build_without_spills() -> None:
    """gpt-oss's shape (head size 64, 8 query heads per KV head, a 128-token window) with
    sinks: prefill, both decode epilogues and the reduce build for sm_90 without spilling."""
    common = dict(
        head_dim=64,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=128,
        logit_softcap=None,
        sinks=True,
    )
    prefill = ops.prefill_spec(group=8, skip_single_query=True, **common)
    assert prefill["USE_SINKS"]
    compiled = [compile_for(prefill_kernel, prefill, torch.bfloat16, 90)]
    for single in (True, False):
        spec = ops.decode_spec(
            num_heads=64,
            group=8,
            mixed=False,
            single_split=single,
            fused_store=not single,
            **common,
        )
        compiled.append(compile_for(decode_split_kernel, spec, torch.bfloat16, 90))
    compiled.append(
        compile_for(
            decode_reduce_kernel,
            ops.reduce_spec(
                num_heads=64,
                head_dim=64,
                num_splits=8,
                tile_n=64,
                sliding_window=128,
                mixed=False,
                sinks=True,
            ),
            torch.bfloat16,
            90,
        )
    )
    for kernel in compiled:
        use = resource_usage(kernel)
        assert use["STACK"] == 0 and use["LOCAL"] == 0, f"spills: {use}"


def _before_wait(ptx: str) -> list[str]:
    """The PTX lines before the kernel's only ``griddepcontrol.wait``, after checking that the
    next grid is released (once) after that wait."""
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    releases = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    assert len(waits) == 1 and len(releases) == 1 and waits[0] < releases[0], (waits, releases)
    return lines[: waits[0]]


@pytest.mark.parametrize("single_split", [True, False])
@pytest.mark.parametrize("fused_store", [True, False])
def test_pdl_waits_before_any_memory_access(single_split: bool, fused_store: bool) -> None:
    """With PDL (tallow.kernels.pdl) every kernel reads only this step's data, so each waits
    for the previous grid before its first load or store; without PDL no such instruction."""
    decode = dict(
        num_heads=32,
        group=4,
        head_dim=128,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=not single_split,
        single_split=single_split,
        fused_store=fused_store,
    )
    cases = [
        (decode_split_kernel, ops.decode_spec(**decode, pdl=True)),
        (decode_split_kernel, ops.decode_spec(**decode, pdl=False)),
    ]
    if single_split and fused_store:  # the other kernels once
        for pdl in (True, False):
            cases += [
                (
                    decode_reduce_kernel,
                    ops.reduce_spec(
                        num_heads=32,
                        head_dim=128,
                        num_splits=8,
                        tile_n=64,
                        sliding_window=None,
                        mixed=False,
                        pdl=pdl,
                    ),
                ),
                (
                    store_kv_kernel,
                    ops.store_spec(num_kv_heads=8, head_dim=128, block_size=16, pdl=pdl),
                ),
                (
                    prefill_kernel,
                    ops.prefill_spec(
                        head_dim=128,
                        group=4,
                        dtype=torch.bfloat16,
                        block_size=16,
                        sliding_window=None,
                        logit_softcap=None,
                        skip_single_query=True,
                        pdl=pdl,
                    ),
                ),
            ]
    memory = re.compile(r"\b(ld|st)\.global|\bcp\.async|\batom\.|\bred\.global")
    for kernel, spec in cases:
        assert spec["USE_PDL"] == spec["launch_pdl"]
        ptx = compile_for(kernel, spec, torch.bfloat16, 90).asm["ptx"]
        if not spec["USE_PDL"]:
            assert "griddepcontrol" not in ptx
            continue
        early = [line for line in _before_wait(ptx) if memory.search(line)]
        assert not early, f"{kernel.__name__} touches memory before its wait: {early[:3]}"


TURBO = [8, 4, 3]
HAS_ALL = dict(HAS_K_OFFSET=True, HAS_K_SMOOTH=True, HAS_V_OFFSET=True)


@pytest.mark.parametrize("bits", TURBO)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_turbo_variants_compile_for_hopper_without_spills(bits: int, head_dim: int) -> None:
    """The turbo cache paths (codes unpacked in the tile loads, scales on the scores' and
    weights' columns) build for sm_90 with tensor-core products and no spills, and the fused
    store (rotation by a tensor-core product, quantization, packing) builds too."""
    from tallow_attention_triton.kernels.turbo import store_turbo_kernel
    from tallow_attention_triton.turbo_ops import store_turbo_spec

    for single in (True, False):
        if bits == 4:  # its own kernel: test_turbo4_decode_unpacks_nibbles_in_ptx
            break
        spec = ops.decode_spec(
            num_heads=32,
            group=4,
            head_dim=head_dim,
            dtype=torch.bfloat16,
            block_size=16,
            sliding_window=None,
            logit_softcap=None,
            mixed=not single,
            single_split=single,
            fused_store=False,
            cache_bytes=1,
            kv_bits=bits,
        )
        assert (
            spec["KV_BITS"] == bits
            and not spec["F16_PRODUCTS"]
            and not spec["WIDEN_V_IN_PTX"]
            and not spec["LAZY_RESCALE"]
        )
        assert spec["num_warps"] == 4
        compiled = compile_for(decode_split_kernel, spec, torch.bfloat16, 90, "*u8")
        assert_fast(compiled, f"decode turbo{bits} D={head_dim}", tensor_op="mma.sync")
    spec = ops.prefill_spec(
        head_dim=head_dim,
        group=4,
        dtype=torch.bfloat16,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        skip_single_query=True,
        cache_bytes=1,
        kv_bits=bits,
    )
    compiled = compile_for(prefill_kernel, spec, torch.bfloat16, 90, "*u8")
    assert_fast(compiled, f"prefill turbo{bits} D={head_dim}", tensor_op="wgmma.mma_async")
    spec = dict(
        store_turbo_spec(num_kv_heads=8, head_dim=head_dim, block_size=16, bits=bits), **HAS_ALL
    )
    compiled = compile_for(store_turbo_kernel, spec, torch.bfloat16, 90, "*u8")
    assert resource_usage(compiled)["STACK"] == 0


@pytest.mark.parametrize(
    ("head_dim", "group", "dtype"),
    [
        (64, 4, torch.bfloat16),
        (96, 8, torch.float16),
        (128, 4, torch.bfloat16),
        (256, 4, torch.bfloat16),
        (128, 32, torch.bfloat16),
        (128, 4, torch.float32),
        (32, 2, torch.float32),
    ],
)
def test_turbo4_decode_unpacks_nibbles_in_ptx(
    head_dim: int, group: int, dtype: torch.dtype
) -> None:
    """The 4-bit turbo decode kernel builds for sm_90 with tensor-core products, vectorised or
    asynchronous loads and no spills, single-split and split alike; with 16-bit activations
    it unpacks the codes in PTX (fp16 products), and at llama-3-8b's shape its loop stays
    within the instruction count that made it the decode of 4-bit caches (1,181 sm_90
    instructions per 32-key tile, against 3,336 per 32 keys in the split kernel's 4-warp
    64-key tiles, which decoded them before)."""
    from tallow.kernels import sass_loops, sass_opcode as opcode
    from tallow_attention_triton.kernels.turbo_decode import decode_nibbles_kernel

    for single in (True, False):
        spec = ops.decode_nibbles_spec(
            num_heads=8 * group,
            group=group,
            head_dim=head_dim,
            dtype=dtype,
            block_size=16,
            sliding_window=None,
            logit_softcap=None,
            mixed=not single,
            single_split=single,
        )
        assert spec["UNPACK_IN_PTX"] == (dtype != torch.float32)
        compiled = compile_for(decode_nibbles_kernel, spec, dtype, 90, "*u8")
        assert_fast(
            compiled, f"turbo4 decode D={head_dim} group {group} {dtype}", tensor_op="mma.sync"
        )
        if dtype == torch.float32:
            continue
        assert "fma.rn.f16x2" in compiled.asm["ptx"] and "prmt.b32" in compiled.asm["ptx"]
        if (head_dim, group, single) == (128, 4, False):
            loop = sass_loops(compiled)[0]
            assert spec["TILE_N"] == 32 and spec["num_warps"] == 1
            assert len(loop) <= 1300, f"{len(loop)} instructions per 32-key tile"
            ops_ = [opcode(i) for i in loop]
            assert ops_.count("I2F") == 0, "codes widened one by one (int-to-float)"


def test_heads_under_32_decode_4_bit_caches_with_the_split_kernel() -> None:
    """The nibble kernel's half-width products reduce over head size / 2 coordinates, and a
    tensor-core product needs 16: at head size 16 it does not build for sm_90, so such heads
    (tiny test models) take the split kernel, which does."""
    from tallow_attention_triton.kernels.turbo_decode import decode_nibbles_kernel

    assert not ops.nibble_decode(4, 16) and ops.nibble_decode(4, 32)
    assert not ops.nibble_decode(3, 128) and not ops.nibble_decode(8, 128)
    spec = ops.decode_nibbles_spec(
        num_heads=4,
        group=2,
        head_dim=16,
        dtype=torch.float32,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=False,
        single_split=False,
    )
    with pytest.raises(Exception) as info:
        compile_for(decode_nibbles_kernel, spec, torch.float32, 90, "*u8")
    causes, exc = [], info.value
    while exc is not None:
        causes.append(str(exc))
        exc = exc.__cause__
    assert any("K >= 16" in c for c in causes), causes[-1]
    split = ops.decode_spec(
        num_heads=4,
        group=2,
        head_dim=16,
        dtype=torch.float32,
        block_size=16,
        sliding_window=None,
        logit_softcap=None,
        mixed=False,
        single_split=False,
        fused_store=False,
        cache_bytes=1,
        kv_bits=4,
    )
    compile_for(decode_split_kernel, split, torch.float32, 90, "*u8")


def test_turbo_kernels_wait_before_any_memory_access() -> None:
    """PDL: the turbo variants wait for the previous grid before their first load or store,
    like the others."""
    from tallow_attention_triton.kernels.turbo import store_turbo_kernel
    from tallow_attention_triton.kernels.turbo_decode import decode_nibbles_kernel
    from tallow_attention_triton.turbo_ops import store_turbo_spec

    memory = re.compile(r"\b(ld|st)\.global|\bcp\.async|\batom\.|\bred\.global")
    cases = [
        (
            decode_split_kernel,
            ops.decode_spec(
                num_heads=32,
                group=4,
                head_dim=128,
                dtype=torch.bfloat16,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                mixed=False,
                single_split=False,
                fused_store=False,
                cache_bytes=1,
                kv_bits=4,
                pdl=True,
            ),
        ),
        (
            prefill_kernel,
            ops.prefill_spec(
                head_dim=128,
                group=4,
                dtype=torch.bfloat16,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                skip_single_query=True,
                cache_bytes=1,
                kv_bits=3,
                pdl=True,
            ),
        ),
        (
            store_turbo_kernel,
            dict(
                store_turbo_spec(num_kv_heads=8, head_dim=128, block_size=16, bits=4, pdl=True),
                **HAS_ALL,
            ),
        ),
        (
            decode_nibbles_kernel,
            ops.decode_nibbles_spec(
                num_heads=32,
                group=4,
                head_dim=128,
                dtype=torch.bfloat16,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                mixed=False,
                single_split=False,
                pdl=True,
            ),
        ),
    ]
    for kernel, spec in cases:
        ptx = compile_for(kernel, spec, torch.bfloat16, 90, "*u8").asm["ptx"]
        early = [line for line in _before_wait(ptx) if memory.search(line)]
        assert not early, f"{kernel.__name__} touches memory before its wait: {early[:3]}"


@pytest.mark.parametrize("capability", [80, 90])
def test_512_wide_heads_compile_within_shared_memory(capability: int) -> None:
    """Gemma 4's 512-wide full-attention heads (8 query heads on one KV head): every kernel
    path builds for sm_80 and sm_90 in at most the 163 KiB of shared memory an sm_80 block may
    take, the 16-bit paths (prefill, decode, over a cast or an fp8 cache), the store and the
    reduce without spills; fp32 (the correctness path) may spill."""
    shape = dict(head_dim=512, group=8, block_size=16, sliding_window=None, logit_softcap=None)
    built = []
    for dtype, cache, cache_bytes in (
        (torch.bfloat16, None, None),
        (torch.bfloat16, "*fp8e5", 1),  # e4m3 does not build for sm_80
        (torch.float32, None, None),
    ):
        extra = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
        prefill = ops.prefill_spec(
            **shape, dtype=dtype, skip_single_query=True, capability=capability, **extra
        )
        decode = ops.decode_spec(
            num_heads=8,
            **shape,
            dtype=dtype,
            mixed=True,
            single_split=False,
            fused_store=True,
            **extra,
        )
        for kernel, spec, name in (
            (prefill_kernel, prefill, "prefill"),
            (decode_split_kernel, decode, "decode"),
        ):
            compiled = compile_for(kernel, spec, dtype, capability, cache)
            built.append((f"{name} {dtype} {cache}", compiled, dtype != torch.float32))
    built.append(
        (
            "store",
            compile_for(
                store_kv_kernel,
                ops.store_spec(num_kv_heads=1, head_dim=512, block_size=16),
                torch.bfloat16,
                capability,
            ),
            True,
        )
    )
    reduce = ops.reduce_spec(
        num_heads=8, head_dim=512, num_splits=64, tile_n=16, sliding_window=None, mixed=True
    )
    built.append(
        ("reduce", compile_for(decode_reduce_kernel, reduce, torch.bfloat16, capability), True)
    )
    for what, compiled, fast in built:
        assert compiled.metadata.shared <= 163 * 1024, f"{what}: {compiled.metadata.shared} B"
        if fast:
            use = resource_usage(compiled)
            assert use["STACK"] == 0 and use["LOCAL"] == 0, f"{what} spills: {use}"
