"""Registration of the OLMo 2 architecture (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register(
        "Olmo2ForCausalLM", "tallow_model_olmo2.model:Olmo2ForCausalLM", gguf=("olmo2",)
    )
