"""Registration of the Qwen3-Next architecture (a lazy target: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("Qwen3NextForCausalLM",
                      "tallow_model_qwen3_next.model:Qwen3NextForCausalLM")
