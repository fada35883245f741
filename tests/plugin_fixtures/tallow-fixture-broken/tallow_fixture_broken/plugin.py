"""A plugin whose module raises on import."""

raise RuntimeError("tallow-fixture-broken fails on import on purpose")
