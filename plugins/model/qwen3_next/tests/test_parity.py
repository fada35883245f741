"""Qwen3-Next on the CPU with the GPU tests' config and prompt: the 150-token prompt and 32
greedy steps (past two chunks of the delta rule) match transformers through the parity
helpers the GPU test runs, whose paged runner holds the whole sequence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.plugin.testing import PagedRunner  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_qwen3_next.model import Qwen3NextForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import GPU_CONFIG, LONG_PROMPT  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from tallow_format_safetensors.format import SafetensorsFormat

    hf = random_hf_model(transformers.Qwen3NextConfig(**GPU_CONFIG), seed=8)
    path = tmp_path_factory.mktemp("qwen3-next")
    return hf, load_saved(hf, path, Qwen3NextForCausalLM, SafetensorsFormat().load)


def test_long_prompt_parity_on_the_cpu(saved):
    """The CPU leg of test_engine_gpu.py::test_cuda_parity: 182 tokens, past the 64 of a
    default paged runner."""
    hf, model = saved
    assert len(LONG_PROMPT) + 32 > PagedRunner.blocks_per_seq * PagedRunner.block_size
    assert_greedy_parity(model, hf, LONG_PROMPT, 32, what="qwen3-next")


def test_a_runner_too_small_says_so(saved):
    _, model = saved
    with pytest.raises(ValueError, match=r"150 tokens, more than the 64 .*holding"):
        PagedRunner(model).greedy(0, LONG_PROMPT, 0)
