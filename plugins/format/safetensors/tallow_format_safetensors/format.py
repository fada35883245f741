"""The ``safetensors`` weight format: a local Hugging Face model directory."""

from __future__ import annotations

import os
from typing import ClassVar

from tallow.plugin import Checkpoint, WeightFormat

from .loader import is_model_directory, load_directory


class SafetensorsFormat(WeightFormat):
    """A directory with ``config.json`` and ``*.safetensors`` (sharded or not)."""

    name: ClassVar[str] = "safetensors"

    @classmethod
    def claims(cls, source: str) -> bool:
        return isinstance(source, str) and is_model_directory(os.path.expanduser(source))

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        """Read ``source`` (``~`` expanded); ``revision`` has no meaning for a local directory
        and is ignored."""
        return load_directory(os.path.expanduser(source), source=source)
