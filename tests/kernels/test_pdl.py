"""Programmatic Dependent Launch (tallow.kernels.pdl): when it is on, what the kernels compile
to with it, and (on a GPU of compute capability 9.0+) that it changes no result.

CPU: the switches of :func:`pdl_enabled`, and the kernels built for sm_90 by Triton's real
compiler: with ``USE_PDL`` the wait comes before every store and every read of step data (only
weights may be read before it) and the next grid is released after it; without, neither
instruction is emitted. GPU (``pytest -m gpu tests/kernels/test_pdl.py``): each kernel gives the
same bits with PDL on and off, eagerly and replayed from a captured CUDA graph.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="tallow.kernels.pdl is Triton's")

from tallow.kernels import pdl  # noqa: E402
from tallow.kernels import compile_for_gpu, pdl_order  # noqa: E402
from tallow.kernels.pdl import off_then_on, pdl_enabled, set_pdl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"


@pytest.fixture(autouse=True)
def _pdl_from_environment():
    set_pdl(None)
    yield
    set_pdl(None)


# --- when PDL is on -------------------------------------------------------------------------


def test_off_for_cpu_tensors_and_devices():
    assert not pdl_enabled(torch.zeros(2))
    assert not pdl_enabled(torch.device("cpu"))
    assert not pdl_enabled("cpu")
    assert "not a CUDA device" in pdl.unsupported_reason("cpu")
    set_pdl(True)  # forcing it on does not make a CPU tensor a GPU one
    assert not pdl_enabled(torch.zeros(2))


@pytest.fixture
def hopper(monkeypatch):
    """A compiled-kernel setting on a (pretended) compute capability 9.0 device 0."""
    monkeypatch.setattr(pdl, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(pdl, "HAS_GDC", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(pdl.ENV_VAR, raising=False)
    return torch.device("cuda", 0)


def test_on_by_default_from_compute_capability_9(hopper, monkeypatch):
    assert pdl_enabled(hopper)
    monkeypatch.setattr(pdl, "_capability", lambda index: (8, 9))
    assert not pdl_enabled(hopper)
    assert "8.9" in pdl.unsupported_reason(hopper)
    set_pdl(True)  # no PDL on hardware without it, whatever is asked
    assert not pdl_enabled(hopper)


def test_off_under_the_interpreter_and_without_gdc(hopper, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl_enabled(hopper)
    assert "TRITON_INTERPRET" in pdl.unsupported_reason(hopper)
    set_pdl(True)
    assert not pdl_enabled(hopper)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert pdl_enabled(hopper)
    monkeypatch.setattr(pdl, "HAS_GDC", False)
    assert not pdl_enabled(hopper)


def test_environment_switch_and_in_process_override(hopper, monkeypatch):
    monkeypatch.setenv(pdl.ENV_VAR, "0")
    assert not pdl_enabled(hopper)  # read at each call
    set_pdl(True)
    assert pdl_enabled(hopper)
    set_pdl(None)
    assert not pdl_enabled(hopper)
    monkeypatch.setenv(pdl.ENV_VAR, "1")
    assert pdl_enabled(hopper)
    set_pdl(False)
    assert not pdl_enabled(hopper)
    set_pdl(None)
    assert pdl_enabled(hopper)


def test_compiled_with_pdl_reads_tritons_cache():
    from types import SimpleNamespace

    def kernel(*variants: tuple[bool, str]) -> SimpleNamespace:
        cache = {
            i: SimpleNamespace(metadata=SimpleNamespace(launch_pdl=pdl_on), asm={"ptx": ptx})
            for i, (pdl_on, ptx) in enumerate(variants)
        }
        return SimpleNamespace(device_caches={0: (cache, {}, None, None, None)})

    assert pdl.compiled_with_pdl(kernel((False, ""), (True, "griddepcontrol.wait;")))
    assert not pdl.compiled_with_pdl(kernel((False, ""), (True, "no wait")))
    assert pdl.compiled_with_pdl(object()) is None


# --- what the kernels compile to (Triton's compiler for sm_90, no GPU needed) ----------------


def _ptx(
    kernel: Any, constexprs: dict[str, Any], types: dict[str, str], num_warps: int, use_pdl: bool
) -> str:
    """PTX of ``kernel`` for sm_90; pointers are fp16 unless ``types`` says otherwise, other
    runtime arguments i32 (pointers and strides 16-aligned, as the JIT would see them)."""
    return compile_for_gpu(
        kernel, dict(constexprs, USE_PDL=use_pdl), types, num_warps=num_warps, launch_pdl=use_pdl
    ).asm["ptx"]


def _kernel_cases() -> list[tuple[str, Any, dict[str, Any], dict[str, str], int, bool]]:
    """(name, kernel, constexprs, pointer types, num_warps, reads weights before the wait)."""
    from tallow.kernels._activation_triton import _gated_act_kernel
    from tallow.kernels._argmax_triton import _chunk_argmax_kernel, _pick_chunk_kernel
    from tallow.kernels._gemv_triton import _gemv_kernel
    from tallow.kernels._norm_triton import _rms_norm_kernel
    from tallow.kernels._rotary_triton import _rotary_kernel

    cases = []
    gemv = dict(SCALES=0, VEC=8, GATE=-1, DOT_PRECISION="tf32")
    for block_k, even_k, even_n in [
        (2048, True, True),
        (2048, False, False),
        (64, True, False),
        (1024, False, True),
    ]:
        cases.append(
            (
                f"gemv-1row-k{block_k}-{even_k}-{even_n}",
                _gemv_kernel,
                dict(
                    gemv,
                    HAS_BIAS=True,
                    BLOCK_M=1,
                    BLOCK_N=4,
                    BLOCK_K=block_k,
                    EVEN_K=even_k,
                    EVEN_N=even_n,
                ),
                {},
                4,
                True,
            )
        )
    for scales in (1, 2):  # e4m3 weights, scales per row / per 128 x 128 block
        cases.append(
            (
                f"gemv-1row-e4m3-scales{scales}",
                _gemv_kernel,
                dict(
                    gemv,
                    HAS_BIAS=False,
                    SCALES=scales,
                    BLOCK_M=1,
                    BLOCK_N=8,
                    BLOCK_K=2048,
                    VEC=16,
                    EVEN_K=True,
                    EVEN_N=True,
                ),
                {"w_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
                4,
                True,
            )
        )
    cases.append(
        (
            "gemv-16rows",
            _gemv_kernel,
            dict(
                gemv,
                HAS_BIAS=False,
                BLOCK_M=16,
                BLOCK_N=32,
                BLOCK_K=256,
                EVEN_K=False,
                EVEN_N=False,
            ),
            {},
            4,
            False,
        )
    )
    for residual in (False, True):
        cases.append(
            (
                f"rms_norm-residual-{residual}",
                _rms_norm_kernel,
                dict(HAS_RESIDUAL=residual, GEMMA=False, BLOCK=4096),
                {"eps": "fp32"},
                16,
                True,
            )
        )
    for norm in (False, True):
        cases.append(
            (
                f"rotary-norm-{norm}",
                _rotary_kernel,
                dict(
                    HALF=64,
                    IS_NEOX=True,
                    HAS_K=True,
                    BLOCK_HQ=32,
                    BLOCK_HK=8,
                    BLOCK_R=64,
                    HAS_NORM=norm,
                ),
                {"pos_ptr": "*i64", "cache_ptr": "*fp32", "eps": "fp32"},
                4,
                False,
            )
        )
    cases += [
        ("gated_act", _gated_act_kernel, dict(KIND=0, BLOCK=1024), {}, 4, False),
        (
            "argmax-chunks",
            _chunk_argmax_kernel,
            dict(CHUNK=4096, MASKED=False, MASK_INDEXED=False),
            {"best_val_ptr": "*fp32", "best_idx_ptr": "*i32"},
            8,
            False,
        ),
        (
            "argmax-chunks-masked",
            _chunk_argmax_kernel,
            dict(CHUNK=4096, MASKED=True, MASK_INDEXED=True),
            {
                "best_val_ptr": "*fp32",
                "best_idx_ptr": "*i32",
                "bitmask_ptr": "*i32",
                "mask_of_row_ptr": "*i32",
            },
            8,
            False,
        ),
        (
            "argmax-pick",
            _pick_chunk_kernel,
            dict(C_PAD=32),
            {"best_val_ptr": "*fp32", "best_idx_ptr": "*i32", "out_ptr": "*i64"},
            1,
            False,
        ),
    ]
    return cases


@pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET=1 replaces compiled kernels")
@pytest.mark.parametrize("case", _kernel_cases(), ids=lambda case: case[0])
def test_kernels_wait_before_touching_step_data(case):
    _, kernel, constexprs, types, warps, weights_first = case
    assert "griddepcontrol" not in _ptx(kernel, constexprs, types, warps, use_pdl=False)
    loads, stores = pdl_order(_ptx(kernel, constexprs, types, warps, use_pdl=True))
    assert stores == 0
    if weights_first:  # the GEMV's first weight tile, the norm weight: issued before the wait
        assert loads > 0
    else:
        assert loads == 0


# --- on the GPU: the same bits with PDL on and off -----------------------------------------

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def pdl_gpu() -> torch.device:
    """The current CUDA device, where PDL can be switched on (skips with the reason if not)."""
    device = torch.device("cuda", torch.cuda.current_device())
    reason = pdl.unsupported_reason(device)
    if reason:
        pytest.skip(reason)
    set_pdl(True)
    assert pdl_enabled(device)
    return device


def assert_same_bits(off: Any, on: Any) -> None:
    off = off if isinstance(off, (tuple, list)) else (off,)
    on = on if isinstance(on, (tuple, list)) else (on,)
    for a, b in zip(off, on, strict=True):
        assert torch.equal(a, b), (a - b).abs().max()


def assert_built_with_pdl(kernel: Any) -> None:
    """Some variant of ``kernel`` ran with PDL (unknowable where Triton hides its cache)."""
    assert pdl.compiled_with_pdl(kernel) in (True, None), f"{kernel} never compiled with PDL"


def _randn(
    *shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


@gpu
@needs_gpu
@pytest.mark.parametrize(
    "k,n",
    [(4096, 6144), (14336, 4096), (4100, 1000), (896, 4864), (300, 1001), (64, 24), (2048, 7)],
)
@pytest.mark.parametrize("rows", [1, 3])
def test_gemv_same_bits(pdl_gpu, k, n, rows):
    from tallow.kernels._gemv_triton import _gemv_kernel, gemv_triton

    x = _randn(rows, k, seed=1)
    w = _randn(n, k, scale=k**-0.5, seed=2)
    b = _randn(n, seed=3)
    assert_same_bits(*off_then_on(lambda: gemv_triton(x, w)))
    assert_same_bits(*off_then_on(lambda: gemv_triton(x, w, b)))
    assert_built_with_pdl(_gemv_kernel)


@gpu
@needs_gpu
@pytest.mark.parametrize("n_tokens,hidden", [(1, 4096), (1, 896), (7, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_same_bits(pdl_gpu, n_tokens, hidden, with_residual):
    from tallow.kernels._norm_triton import _rms_norm_kernel, rms_norm_triton

    x = _randn(n_tokens, hidden, scale=3.0, seed=4)
    w = _randn(hidden, seed=5)
    res = _randn(n_tokens, hidden, seed=6) if with_residual else None
    assert_same_bits(*off_then_on(lambda: rms_norm_triton(x, w, 1e-6, res)))
    assert_built_with_pdl(_rms_norm_kernel)


@gpu
@needs_gpu
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rotary_same_bits(pdl_gpu, qk_norm):
    from tallow.kernels._rotary_triton import _rotary_kernel, rotary_embedding_triton

    n_tokens, n_q, n_kv, head = 3, 32, 8, 128
    cache = _randn(4096, head, dtype=torch.float32, seed=7)
    positions = torch.tensor([5, 4095, 17], device="cuda")
    qkv = _randn(n_tokens, (n_q + 2 * n_kv) * head, seed=8)
    weights = (_randn(head, seed=9), _randn(head, seed=10)) if qk_norm else None

    def rotate():
        q, k = qkv[:, : n_q * head], qkv[:, n_q * head : (n_q + n_kv) * head]
        return rotary_embedding_triton(positions, q, k, cache, head, True, False, qk_norm=weights)

    assert_same_bits(*off_then_on(rotate))
    assert_built_with_pdl(_rotary_kernel)


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_act_same_bits(pdl_gpu, kind):
    from tallow.kernels._activation_triton import _gated_act_kernel, gated_act_triton

    x = _randn(1, 2 * 14336, scale=3.0, seed=11)
    assert_same_bits(*off_then_on(lambda: gated_act_triton(x, kind)))
    assert_built_with_pdl(_gated_act_kernel)


@gpu
@needs_gpu
def test_argmax_same_bits(pdl_gpu):
    from tallow.kernels._argmax_triton import _pick_chunk_kernel, argmax_rows_triton

    logits = _randn(2, 128256, dtype=torch.float32, seed=15)
    assert_same_bits(*off_then_on(lambda: argmax_rows_triton(logits)))
    assert_built_with_pdl(_pick_chunk_kernel)


@gpu
@needs_gpu
@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (896, 4864)])
def test_graph_of_a_decode_mlp_chain_same_bits(pdl_gpu, hidden, inter):
    """norm -> GEMV -> gated act -> GEMV, three layers deep, captured with PDL on and replayed
    on three inputs: the same bits as the chain run eagerly with PDL off. Inside the graph the
    allocator hands each kernel memory an earlier kernel just used, so a kernel that wrote
    before its wait would show up here."""
    from tallow.kernels._activation_triton import gated_act_triton
    from tallow.kernels._gemv_triton import gemv_triton
    from tallow.kernels._norm_triton import rms_norm_triton

    layers = [
        (
            _randn(hidden, seed=20 + i),
            _randn(2 * inter, hidden, scale=hidden**-0.5, seed=30 + i),
            _randn(hidden, inter, scale=inter**-0.5, seed=40 + i),
        )
        for i in range(3)
    ]

    def chain(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for norm_w, gate_up, down in layers:
            h, res = rms_norm_triton(x, norm_w, 1e-6, res)
            x = gemv_triton(gated_act_triton(gemv_triton(h, gate_up), "silu"), down)
        return x, res

    inputs = [(_randn(1, hidden, seed=50 + i), _randn(1, hidden, seed=60 + i)) for i in range(3)]
    set_pdl(False)
    expected = [chain(x, r) for x, r in inputs]
    set_pdl(True)
    for (x, r), want in zip(inputs, expected):
        assert_same_bits(want, chain(x, r))  # eager with PDL; also compiles before capture
    static_x, static_res = inputs[0][0].clone(), inputs[0][1].clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static_x, static_res)
    got = []
    for x, r in inputs:
        static_x.copy_(x)
        static_res.copy_(r)
        graph.replay()
        got.append((out[0].clone(), out[1].clone()))
    torch.cuda.synchronize()
    for want, have in zip(expected, got):
        assert_same_bits(want, have)
