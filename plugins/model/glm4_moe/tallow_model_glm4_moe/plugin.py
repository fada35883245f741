"""Registration of the GLM-4.5 MoE architecture (a lazy target: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("Glm4MoeForCausalLM", "tallow_model_glm4_moe.model:Glm4MoeForCausalLM")
