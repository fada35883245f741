"""tallow: an LLM inference and serving engine — a small core plus plugins."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The Python API is imported lazily so that `import tallow` (and plugin listing) stays cheap.
_LAZY = {
    "LLM": "tallow.engine.llm:LLM",
    "SamplingParams": "tallow.engine.sampling.params:SamplingParams",
    "StructuredOutputsParams": "tallow.engine.sampling:StructuredOutputsParams",
    "AsyncEngine": "tallow.engine.async_engine:AsyncEngine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, _, attr = _LAZY[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tallow' has no attribute {name!r}")


__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "AsyncEngine", "__version__"]
