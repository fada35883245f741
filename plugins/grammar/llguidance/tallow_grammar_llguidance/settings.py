"""``plugins.settings.tallow-grammar-llguidance``."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


def _default_threads() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class LLGuidanceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: threads that fill the masks of a step's constrained rows
    max_threads: int = Field(default_factory=_default_threads, gt=0, le=256)
    #: let JSON outputs hold whitespace between tokens (off: compact JSON, the form that
    #: small models cannot pad with runs of spaces and newlines)
    any_whitespace: bool = False
    #: a step with at least this many constrained rows fills them on ``max_threads`` threads
    parallel_rows: int = Field(8, gt=0)
