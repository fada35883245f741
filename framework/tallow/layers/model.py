"""What every model class is built from: its config and the build context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


class ArchConfig(dict):
    """An HF-style ``config.json`` with attribute access (``cfg.hidden_size``).

    Missing keys read as AttributeError (use ``cfg.get(key, default)`` for optional ones).
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"model config has no {key!r}") from None

    def __setattr__(self, key: str, value: object) -> None:
        self[key] = value

    def require(self, key: str) -> Any:
        """The value of ``key``; a ValueError naming the key when it is absent or null."""
        value = self.get(key)
        if value is None:
            raise ValueError(f"model config: {key!r} is required")
        return value

    @property
    def text(self) -> "ArchConfig":
        """The language-model part of a multimodal config (``text_config``), else itself."""
        sub = self.get("text_config")
        return ArchConfig(sub) if isinstance(sub, dict) else self


@dataclass
class BuildContext:
    """How to build a model: where, in which dtype, with which quantization and parallelism."""

    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: a tallow.plugin.QuantScheme instance, or None for plain weights (asked for its optional
    #: factories by name: :func:`tallow.layers.linear_method.linear_method_for`)
    quant: object = None
    tp_rank: int = 0
    tp_size: int = 1
    #: mixture-of-experts layers place whole experts on the tensor-parallel ranks instead of
    #: splitting each along its intermediate size (``parallel.enable_expert_parallel``)
    expert_parallel: bool = False
    #: what the engine will run: "generate" (tokens from logits) or "embed" (pooled hidden
    #: states; a model may then leave out its LM head)
    task: str = "generate"
    #: build the checkpoint's multi-token prediction layers too (``speculative.method: mtp``);
    #: a model that has them keeps them out of its forward and hands them out through
    #: ``mtp_head()``; without this flag their checkpoint tensors are skipped
    mtp: bool = False
