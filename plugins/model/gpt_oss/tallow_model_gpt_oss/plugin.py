"""Registration of the gpt-oss architecture (a lazy target: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_gpt_oss.model"

#: HF architecture name -> class in the model module
ARCHITECTURES: dict[str, str] = {
    "GptOssForCausalLM": "GptOssForCausalLM",
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, cls in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}")
