"""A well-behaved plugin: registers lazily, reads its settings in tallow_configure."""

from tallow.plugin import hookimpl

#: the settings this plugin received through tallow_configure (inspected by the tests)
received_settings: list[dict] = []


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    registry.register("fixture-attn", "tallow_fixture_good.backend:FixtureBackend", priority=5)


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    registry.register("fixture-parser", "tallow_fixture_good.backend:FixtureParser")


@hookimpl
def tallow_configure(config) -> None:
    received_settings.append(dict(config.plugins.settings.get("tallow-fixture-good", {})))
