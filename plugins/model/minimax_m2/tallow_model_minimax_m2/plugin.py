"""Registration of the MiniMax M2 architecture (a lazy target: no torch here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("MiniMaxM2ForCausalLM", "tallow_model_minimax_m2.model:MiniMaxM2ForCausalLM")
