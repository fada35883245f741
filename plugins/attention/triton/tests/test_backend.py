"""The backend as a plugin: registration, selection, validation reasons, input errors, and the
launch heuristics. Runs anywhere (the kernels themselves: test_interpret.py, test_compile.py and
the GPU tests)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tallow.builtins
from tallow.kernels import CastKVCodec
from tallow.layers import AttentionLayer
from tallow.plugin import (
    AttentionBackend,
    AttentionBackendRegistry,
    KVTensor,
    SelectionError,
    select,
)
from tallow.plugin.testing import modules_imported_by_registration
from tallow_attention_triton import heuristics, plugin
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.testing import make_case

ROOT = Path(__file__).resolve().parents[1]


def config(
    device: str = "auto",
    dtype: str = "auto",
    kv_codec: str = "auto",
    block_size: int = 16,
    settings: dict | None = None,
) -> SimpleNamespace:
    return SimpleNamespace(
        model=SimpleNamespace(device=device, dtype=dtype),
        cache=SimpleNamespace(kv_codec=kv_codec, block_size=block_size),
        runner=SimpleNamespace(attention_backend="auto"),
        plugins=SimpleNamespace(settings=settings or {}),
    )


def registry() -> AttentionBackendRegistry:
    reg = AttentionBackendRegistry()
    tallow.builtins.tallow_register_attention_backends(reg)
    plugin.tallow_register_attention_backends(reg)
    return reg


# -- packaging and registration ------------------------------------------------------------
def test_distribution_declares_its_entry_point() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "tallow-attention-triton"
    eps = meta["project"]["entry-points"]["tallow"]
    assert eps == {"tallow-attention-triton": "tallow_attention_triton.plugin"}
    assert (ROOT / "tallow_attention_triton" / "plugin.py").is_file()


def test_registers_lazily_above_the_torch_reference() -> None:
    reg = registry()
    entry = reg.entry("triton")
    assert entry.lazy and entry.target == "tallow_attention_triton.backend:TritonAttentionBackend"
    assert entry.priority > reg.entry("torch").priority
    assert [e.name for e in reg.by_priority()][0] == "triton"
    cls = entry.load()
    assert issubclass(cls, AttentionBackend) and cls.name == "triton"
    assert cls.supports_cuda_graph is True


def test_registration_imports_no_torch() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_attention_triton.plugin",
            "tallow_register_attention_backends",
            "AttentionBackendRegistry",
            watch=("torch", "triton"),
        )
        == []
    )


# -- validation and selection ----------------------------------------------------------------
def test_validate_lists_every_reason_on_a_cpu_config() -> None:
    reasons = TritonAttentionBackend.validate(config(device="cpu", dtype="int8", block_size=24))
    text = "\n".join(reasons)
    assert "model.device is 'cpu'" in text
    assert "model.dtype 'int8'" in text and "bfloat16" in text
    assert "cache.block_size 24" in text
    assert len(reasons) == 3


def cast_layout(dtype: torch.dtype) -> list[KVTensor]:
    return CastKVCodec(storage=dtype).layout(
        num_kv_heads=2, head_dim=64, block_size=16, model_dtype=torch.bfloat16
    )


def test_kv_codecs_it_serves() -> None:
    """The cast codecs, by name, into a cache dtype the kernels read; nothing else."""
    from tallow.plugin import KVCodec

    class Packed(KVCodec):
        name = "packed4"

    class Fp8(CastKVCodec):
        name = "fp8"

    be = TritonAttentionBackend()
    for dtype in (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        assert be.supports_kv_codec(Fp8(), cast_layout(dtype)) == []
    (reason,) = be.supports_kv_codec(Packed(), cast_layout(torch.bfloat16))
    assert "'packed4' is not implemented by this backend" in reason and "fp8_e5m2" in reason
    (reason,) = be.supports_kv_codec(Fp8(), cast_layout(torch.int8))
    assert "cache dtype torch.int8 is not supported" in reason and "float8_e4m3fn" in reason
    scaled = CastKVCodec(per_head_scales=True).layout(
        num_kv_heads=2, head_dim=64, block_size=16, model_dtype=torch.bfloat16
    )
    assert be.supports_kv_codec(Fp8(), scaled) == []  # a float32 scale per KV head
    odd = [
        spec if spec.name != "v_scale" else KVTensor("v_scale", (2,), torch.float16, False)
        for spec in scaled
    ]
    (reason,) = be.supports_kv_codec(Fp8(), odd)
    assert "not paged k and v tensors" in reason and "v_scale [2] torch.float16" in reason
    for scales in (False, True):  # centred keys: a float32 offset per KV head and channel
        centred = CastKVCodec(per_head_scales=scales, center_keys=True).layout(
            num_kv_heads=2, head_dim=64, block_size=16, model_dtype=torch.bfloat16
        )
        assert be.supports_kv_codec(Fp8(), centred) == []
    wrong = [
        spec if spec.name != "k_offset" else KVTensor("k_offset", (2,), torch.float32, False)
        for spec in centred
    ]
    (reason,) = be.supports_kv_codec(Fp8(), wrong)
    assert "k_offset [2] torch.float32" in reason


def test_e4m3_cache_needs_ada_or_newer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton cannot convert to or from e4m3 below compute capability 8.9 (the kernels would
    fail to compile at warm-up on an A100); e5m2 builds on Ampere."""
    codec = CastKVCodec()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    be = TritonAttentionBackend(config(device="cuda:0"))
    reasons = be.supports_kv_codec(codec, cast_layout(torch.float8_e4m3fn))
    assert len(reasons) == 2  # k and v
    assert (
        "compute capability 8.9" in reasons[0] and "8.0" in reasons[0] and "fp8_e5m2" in reasons[0]
    )
    assert be.supports_kv_codec(codec, cast_layout(torch.float8_e5m2)) == []
    assert be.supports_kv_codec(codec, cast_layout(torch.bfloat16)) == []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 9))
    assert be.supports_kv_codec(codec, cast_layout(torch.float8_e4m3fn)) == []


def test_validate_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TritonAttentionBackend.validate(config()) == [
        "no CUDA device (torch.cuda.is_available() is False)"
    ]


def test_validate_checks_device_index_and_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    assert TritonAttentionBackend.validate(config()) == ["CUDA compute capability 7.5 is below 8.0"]
    assert "does not exist" in TritonAttentionBackend.validate(config(device="cuda:3"))[0]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    assert TritonAttentionBackend.validate(config(device="cuda:0", dtype="bfloat16")) == []
    assert TritonAttentionBackend.validate(None) == []


def test_selection_falls_back_to_torch_and_refuses_a_named_triton_on_cpu() -> None:
    reg = registry()
    assert select(reg, config(device="cpu")).name == "torch"
    with pytest.raises(SelectionError) as err:
        select(reg, config(device="cpu"), "triton")
    assert "triton" in str(err.value) and "model.device is 'cpu'" in str(err.value)


def test_plugin_settings_num_splits() -> None:
    be = TritonAttentionBackend(config(settings={"tallow-attention-triton": {"num_splits": 4}}))
    assert be.num_splits == 4
    with pytest.raises(ValueError, match="tallow-attention-triton.num_splits"):
        TritonAttentionBackend(config(settings={"tallow-attention-triton": {"num_splits": 0}}))
    assert TritonAttentionBackend(None).num_splits is None


# -- layers and inputs -------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", heuristics.TESTED_HEAD_DIMS)
def test_supported_head_dims(head_dim: int) -> None:
    layer = AttentionLayer(0, 8, 2, head_dim, 0.1)
    assert TritonAttentionBackend.supports_layer(layer) == []


@pytest.mark.parametrize("head_dim", [8, 72, 100, 528, 1024])
def test_unsupported_head_dims_are_named(head_dim: int) -> None:
    reasons = TritonAttentionBackend.supports_layer(AttentionLayer(0, 8, 2, head_dim, 0.1))
    assert len(reasons) == 1 and f"head size {head_dim}" in reasons[0]


def test_forward_rejects_bad_inputs_with_the_field_named() -> None:
    case = make_case(
        query_lens=[2, 1],
        context_lens=[3, 4],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float16,
    )
    be = TritonAttentionBackend()
    with pytest.raises(ValueError, match=r"q, k, v and meta.slot_mapping must have the same"):
        be.forward(case.layer, case.q, case.k[:2], case.v, case.kv_cache, case.meta)
    with pytest.raises(ValueError, match=r"q must be \[T, 4, 64\], got \[3, 2, 128\]"):
        be.forward(case.layer, case.q.reshape(3, 2, 128), case.k, case.v, case.kv_cache, case.meta)
    narrow = case.kv_cache.with_tensors({n: t[:, :, :1] for n, t in case.kv_cache.tensors.items()})
    with pytest.raises(
        ValueError,
        match=r"kv_cache must hold k and v of \[blocks, block_size, "
        r"2, 64\]",
    ):
        be.forward(case.layer, case.q, case.k, case.v, narrow, case.meta)
    with pytest.raises(ValueError, match=r"q dtype torch.int32 is not supported"):
        be.forward(case.layer, case.q.to(torch.int32), case.k, case.v, case.kv_cache, case.meta)
    case.meta.block_size = 32
    with pytest.raises(ValueError, match=r"differs from meta.block_size 32"):
        be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)


def test_forward_refuses_cpu_tensors_outside_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = make_case(
        query_lens=[1],
        context_lens=[3],
        num_heads=2,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float16,
    )
    with pytest.raises(ValueError, match=r"needs CUDA tensors"):
        TritonAttentionBackend().forward(
            case.layer, case.q, case.k, case.v, case.kv_cache, case.meta
        )


# -- heuristics ----------------------------------------------------------------------------
@pytest.mark.parametrize("num_seqs", [1, 2, 7, 64, 256])
@pytest.mark.parametrize("max_seq_len", [None, 1, 100, 768, 4096, 32768])
def test_decode_splits(num_seqs: int, max_seq_len: int | None) -> None:
    s = heuristics.decode_num_splits(num_seqs, 8, sm_count=132, max_seq_len=max_seq_len)
    assert 1 <= s <= heuristics.MAX_SPLITS and s & (s - 1) == 0
    if max_seq_len is not None:
        # never more splits than MIN_TOKENS_PER_SPLIT-token pieces (rounded to a power of 2)
        pieces = -(-max_seq_len // heuristics.MIN_TOKENS_PER_SPLIT)
        assert s <= heuristics.next_pow2(pieces)
    if s < heuristics.MAX_SPLITS and max_seq_len is None:
        # without a length hint the grid fills the GPU
        assert num_seqs * 8 * s >= heuristics.PROGRAMS_PER_SM * 132


def test_decode_splits_for_batch_one_long_context() -> None:
    assert heuristics.decode_num_splits(1, 8, sm_count=132, max_seq_len=32768) == 64
    assert heuristics.decode_num_splits(256, 8, sm_count=132, max_seq_len=32768) == 1


def test_decode_splits_keep_the_warps_of_smaller_programs() -> None:
    """One-warp programs (8-bit caches) get four times the splits of 4-warp ones, so a small
    batch still puts as many warps on each SM; large batches and short contexts still get 1."""
    four = heuristics.decode_num_splits(4, 8, sm_count=132, max_seq_len=None)
    one = heuristics.decode_num_splits(4, 8, sm_count=132, max_seq_len=None, num_warps=1)
    assert (four, one) == (16, 64)
    assert heuristics.decode_num_splits(512, 8, sm_count=132, max_seq_len=None, num_warps=1) == 1
    assert heuristics.decode_num_splits(4, 8, sm_count=132, max_seq_len=300, num_warps=1) == 4


@pytest.mark.parametrize("group", [1, 3, 4, 6, 8, 16, 32])
@pytest.mark.parametrize(("elem_bytes", "cache_bytes"), [(2, None), (4, None), (2, 1), (4, 1)])
@pytest.mark.parametrize("head_dim", heuristics.TESTED_HEAD_DIMS)
def test_tile_shapes(group: int, elem_bytes: int, cache_bytes: int | None, head_dim: int) -> None:
    p = heuristics.prefill_tiles(head_dim, group, elem_bytes)
    assert p.block_q >= 1 and p.block_q * group <= p.block_m
    assert p.block_m >= 16 and p.tile_n >= 16  # tensor-core products need 16 rows/cols
    d = heuristics.decode_tiles(head_dim, group, elem_bytes, cache_bytes)
    assert d.g_pad >= max(16, group) and d.tile_n >= 16
    # one-warp programs only where they compile without spills (8-bit cache, 16-bit
    # activations, head size <= 128, group <= 16; test_compile checks the llama-3-8b shape)
    one_warp = cache_bytes == 1 and elem_bytes == 2 and head_dim <= 128 and group <= 16
    assert (d.num_warps, d.tile_n) == ((1, 32) if one_warp else (4, d.tile_n))


@pytest.mark.parametrize("group", [1, 4, 8, 16, 32])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("head_dim", heuristics.TESTED_HEAD_DIMS)
def test_turbo4_decode_tiles(group: int, elem_bytes: int, head_dim: int) -> None:
    """The 4-bit turbo decode kernel's tiles: one-warp 32-key programs only where they build
    without spills (16-bit activations, head size <= 128, group <= 16; test_compile checks
    both sides of that line), 16-key steps for fp32 products."""
    d = heuristics.nibble_decode_tiles(head_dim, group, elem_bytes)
    assert d.g_pad >= max(16, group) and d.tile_n >= 16
    if elem_bytes == 4:
        assert (d.num_warps, d.tile_n) == (4, 16)
    elif head_dim <= 128 and group <= 16:
        assert (d.num_warps, d.tile_n, d.num_stages) == (1, 32, 3)
    else:
        assert d.num_warps == 4


@pytest.mark.parametrize("head_dim", [256, 512])
def test_a_turbo_cache_stops_at_head_size_256(head_dim: int) -> None:
    """The turbo kernels keep a [D, D] rotation: a 512-wide head (Gemma 4's full layers) over
    a turbo cache is refused with the codecs that serve it, a 256-wide one accepted."""
    from tallow.kernels import kv_cache
    from tallow_kvcache_turboquant.codec import Turbo4KVCodec

    codec = Turbo4KVCodec()
    layout = kv_cache.layer_layout(
        codec, num_kv_heads=1, head_dim=head_dim, block_size=16, model_dtype=torch.bfloat16
    )
    reasons = TritonAttentionBackend(config()).supports_kv_codec(codec, layout)
    if head_dim == 256:
        assert reasons == []
    else:
        assert len(reasons) == 1 and "head size 512 in a turbo cache" in reasons[0], reasons
