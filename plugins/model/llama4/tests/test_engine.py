"""Llama 4 through the whole engine: a batch of prompts of different lengths (past several
attention chunks) generates transformers' greedy tokens; on a GPU the Triton attention backend,
named in the configuration, serves the chunked layers with its chunk mask."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.plugin.testing.model_parity import assert_engine_greedy, random_hf_model  # noqa: E402

BASE = dict(
    hidden_size=64,
    intermediate_size=48,
    intermediate_size_mlp=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=160,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    attention_chunk_size=8,
    floor_scale=4,
    attn_scale=0.5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
PLUGINS = ["tallow-model-llama4", "tallow-format-safetensors"]


def _saved(tmp_path):
    pytest.importorskip("tallow_format_safetensors", reason="the saved model is read by it")
    hf = random_hf_model(transformers.Llama4TextConfig(**BASE), seed=11)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    return hf


def test_engine_batch_past_chunk_boundaries(tmp_path):
    hf = _saved(tmp_path)
    assert_engine_greedy(tmp_path, hf, [PROMPT, PROMPT[::-1][:7], PROMPT[:17]], 20, plugins=PLUGINS)


@pytest.mark.gpu
def test_engine_on_cuda_with_the_triton_kernels(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _saved(tmp_path)
    assert_engine_greedy(
        tmp_path,
        hf,
        [PROMPT, PROMPT[::-1][:7]],
        20,
        plugins=[*PLUGINS, "tallow-attention-triton"],
        config={"model": {"device": "cuda"}, "runner": {"attention_backend": "triton"}},
    )
