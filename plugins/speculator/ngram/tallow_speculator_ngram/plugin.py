"""Registration of the speculators (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_speculators(registry) -> None:
    registry.register("ngram", "tallow_speculator_ngram.ngram:NgramSpeculator")
    registry.register("replay", "tallow_speculator_ngram.replay:ReplaySpeculator")
