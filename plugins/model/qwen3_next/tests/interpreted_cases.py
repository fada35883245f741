"""Qwen3-Next with its Triton kernels in the Triton interpreter (``test_interpreted.py``
runs this module with ``TRITON_INTERPRET=1``): the model's linear-attention layers hand the
kernels strided views of their projections, so parity with transformers here checks the
layer's use of the kernels, not only the kernels."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.kernels import interpreting, triton_enabled  # noqa: E402
from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing import PagedRunner  # noqa: E402
from tallow.plugin.testing.model import (  # noqa: E402
    assert_close_logits,
    hf_greedy,
    random_hf_model,
)

from tallow_model_qwen3_next.model import Qwen3NextForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

# past the first 64-token chunk of the delta rule
PROMPT = [(37 * i + 11) % 128 for i in range(70)]
STEPS = 4


def test_greedy_parity_through_the_triton_kernels(monkeypatch):
    assert interpreting() and os.environ.get("TRITON_INTERPRET") == "1"
    import tallow_model_qwen3_next.gated_deltanet as layer

    calls: dict[str, int] = {}

    def counted(name):
        fn = getattr(layer, name)

        def wrapper(x, *args, **kwargs):
            # the entry point runs its Triton kernel for this tensor (its dispatch rule)
            assert triton_enabled(x), f"{name} would run its torch reference"
            calls[name] = calls.get(name, 0) + 1
            return fn(x, *args, **kwargs)

        monkeypatch.setattr(layer, name, wrapper)

    for name in (
        "causal_conv1d",
        "causal_conv1d_update",
        "chunk_gated_delta_rule",
        "gated_delta_step",
        "gated_rms_norm",
    ):
        counted(name)
    hf = random_hf_model(transformers.Qwen3NextConfig(**TINY), seed=5)
    model = Qwen3NextForCausalLM(ArchConfig(hf.config.to_dict()), BuildContext())
    model.load_weights(iter(hf.state_dict().items()), naming="hf")
    ref_tokens, ref_logits, ref_prompt = hf_greedy(hf, PROMPT, STEPS)
    # 128 positions: the prompt crosses the first chunk
    tokens, logits, prompt_logits = PagedRunner(model.eval(), blocks_per_seq=32).greedy(
        0, PROMPT, STEPS
    )
    assert_close_logits(prompt_logits, ref_prompt, "prompt logits")
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        assert_close_logits(ours, ref, f"logits of step {i}")
    assert tokens == ref_tokens
    # three linear-attention layers: one prefill and four decode steps each
    assert calls == {
        "causal_conv1d": 3,
        "chunk_gated_delta_rule": 3,
        "gated_rms_norm": 15,
        "causal_conv1d_update": 12,
        "gated_delta_step": 12,
    }, calls
