"""A plugin that replaces the core's torch attention backend, saying so with override=True."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    registry.register(
        "torch",
        "tallow_fixture_override.plugin:tallow_register_attention_backends",
        priority=-50,
        override=True,
    )
