"""Registration of the flashinfer attention backend (the module named by the entry point)."""

from __future__ import annotations

from tallow.plugin import hookimpl

#: below the triton backend (100) until measurements say otherwise, above the torch
#: reference (-100): automatic selection takes flashinfer only where triton cannot serve
PRIORITY = 50


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    registry.register(
        "flashinfer",
        "tallow_attention_flashinfer.backend:FlashInferAttentionBackend",
        priority=PRIORITY,
    )
