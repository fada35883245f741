"""Registration of the xgrammar grammar backend (imports neither xgrammar nor torch)."""

from __future__ import annotations

from tallow.plugin import hookimpl, plugin_settings

DISTRIBUTION = "tallow-grammar-xgrammar"


@hookimpl
def tallow_configure(config) -> None:
    # Bad settings stop start-up here, naming the key, before any model is loaded.
    from .settings import XGrammarSettings

    plugin_settings(XGrammarSettings, config, DISTRIBUTION)


@hookimpl
def tallow_register_grammar_backends(registry) -> None:
    registry.register("xgrammar", "tallow_grammar_xgrammar.backend:XGrammarBackend", priority=100)
