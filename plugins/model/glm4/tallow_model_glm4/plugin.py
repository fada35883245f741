"""Registration of the GLM-4 architecture (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("Glm4ForCausalLM", "tallow_model_glm4.model:Glm4ForCausalLM", gguf=("glm4",))
