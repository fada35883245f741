"""Registration of the DeepSeek architectures (lazy targets: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_deepseek.model"

#: HF architecture name -> class in the model module
ARCHITECTURES: dict[str, str] = {
    "DeepseekV2ForCausalLM": "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLM",
    "Glm4MoeLiteForCausalLM": "Glm4MoeLiteForCausalLM",
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, cls in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}")
