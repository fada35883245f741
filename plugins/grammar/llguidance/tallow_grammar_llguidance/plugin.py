"""Registration of the llguidance grammar backend (imports neither llguidance nor torch)."""

from __future__ import annotations

from tallow.plugin import hookimpl, plugin_settings

DISTRIBUTION = "tallow-grammar-llguidance"


@hookimpl
def tallow_configure(config) -> None:
    # Bad settings stop start-up here, naming the key, before any model is loaded.
    from .settings import LLGuidanceSettings

    plugin_settings(LLGuidanceSettings, config, DISTRIBUTION)


@hookimpl
def tallow_register_grammar_backends(registry) -> None:
    # below xgrammar (100): `auto` keeps xgrammar, `runner.grammar_backend: llguidance` picks this
    registry.register(
        "llguidance", "tallow_grammar_llguidance.backend:LLGuidanceBackend", priority=50
    )
