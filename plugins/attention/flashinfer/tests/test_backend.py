"""The backend as a plugin: registration, selection, and every reason it refuses with, on a
machine without a CUDA GPU or flashinfer (the situations are set up with monkeypatch where this
machine does not have them). The kernels themselves: test_attention_gpu.py."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

import tallow.builtins
from tallow.layers import AttentionLayer
from tallow.plugin import (
    AttentionBackend,
    AttentionBackendRegistry,
    KVTensor,
    PluginSettingsError,
    SelectionError,
    select,
)
from tallow.plugin.testing import modules_imported_by_registration
from tallow_attention_flashinfer import availability, plugin
from tallow_attention_flashinfer.backend import FlashInferAttentionBackend
from tallow_attention_flashinfer.settings import FlashInferSettings

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "tallow-attention-flashinfer"


def config(device: str = "auto", dtype: str = "auto", settings: dict | None = None) -> Any:
    return SimpleNamespace(
        model=SimpleNamespace(device=device, dtype=dtype),
        cache=SimpleNamespace(kv_codec="auto", block_size=16),
        runner=SimpleNamespace(attention_backend="auto"),
        plugins=SimpleNamespace(settings={SETTINGS: settings} if settings is not None else {}),
    )


def layer(head_dim: int = 128, heads: int = 32, kv_heads: int = 8, **kw: Any) -> AttentionLayer:
    return AttentionLayer(
        layer_index=3,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        **kw,
    )


@pytest.fixture
def gpu_machine(monkeypatch):
    """A machine with an H200 (compute capability 9.0), nvcc and flashinfer 0.6.6 that
    imports: each test then breaks one of these."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(availability, "flashinfer_version", lambda: "0.6.6")
    monkeypatch.setattr(availability.shutil, "which", lambda name: f"/usr/local/cuda/bin/{name}")
    monkeypatch.setattr(availability, "import_reasons", lambda: [])
    import tallow_attention_flashinfer.backend as backend_module

    monkeypatch.setattr(backend_module, "import_reasons", lambda: [])
    return monkeypatch


# -- packaging and registration ------------------------------------------------------------
def test_distribution_declares_its_entry_point_and_optional_flashinfer() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "tallow-attention-flashinfer"
    eps = meta["project"]["entry-points"]["tallow"]
    assert eps == {"tallow-attention-flashinfer": "tallow_attention_flashinfer.plugin"}
    # flashinfer is an extra: the plugin installs and refuses cleanly without it
    assert not any(d.startswith("flashinfer") for d in meta["project"]["dependencies"])
    assert meta["project"]["optional-dependencies"]["flashinfer"][0].startswith("flashinfer-python")


def registry() -> AttentionBackendRegistry:
    reg = AttentionBackendRegistry()
    tallow.builtins.tallow_register_attention_backends(reg)
    plugin.tallow_register_attention_backends(reg)
    return reg


def test_registers_lazily_between_triton_and_the_torch_reference() -> None:
    entry = registry().entry("flashinfer")
    assert entry.lazy
    assert entry.target == "tallow_attention_flashinfer.backend:FlashInferAttentionBackend"
    assert -100 < entry.priority < 100  # torch: -100, triton: 100 (until measured otherwise)
    cls = entry.load()
    assert issubclass(cls, AttentionBackend) and cls.name == "flashinfer"
    assert cls.supports_cuda_graph is True


def test_registration_imports_neither_torch_nor_flashinfer() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_attention_flashinfer.plugin",
            "tallow_register_attention_backends",
            "AttentionBackendRegistry",
            watch=("torch", "flashinfer"),
        )
        == []
    )


def test_backend_module_does_not_import_flashinfer() -> None:
    """flashinfer (seconds to import, JIT machinery) loads only when a step is planned."""
    import subprocess
    import sys

    code = "import sys, tallow_attention_flashinfer.backend\nprint('flashinfer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# -- validation ------------------------------------------------------------------------------
def test_validate_on_a_cpu_machine_without_flashinfer(monkeypatch) -> None:
    monkeypatch.setattr(availability, "flashinfer_version", lambda: None)
    reasons = FlashInferAttentionBackend.validate(config(device="cpu", dtype="float32"))
    text = "\n".join(reasons)
    assert "model.dtype 'float32' is not supported" in text
    assert "flashinfer is not installed" in text and "[flashinfer]" in text
    assert "model.device is 'cpu'" in text
    assert len(reasons) == 3


def test_validate_without_a_cuda_device(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(availability, "flashinfer_version", lambda: "0.6.6")
    assert FlashInferAttentionBackend.validate(config()) == [
        "no CUDA device (torch.cuda.is_available() is False)"
    ]


def test_validate_accepts_a_hopper_machine(gpu_machine) -> None:
    assert FlashInferAttentionBackend.validate(config()) == []
    assert FlashInferAttentionBackend.validate(config(dtype="float16")) == []


def test_validate_refuses_an_old_flashinfer(gpu_machine) -> None:
    gpu_machine.setattr(availability, "flashinfer_version", lambda: "0.5.3")
    reasons = FlashInferAttentionBackend.validate(config())
    assert reasons == [
        "flashinfer-python 0.5.3 is older than 0.6.6 (pip install "
        "'tallow-attention-flashinfer[flashinfer]')"
    ]


def test_validate_refuses_an_old_gpu_and_fa3_off_hopper(gpu_machine) -> None:
    gpu_machine.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    assert FlashInferAttentionBackend.validate(config()) == [
        "CUDA compute capability 7.5 is below 8.0"
    ]
    gpu_machine.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 9))
    reasons = FlashInferAttentionBackend.validate(config(settings={"prefill_backend": "fa3"}))
    assert reasons == [
        f"plugins.settings.{SETTINGS}.prefill_backend 'fa3' needs a Hopper GPU "
        "(compute capability 9.x), this one is 8.9"
    ]


def test_validate_names_a_missing_device(gpu_machine) -> None:
    assert FlashInferAttentionBackend.validate(config(device="cuda:3")) == [
        "model.device 'cuda:3' does not exist (1 CUDA device(s))"
    ]


def test_validate_refuses_without_nvcc(gpu_machine) -> None:
    gpu_machine.setattr(availability.shutil, "which", lambda name: None)
    gpu_machine.delenv("CUDA_HOME", raising=False)
    gpu_machine.delenv("CUDA_PATH", raising=False)
    reasons = FlashInferAttentionBackend.validate(config())
    assert len(reasons) == 1 and reasons[0].startswith("nvcc was not found")


def test_validate_reports_an_import_failure(gpu_machine) -> None:
    import sys

    import tallow_attention_flashinfer.backend as backend_module

    gpu_machine.setattr(backend_module, "import_reasons", _real_import_reasons)
    gpu_machine.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` now raises
    reasons = FlashInferAttentionBackend.validate(config())
    assert len(reasons) == 1
    assert reasons[0].startswith("flashinfer cannot be imported: ModuleNotFoundError")


_real_import_reasons = availability.import_reasons


def test_bad_settings_are_refused_with_their_key() -> None:
    with pytest.raises(
        PluginSettingsError,
        match=rf"plugins\.settings\.{SETTINGS}\."
        r"prefill_backend",
    ):
        FlashInferAttentionBackend(config(settings={"prefill_backend": "fa4"}))
    with pytest.raises(PluginSettingsError, match=r"workspace_mbb: unknown key"):
        FlashInferAttentionBackend(config(settings={"workspace_mbb": 64}))
    reasons = FlashInferAttentionBackend.validate(
        config(device="cpu", settings={"workspace_mb": 1})
    )
    assert any("workspace_mb" in r for r in reasons)
    defaults = FlashInferAttentionBackend(config()).settings
    assert defaults == FlashInferSettings()
    assert (defaults.prefill_backend, defaults.decode_tensor_cores) == ("auto", "auto")


# -- layers and codecs -------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_supported_layers(head_dim: int) -> None:
    assert FlashInferAttentionBackend.supports_layer(layer(head_dim)) == []
    assert (
        FlashInferAttentionBackend.supports_layer(
            layer(head_dim, heads=48, kv_heads=8, sliding_window=4096, logit_softcap=50.0)
        )
        == []
    )
    assert FlashInferAttentionBackend.supports_layer(layer(head_dim, causal=False)) == []


def test_layers_it_refuses() -> None:
    assert FlashInferAttentionBackend.supports_layer(layer(80)) == [
        "head size 80 is not one FlashInfer's kernels are built for here (64, 128, 256)"
    ]
    assert FlashInferAttentionBackend.supports_layer(layer(128, heads=12, kv_heads=8)) == [
        "num_heads 12 is not a multiple of num_kv_heads 8"
    ]
    odd = AttentionLayer(0, 8, 8, 128, 0.1, sliding_window=16, causal=False)
    assert FlashInferAttentionBackend.supports_layer(odd) == [
        "a sliding window on a bidirectional (causal=False) layer"
    ]


def test_layers_with_attention_sinks_are_refused() -> None:
    """gpt-oss's sinks are not added by the kernels: the layer is refused before any step, so
    that start-up names the reason (or passes over to the next backend)."""
    sinks = AttentionLayer(0, 8, 2, 64, 0.125, sliding_window=128, sinks=torch.zeros(8))
    reasons = FlashInferAttentionBackend.supports_layer(sinks)
    assert len(reasons) == 1 and "attention sinks" in reasons[0], reasons
    assert "runner.attention_backend: triton" in reasons[0]


def _cast(storage: torch.dtype, name: str = "auto", **options: Any) -> tuple[Any, list]:
    from tallow.kernels import CastKVCodec

    codec = CastKVCodec(storage=storage, **options)
    codec.name = name  # type: ignore[misc]
    return codec, codec.layout(
        num_kv_heads=2, head_dim=64, block_size=16, model_dtype=torch.bfloat16
    )


def test_it_names_the_cast_codecs_it_reads() -> None:
    """auto of the core and the codecs of tallow-kvcache-fp8, by their registered names."""
    from tallow_kvcache_fp8.codec import FP8E4M3KVCodec, FP8E5M2KVCodec

    assert FlashInferAttentionBackend.fused_kv_codecs == {
        "auto",
        FP8E4M3KVCodec.name,
        FP8E5M2KVCodec.name,
    }


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("auto", torch.bfloat16),
        ("auto", torch.float16),
        ("fp8", torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float8_e5m2),
    ],
    ids=str,
)
def test_kv_caches_it_reads(name: str, dtype: torch.dtype) -> None:
    assert FlashInferAttentionBackend(config()).supports_kv_codec(*_cast(dtype, name)) == []


def test_kv_caches_it_refuses() -> None:
    backend = FlashInferAttentionBackend(config())
    assert backend.supports_kv_codec(*_cast(torch.float32)) == [
        "kv codec 'auto': cache dtype torch.float32 is not supported (FlashInfer's kernels "
        "read float16, bfloat16, float8_e4m3fn, float8_e5m2)"
    ]
    assert backend.supports_kv_codec(*_cast(torch.float8_e4m3fn, "fp8", per_head_scales=True)) == [
        "kv codec 'fp8' stores per-head K/V scales (FlashInfer takes at most one scalar scale "
        "for all heads); use the codec without them, or runner.attention_backend: triton"
    ]
    assert backend.supports_kv_codec(*_cast(torch.float8_e4m3fn, "fp8", center_keys=True)) == [
        "kv codec 'fp8' stores centred keys (FlashInfer's kernels take no key offset); use the "
        "codec without them, or runner.attention_backend: triton"
    ]
    codec, layout = _cast(torch.bfloat16, "turbo4")
    assert backend.supports_kv_codec(codec, layout) == [
        "kv codec 'turbo4' is not implemented by this backend (it implements auto, fp8, fp8_e5m2)"
    ]
    codec, layout = _cast(torch.bfloat16)
    packed = [KVTensor("kv", (2, 16, 2, 64), torch.bfloat16)]
    assert backend.supports_kv_codec(codec, packed) == [
        "kv codec 'auto' lays out paged tensors ['kv']; FlashInfer reads exactly a paged 'k' "
        "and 'v'"
    ]
    flat = [KVTensor("k", (16, 128), torch.bfloat16), KVTensor("v", (16, 128), torch.bfloat16)]
    assert (
        "FlashInfer reads 'k' and 'v' pages of one shape"
        in backend.supports_kv_codec(codec, flat)[0]
    )
    fa3 = FlashInferAttentionBackend(config(settings={"prefill_backend": "fa3"}))
    assert fa3.supports_kv_codec(*_cast(torch.bfloat16)) == []
    assert fa3.supports_kv_codec(*_cast(torch.float8_e4m3fn, "fp8")) == [
        f"plugins.settings.{SETTINGS}.prefill_backend 'fa3': FA3 reads an 8-bit cache only "
        "with 8-bit queries (use auto or fa2)"
    ]


def test_turbo_codecs_are_refused() -> None:
    from tallow_kvcache_turboquant.codec import Turbo4KVCodec

    codec = Turbo4KVCodec()
    layout = codec.layout(num_kv_heads=2, head_dim=64, block_size=16, model_dtype=torch.bfloat16)
    reasons = FlashInferAttentionBackend(config()).supports_kv_codec(codec, layout)
    assert reasons and "kv codec 'turbo4' is not implemented by this backend" in reasons[0]


# -- selection ---------------------------------------------------------------------------------
class _AcceptsAll(AttentionBackend):
    name: ClassVar[str] = "triton-like"

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        return []

    def __init__(self, config: Any = None) -> None:
        pass


def test_auto_selection_passes_over_it_with_its_reasons_logged(monkeypatch, caplog) -> None:
    """Even ranked first (the one-line priority change), a flashinfer that cannot serve gives
    way to the next backend, and the log says why."""
    monkeypatch.setattr(availability, "flashinfer_version", lambda: None)
    reg = AttentionBackendRegistry()
    reg.register("flashinfer", FlashInferAttentionBackend, priority=200)
    reg.register("triton-like", _AcceptsAll, priority=100)
    with caplog.at_level(logging.INFO):
        assert select(reg, config(device="cpu")).name == "triton-like"
    assert "passed over: flashinfer: flashinfer is not installed" in caplog.text


def test_a_layer_it_cannot_run_passes_it_over(gpu_machine, caplog) -> None:
    """The engine's check after validate: each layer through supports_layer (as
    tallow.engine.builder does)."""
    reg = AttentionBackendRegistry()
    reg.register("flashinfer", FlashInferAttentionBackend, priority=200)
    reg.register("triton-like", _AcceptsAll, priority=100)
    layers = [layer(128), layer(80)]

    def check(entry: Any) -> list[str]:
        backend = entry.load()(config())
        return sorted(
            {r for lay in layers for r in getattr(backend, "supports_layer", lambda _: [])(lay)}
        )

    with caplog.at_level(logging.INFO):
        assert select(reg, config(), check=check).name == "triton-like"
    assert "flashinfer: head size 80 is not one FlashInfer's kernels are built for" in caplog.text


def test_named_explicitly_it_stops_start_up_with_the_reasons(monkeypatch) -> None:
    monkeypatch.setattr(availability, "flashinfer_version", lambda: None)
    with pytest.raises(
        SelectionError,
        match=r"'flashinfer' .* cannot serve this configuration"
        r":\n  - flashinfer is not installed",
    ):
        select(registry(), config(device="cpu"), "flashinfer")


# -- inputs ------------------------------------------------------------------------------------
def test_forward_refuses_cpu_tensors_and_bad_shapes() -> None:
    from tallow.plugin.testing.paged_batch import random_paged_step

    step = random_paged_step(
        query_lens=[3, 1],
        context_lens=[0, 5],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.bfloat16,
    )
    backend = FlashInferAttentionBackend(config())
    with pytest.raises(ValueError, match="tensors must be on one CUDA device"):
        backend.forward(step.layer, step.q, step.k, step.v, step.kv_cache, step.meta)
    with pytest.raises(
        ValueError,
        match=r"q, k, v and meta.slot_mapping must have the same "
        r"number of rows, got 4, 3",
    ):
        backend.forward(step.layer, step.q, step.k[:3], step.v, step.kv_cache, step.meta)
    half = step.kv_cache.with_tensors({n: t.half() for n, t in step.kv_cache.tensors.items()})
    with pytest.raises(ValueError, match=r"kv_cache dtype torch.float16 must be q's"):
        backend.forward(step.layer, step.q, step.k, step.v, half, step.meta)
    with pytest.raises(
        ValueError,
        match=r"q, k and v must all be one of float16, bfloat16, got "
        r"torch.float32",
    ):
        backend.forward(step.layer, step.q.float(), step.k, step.v, step.kv_cache, step.meta)
