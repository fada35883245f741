"""Registration of the Gemma architectures (lazy targets: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_gemma.model"

# HF architectures name -> (class, GGUF general.architecture values it also serves)
ARCHITECTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Gemma2ForCausalLM": ("Gemma2ForCausalLM", ("gemma2",)),
    "Gemma3ForCausalLM": ("Gemma3ForCausalLM", ("gemma3",)),
}

#: architectures served by another module (name -> "module:class")
VISION_ARCHITECTURES: dict[str, str] = {
    # the text model with its SigLIP vision tower: images in, text out
    "Gemma3ForConditionalGeneration": "tallow_model_gemma.vision_model:Gemma3ForConditionalGeneration",
}

#: Gemma 4: text models, and the text model of the multimodal checkpoints
GEMMA4_ARCHITECTURES: dict[str, str] = {
    "Gemma4ForCausalLM": "tallow_model_gemma.gemma4:Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration": "tallow_model_gemma.gemma4:Gemma4ForConditionalGeneration",
}

#: GGUF ``general.architecture`` values (text model only: llama.cpp writes the vision and audio
#: towers to a separate mmproj file, which tallow does not read)
GEMMA4_GGUF: dict[str, tuple[str, ...]] = {"Gemma4ForCausalLM": ("gemma4",)}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, (cls, gguf) in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}", gguf=gguf)
    for hf_name, target in {**VISION_ARCHITECTURES, **GEMMA4_ARCHITECTURES}.items():
        registry.register(hf_name, target, gguf=GEMMA4_GGUF.get(hf_name, ()))
