"""Registration of the Qwen2.5-VL, Qwen2-VL and Qwen3-VL architectures (lazy targets: no
torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    for name in (
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
    ):
        registry.register(name, f"tallow_model_qwen2_vl.model:{name}")
