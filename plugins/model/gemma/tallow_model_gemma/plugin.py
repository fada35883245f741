"""Registration of the Gemma architectures (lazy targets: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_gemma.model"

# HF architectures name -> (class, GGUF general.architecture values it also serves)
ARCHITECTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Gemma2ForCausalLM": ("Gemma2ForCausalLM", ("gemma2",)),
    "Gemma3ForCausalLM": ("Gemma3ForCausalLM", ("gemma3",)),
    # the text model inside a multimodal checkpoint; its vision tower is not loaded
    "Gemma3ForConditionalGeneration": ("Gemma3ForConditionalGeneration", ()),
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, (cls, gguf) in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}", gguf=gguf)
