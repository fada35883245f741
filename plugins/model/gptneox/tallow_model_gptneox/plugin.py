"""Registration of the architectures (lazy targets: no torch imported here)."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("GPTNeoXForCausalLM", "tallow_model_gptneox.model:GPTNeoXForCausalLM")
    registry.register("StableLmForCausalLM", "tallow_model_gptneox.stablelm:StableLmForCausalLM")
