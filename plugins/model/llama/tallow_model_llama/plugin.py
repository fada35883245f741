"""Registration of the Llama-family architectures (lazy targets: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_llama.model"

# HF architectures name -> (class, GGUF general.architecture values it also serves)
ARCHITECTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "LlamaForCausalLM": ("LlamaForCausalLM", ("llama",)),
    "MistralForCausalLM": ("MistralForCausalLM", ()),
    "Qwen2ForCausalLM": ("Qwen2ForCausalLM", ("qwen2",)),
    "Qwen3ForCausalLM": ("Qwen3ForCausalLM", ("qwen3",)),
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, (cls, gguf) in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}", gguf=gguf)
