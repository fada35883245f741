"""``speculative.method: mtp`` on a GPU with the tiny DeepSeek-V3 checkpoint of
:mod:`mtp_checkpoint`: greedy outputs equal those without speculation (float32; with the
target's CUDA graphs captured for its plain decode steps, verify steps and the head's forwards
run eagerly), the head's cache is empty afterwards, and the hidden rows the speculator receives
are the target's own (transformers' forward of each sequence on the CPU)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip(
    "transformers", reason="the checkpoint is saved from transformers"
)
pytest.importorskip("tallow_format_safetensors", reason="the checkpoint is safetensors")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.mtp import (  # noqa: E402
    save_mtp_checkpoint,
)
from tallow.plugin.testing.seeds import seed_of  # noqa: E402

from deepseek_configs import PROMPT, SMALL  # noqa: E402

LAYERS = int(SMALL["num_hidden_layers"])


def save(path, seed: int):
    """The tiny V3 checkpoint with its MTP layer (:mod:`tallow.plugin.testing.mtp`)."""
    config = dict(SMALL, q_lora_rank=24, n_group=2, topk_group=1)
    return save_mtp_checkpoint(
        path, transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM, config, seed
    )


@pytest.mark.parametrize("graphs", [False, True])
def test_mtp_greedy_outputs_on_cuda(tmp_path, graphs):
    hf, _ = save(tmp_path, seed_of("deepseek-mtp-gpu"))
    llm = offline_llm(
        str(tmp_path),
        plugins=["tallow-model-deepseek", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 128, "device": "cuda"},
            "cache": {"block_size": 16, "num_blocks": 64},
            "runner": {"disable_cuda_graph": not graphs},
            "scheduler": {"max_num_seqs": 8, "prefill_chunk_size": 16},
            "speculative": {"method": "mtp", "num_speculative_tokens": 3},
        },
    )
    core = llm.engine.core
    spec = core.spec
    prompts = [PROMPT[: 5 + 3 * i] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    core.enable_speculation(spec)
    seen = []
    propose = spec.speculator.propose_batch

    def recording(requests):
        for token_ids, _, ctx in requests:
            if ctx.hidden is not None:
                seen.append((list(token_ids), ctx.hidden_start, ctx.hidden.clone()))
        return propose(requests)

    spec.speculator.propose_batch = recording
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == want
    assert core.stats()["spec_num_proposed_tokens"] > 0
    mtp = spec.speculator.mtp
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
    # the rows against transformers' forward of each sequence (on the CPU, float32)
    hf.model.layers = hf.model.layers[:LAYERS]
    for token_ids, start, rows in seen[:: max(1, len(seen) // 8)]:
        assert start + rows.shape[0] == len(token_ids) - 1
        with torch.no_grad():
            ref = hf.model(torch.tensor([token_ids[:-1]])).last_hidden_state[0]
        torch.testing.assert_close(rows.cpu(), ref[start:], atol=1e-3, rtol=0)
