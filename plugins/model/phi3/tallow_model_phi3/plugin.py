"""Registration of the Phi-3 architecture (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("Phi3ForCausalLM", "tallow_model_phi3.model:Phi3ForCausalLM", gguf=("phi3",))
