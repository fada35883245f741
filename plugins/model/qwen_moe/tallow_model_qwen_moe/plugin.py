"""Registration of the Qwen mixture-of-experts architectures (lazy targets: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_qwen_moe.model"

#: HF architecture name -> (class in the model module, GGUF architectures it also serves)
ARCHITECTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Qwen3MoeForCausalLM": ("Qwen3MoeForCausalLM", ("qwen3moe",)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeForCausalLM", ("qwen2moe",)),
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, (cls, gguf) in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}", gguf=gguf)
