"""GLM-4.5's multi-token prediction layer (DeepSeek-V3's, tallow_model_deepseek.mtp, around a
GLM decoder layer) under ``speculative.method: mtp``, on a tiny checkpoint that ships it under
its real names: one step equals the formula (transformers' GLM layer as the block's oracle),
greedy outputs equal those without speculation, and the model alone still skips the layer."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_format_safetensors", reason="the checkpoint is safetensors")

from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.mtp import (  # noqa: E402
    assert_mtp_keeps_greedy_outputs,
    reference_mtp_logits,
    reference_mtp_step,
    save_mtp_checkpoint,
)
from tallow.plugin.testing.seeds import seed_of  # noqa: E402

from glm_configs import CONFIG, PROMPT  # noqa: E402

EPS = float(CONFIG["rms_norm_eps"])
ATOL = 2e-4  # float32: rounding only


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("glm-mtp")
    hf, own = save_mtp_checkpoint(
        path,
        transformers.Glm4MoeConfig,
        transformers.Glm4MoeForCausalLM,
        dict(CONFIG),
        seed_of("glm-mtp"),
    )
    return path, hf, own


def make(path, method: str | None = "mtp"):
    config = {
        "model": {"dtype": "float32", "max_model_len": 64},
        "cache": {"block_size": 4, "num_blocks": 48},
        "scheduler": {"max_num_batched_tokens": 32, "prefill_chunk_size": 8, "max_num_seqs": 4},
    }
    if method:
        config["speculative"] = {"method": method, "num_speculative_tokens": 3}
    return offline_llm(
        str(path), plugins=["tallow-model-glm4-moe", "tallow-format-safetensors"], config=config
    )


def test_one_mtp_step_equals_the_formula(checkpoint):
    path, hf, own = checkpoint
    mtp = make(path).engine.core.spec.speculator.mtp
    gen = torch.Generator().manual_seed(seed_of("glm-mtp", "step"))
    tokens = PROMPT[:11]
    hidden = torch.randn(10, int(CONFIG["hidden_size"]), generator=gen)
    ((logits, out),) = mtp.sync([(("r", 0), tokens, hidden, 0, 1)])
    want = reference_mtp_step(hf, own, tokens[1:], hidden, EPS)
    torch.testing.assert_close(out, want[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits, reference_mtp_logits(own, want[-1], EPS), atol=ATOL, rtol=0)
    logits2, out2 = mtp.extend([(("r", 0), 7, out)])
    want = reference_mtp_step(hf, own, [*tokens[1:], 7], torch.cat([hidden, out[None]]), EPS)
    torch.testing.assert_close(out2[0], want[-1], atol=ATOL, rtol=0)
    mtp.free("r", 0)
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks


def test_greedy_outputs_equal_those_without_mtp(checkpoint):
    path, _, _ = checkpoint
    assert_mtp_keeps_greedy_outputs(
        make(path, None), make(path), [PROMPT[:9], PROMPT[3:20], PROMPT[:4]]
    )
