"""Granite 3 against transformers on tiny random models, its multipliers far from 1 so that a
missing one shows: from safetensors, and from a GGUF file as llama.cpp's converter writes
``granite`` (the ``gguf`` package's name map, Q/K rows permuted as for ``llama``, the
multipliers under their ``*_scale`` keys). The conformance suite: test_conformance.py."""

from __future__ import annotations

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors, write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_engine_greedy,
    assert_greedy_parity,
    load_model,
    load_saved,
    random_hf_model,
)
from tallow.plugin.testing.paged_runner import PagedRunner  # noqa: E402
from tallow_format_safetensors.format import SafetensorsFormat  # noqa: E402

from tallow_model_granite.model import GraniteForCausalLM  # noqa: E402

STEPS = 20
MULTIPLIERS = dict(
    embedding_multiplier=2.0, residual_multiplier=1.5, attention_multiplier=0.09, logits_scaling=4.0
)
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
CONFIGS = {
    # Granite 3 ties its head to the embedding
    "granite-tied": lambda: transformers.GraniteConfig(
        **SMALL, **MULTIPLIERS, tie_word_embeddings=True
    ),
    "granite-bias": lambda: transformers.GraniteConfig(
        **SMALL, **MULTIPLIERS, attention_bias=True, mlp_bias=True
    ),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def _hf(name: str):
    # weights a little larger than usual: a tied head over a stream dominated by the input
    # embedding would only echo the last token
    return random_hf_model(CONFIGS[name](), seed=zlib.crc32(name.encode()) % 1000, std=0.15)


def _load_safetensors(hf, path, **kw) -> GraniteForCausalLM:
    return load_saved(hf, path, GraniteForCausalLM, SafetensorsFormat().load, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path):
    hf = _hf(name)
    model = _load_safetensors(hf, tmp_path)
    assert model.model.layers[0].self_attn.attn.layer.scale == 0.09
    assert_greedy_parity(model, hf, PROMPT, STEPS, what=name)


@pytest.mark.parametrize("key", list(MULTIPLIERS))
def test_every_multiplier_matters(key, tmp_path):
    """Setting one multiplier back to 1 changes the logits: the parity above covers each."""
    hf = _hf("granite-tied")
    model = _load_safetensors(hf, tmp_path, config={key: 1.0})
    wrong = PagedRunner(model).greedy(0, PROMPT, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    assert float((wrong - ref).abs().max()) > 1e-2


def test_a_zero_multiplier_is_refused():
    with pytest.raises(ValueError, match="'logits_scaling' is 0"):
        GraniteForCausalLM(ArchConfig({**SMALL, "logits_scaling": 0}), BuildContext())


def llama_cpp_permute(w, n_head: int):
    """What llama.cpp's converter does to the Q and K rows of ``llama``-lineage models."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_gguf_matches_transformers(tmp_path):
    from tallow_format_gguf.format import GGUFFormat

    hf = _hf("granite-tied")
    cfg = hf.config

    def permute(name, array):
        if name.endswith("q_proj.weight"):
            return llama_cpp_permute(array, cfg.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return llama_cpp_permute(array, cfg.num_key_value_heads)
        return array

    tensors = gguf_tensors(
        hf.state_dict(),
        "granite",
        cfg.num_hidden_layers,
        transform=permute,
        skip=("lm_head.weight",),
    )
    path = tmp_path / "granite.gguf"
    write_gguf(
        path,
        "granite",
        gguf_metadata(
            cfg,
            **{
                "attention.scale": 0.09,
                "embedding_scale": 2.0,
                "residual_scale": 1.5,
                "logit_scale": 4.0,
            },
        ),
        tensors,
        cfg.vocab_size,
    )
    ckpt = GGUFFormat().load(str(path))
    config = GraniteForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    assert {k: round(config[k], 6) for k in MULTIPLIERS} == MULTIPLIERS
    model = load_model(GraniteForCausalLM, ckpt, config=config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="granite GGUF")


def test_gguf_without_attention_scale_uses_the_default():
    metadata = {
        "general.architecture": "granite",
        "granite.block_count": 2,
        "granite.embedding_length": 64,
        "granite.attention.head_count": 4,
        "granite.vocab_size": 256,
        "granite.embedding_scale": 12.0,
    }
    config = GraniteForCausalLM.config_from_gguf(metadata, {})
    assert config["attention_multiplier"] == 16**-0.5 and config["embedding_multiplier"] == 12
    assert "residual_multiplier" not in config and "logits_scaling" not in config


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_on_cuda(name, tmp_path):
    """On the GPU, float32 against transformers on the CPU; bfloat16 stays near it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _hf(name)
    assert_cuda_parity(
        lambda **kw: _load_safetensors(hf, tmp_path, **kw), hf, PROMPT, STEPS, what=name
    )


@pytest.mark.gpu
def test_through_the_engine_on_cuda(tmp_path):
    """The engine on the GPU: Triton attention, CUDA graphs for the decode steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _hf("granite-tied")
    _load_safetensors(hf, tmp_path)
    assert_engine_greedy(
        tmp_path,
        hf,
        [PROMPT, PROMPT[::-1][:7]],
        STEPS,
        plugins=["tallow-model-granite", "tallow-format-safetensors", "tallow-attention-triton"],
        config={"model": {"device": "cuda"}},
    )
