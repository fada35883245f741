"""A plugin with a misspelled hook name."""

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_atention_backends(registry) -> None:
    registry.register("never", "tallow_fixture_typo.plugin:x")
