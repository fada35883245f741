"""Registration of the triton attention backend (the module named by the entry point)."""

from __future__ import annotations

from tallow.plugin import hookimpl

#: above the core's torch reference backend (-100), so it wins wherever it can serve
PRIORITY = 100


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    registry.register(
        "triton", "tallow_attention_triton.backend:TritonAttentionBackend", priority=PRIORITY
    )
