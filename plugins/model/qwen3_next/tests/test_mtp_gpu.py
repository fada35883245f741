"""``speculative.method: mtp`` on a GPU with the tiny full-attention Qwen3-Next checkpoint of
``test_mtp.py``: greedy outputs equal those without speculation (float32; the target's CUDA
graphs on and off; verify steps and the head's forwards run eagerly) and the head's cache is
empty afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

pytest.importorskip("transformers", reason="the checkpoint is saved from transformers")
pytest.importorskip("tallow_format_safetensors", reason="the checkpoint is safetensors")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.seeds import seed_of  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_mtp import FULL, PLUGINS, PROMPT, save  # noqa: E402


@pytest.mark.parametrize("graphs", [False, True])
def test_mtp_greedy_outputs_on_cuda(tmp_path, graphs):
    save(tmp_path, FULL, seed_of("qwen3-next-mtp-gpu"))
    llm = offline_llm(
        str(tmp_path),
        plugins=PLUGINS,
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
    prompts = [PROMPT[: 4 + 3 * i] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    core.enable_speculation(spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == want
    assert core.stats()["spec_num_proposed_tokens"] > 0
    mtp = spec.speculator.mtp
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
