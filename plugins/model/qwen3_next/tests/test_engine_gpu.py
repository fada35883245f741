"""Qwen3-Next on a GPU: float32 parity with transformers through the Triton kernels (the
chunked gated delta rule and its one-token step, the causal conv, gated attention, experts),
and the engine with CUDA graphs against eager steps (the linear-attention layers' decode
kernels captured over state slots, padding rows on the dummy slot)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_qwen3_next.model import Qwen3NextForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import GPU_CONFIG as CONFIG  # noqa: E402
from tiny_config import LONG_PROMPT as PROMPT  # noqa: E402


def test_cuda_parity(tmp_path):
    from tallow_format_safetensors.format import SafetensorsFormat

    hf = random_hf_model(transformers.Qwen3NextConfig(**CONFIG), seed=8)
    assert_cuda_parity(
        lambda **kw: load_saved(hf, tmp_path, Qwen3NextForCausalLM, SafetensorsFormat().load, **kw),
        hf,
        PROMPT,
        32,
        what="qwen3-next",
    )


# The tiny shape runs in float32: its random weights give near-uniform logits, whose
# bfloat16 values often tie exactly, so padded graph batches (their matrix products and
# split-K attention round differently from the unpadded eager batch) may flip a greedy token.
# The 12-layer shape (41 GB in bfloat16) cannot double. tol bounds the log-prob drift between
# the two paths (each within tol / 2, so a flip needs a runner-up within tol): float32 rounding
# moves log-probs by far less than 1e-3, bfloat16 rounding over 12 layers by a few hundredths;
# a wrong recurrent or conv state moves them by the spread of the logits.
@pytest.mark.parametrize(
    "shape,dtype,tol",
    [
        ("tiny-qwen3-next", "float32", 1e-3),
        pytest.param("qwen3-next-12l", "bfloat16", 0.25, marks=pytest.mark.gpu_alone),
    ],
)
def test_cuda_graphs_equal_eager(shape, dtype, tol):
    """Greedy tokens of batches of 1, 4 and 16 prompts (some past several chunks), with
    decode steps replayed from CUDA graphs, then run eagerly by the same engine (its graphs
    set aside: the 12-layer shape holds 41 GB, too much for two engines on one card): the
    log-probs agree within tol / 2 and the tokens are equal up to a near-tie of the eager run
    (assert_greedy_agrees), with most positions compared."""
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow.plugin.testing.engine import assert_greedy_agrees, replay_own_graph_sizes

    vocab = 512 if shape.startswith("tiny") else 151936
    g = torch.Generator().manual_seed(0)
    batches = [
        [
            torch.randint(0, vocab, (int(n),), generator=g).tolist()
            for n in torch.randint(3, 400, (size,), generator=g)
        ]
        for size in (1, 4, 16)
    ]
    eng = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": f"random:{shape}",
                    "device": "cuda",
                    "dtype": dtype,
                    "max_model_len": 1024,
                },
                "cache": {"num_blocks": 1024},
                "runner": {"max_cuda_graph_batch": 16},
            }
        )
    )
    runner = eng.core.runner
    assert runner.graphs is not None, "no CUDA graphs were captured"
    replay_own_graph_sizes(eng)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)

    def run() -> list[list]:
        results = []
        for batch in batches:
            ids = []
            for p in batch:
                ids.append(eng.next_request_id())
                eng.add_request(ids[-1], p, params)
            done = {}
            while eng.has_unfinished():
                for out in eng.step():
                    if out.finished:
                        done[out.request_id] = out.outputs[0]
            results.append([done[i] for i in ids])
        manager = eng.core.scheduler.block_manager
        assert manager.num_free_state_slots() == manager.states[0].num_slots
        return results

    with_graphs = run()
    graphs, runner.graphs = runner.graphs, None
    try:
        eager = run()
    finally:
        runner.graphs = graphs
    total = compared = 0
    for size, a, b in zip((1, 4, 16), with_graphs, eager):
        compared += assert_greedy_agrees(a, b, tol=tol, what=f"{shape}, batch of {size}")
        total += 16 * size
    assert compared >= 0.8 * total, f"only {compared} of {total} positions compared"
