"""Registration of the GPT-NeoX architecture (a lazy target: no torch imported here)."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_architectures(registry) -> None:
    registry.register("GPTNeoXForCausalLM", "tallow_gptneox.model:GPTNeoXForCausalLM")
