"""Registration of the Qwen2.5-VL architecture (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("Qwen2_5_VLForConditionalGeneration",
                      "tallow_model_qwen2_vl.model:Qwen2_5_VLForConditionalGeneration")
