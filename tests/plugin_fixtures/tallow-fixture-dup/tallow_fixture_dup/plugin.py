"""A plugin that registers a name the core already has, without override."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    registry.register("torch", "tallow_fixture_dup.plugin:tallow_register_attention_backends")
