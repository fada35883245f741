"""A plugin that registers one component, then raises in a later registration hook."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_kv_codecs(registry) -> None:
    registry.register(
        "fixture-halfway-kv", "tallow_fixture_halfway.plugin:tallow_register_kv_codecs"
    )


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    raise ValueError("tallow-fixture-halfway fails in its second registration hook")


@hookimpl
def tallow_configure(config) -> None:
    raise AssertionError("a plugin that failed to load must never see tallow_configure")
