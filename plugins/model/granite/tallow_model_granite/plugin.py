"""Registration of the Granite architecture (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register(
        "GraniteForCausalLM", "tallow_model_granite.model:GraniteForCausalLM", gguf=("granite",)
    )
