"""Registration of the Qwen3-Next and Qwen3.5 architectures (lazy targets: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

#: HF architecture name -> "module:class"
ARCHITECTURES = {
    "Qwen3NextForCausalLM": "tallow_model_qwen3_next.model:Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM": "tallow_model_qwen3_next.qwen3_5:Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": "tallow_model_qwen3_next.qwen3_5:Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration": "tallow_model_qwen3_next.qwen3_5:Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": "tallow_model_qwen3_next.qwen3_5:Qwen3_5MoeForConditionalGeneration",
}


#: HF architecture name -> the llama.cpp GGUF architectures its class also serves
GGUF_ARCHITECTURES = {
    "Qwen3NextForCausalLM": ("qwen3next",),
    "Qwen3_5ForCausalLM": ("qwen35",),
    "Qwen3_5MoeForCausalLM": ("qwen35moe",),
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for name, target in ARCHITECTURES.items():
        registry.register(name, target, gguf=GGUF_ARCHITECTURES.get(name, ()))
