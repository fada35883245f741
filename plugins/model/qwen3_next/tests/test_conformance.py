"""Qwen3-Next against tallow's model conformance suite: transformers on the same tiny random
weights (linear-attention layers on state slots, a gated full-attention layer, experts with a
gated shared expert), 32 greedy tokens, a flat batch of chunked sequences (the state carried
between chunks) and the whole engine through tallow-format-safetensors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

from tallow.plugin.testing import ModelArchitectureConformance

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

PROMPT = [
    3,
    17,
    50,
    9,
    64,
    28,
    5,
    77,
    31,
    20,
    1,
    42,
    99,
    120,
    7,
    63,
    88,
    14,
    101,
    36,
    55,
    111,
    24,
    92,
    70,
    12,
    127,
    46,
    83,
    2,
]


class TestQwen3NextConformance(ModelArchitectureConformance):
    distribution = "tallow-model-qwen3-next"
    component = "Qwen3NextForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen3NextConfig(**TINY)
