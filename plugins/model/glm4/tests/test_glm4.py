"""GLM-4 against transformers: tiny random models saved as safetensors and as GGUF (named by
the ``gguf`` package's map for ``glm4``), run through a paged KV cache — prompt logits, 20
greedy tokens and every step's logits (:func:`assert_greedy_parity`) — plus the interleaved
rotary layout and the default partial factor. The conformance suite: test_conformance.py."""

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

from tallow_model_glm4.model import Glm4ForCausalLM  # noqa: E402

STEPS = 20
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
    # head_dim 16, half of it rotated (transformers' default partial factor for GLM-4)
    "glm4": lambda: transformers.Glm4Config(**SMALL, head_dim=16),
    # a wider head than hidden / heads, a quarter rotated, tied head, no q/k/v biases
    "glm4-wide-head": lambda: transformers.Glm4Config(
        **SMALL,
        head_dim=32,
        partial_rotary_factor=0.25,
        tie_word_embeddings=True,
        attention_bias=False,
    ),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def _hf(name: str):
    return random_hf_model(CONFIGS[name](), seed=zlib.crc32(name.encode()) % 1000)


def _load_safetensors(hf, path, **kw) -> Glm4ForCausalLM:
    return load_saved(hf, path, Glm4ForCausalLM, SafetensorsFormat().load, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path):
    hf = _hf(name)
    model = _load_safetensors(hf, tmp_path)
    rotary = model.model.rotary_emb
    assert not rotary.is_neox_style
    assert rotary.rotary_dim == 8  # 16 * 0.5 and 32 * 0.25
    assert_greedy_parity(model, hf, PROMPT, STEPS, what=name)


def test_interleaved_rotary_matters(tmp_path):
    """Rotating in the Llama (neox) layout must change the logits: the parity above would
    otherwise not show that GLM's pairing is used."""
    hf = _hf("glm4")
    model = _load_safetensors(hf, tmp_path)
    model.model.rotary_emb.is_neox_style = True
    wrong = PagedRunner(model).greedy(0, PROMPT, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    assert float((wrong - ref).abs().max()) > 1e-2


def test_config_without_partial_factor_rotates_half_of_each_head():
    cfg = {**SMALL, "head_dim": 16, "architectures": ["Glm4ForCausalLM"]}
    assert Glm4ForCausalLM(ArchConfig(cfg), BuildContext()).model.rotary_emb.rotary_dim == 8
    cfg["partial_rotary_factor"] = 1.0
    assert Glm4ForCausalLM(ArchConfig(cfg), BuildContext()).model.rotary_emb.rotary_dim == 16


def test_gguf_matches_transformers(tmp_path):
    """Fused ffn_up (gate|up), q/k/v biases, the two extra norms under llama.cpp's names."""
    from tallow_format_gguf.format import GGUFFormat

    hf = _hf("glm4")
    cfg = hf.config
    tensors = list(gguf_tensors(hf.state_dict(), "glm4", cfg.num_hidden_layers))
    names = {name for name, _ in tensors}
    assert {
        "blk.0.post_attention_norm.weight",
        "blk.0.post_ffw_norm.weight",
        "blk.0.ffn_norm.weight",
        "blk.0.attn_q.bias",
    } <= names
    path = tmp_path / "glm4.gguf"
    metadata = gguf_metadata(cfg)
    assert metadata["rope.dimension_count"] == 8
    write_gguf(path, "glm4", metadata, tensors, cfg.vocab_size)
    ckpt = GGUFFormat().load(str(path))
    config = Glm4ForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    assert config["partial_rotary_factor"] == 0.5 and config["attention_bias"] is True
    model = load_model(Glm4ForCausalLM, ckpt, config=config)
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="glm4 GGUF")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_on_cuda(name, tmp_path):
    """On the GPU (the Triton rotary kernel in the interleaved layout, fused norms), float32
    against transformers on the CPU; bfloat16 stays near it."""
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
    hf = _hf("glm4")
    _load_safetensors(hf, tmp_path)
    assert_engine_greedy(
        tmp_path,
        hf,
        [PROMPT, PROMPT[::-1][:7]],
        STEPS,
        plugins=["tallow-model-glm4", "tallow-format-safetensors", "tallow-attention-triton"],
        config={"model": {"device": "cuda"}},
    )
