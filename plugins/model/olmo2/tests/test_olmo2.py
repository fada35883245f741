"""OLMo 2 (post-norms, q/k norms over whole projections) against transformers on tiny random
models, from safetensors and from a GGUF file named by the ``gguf`` package's ``olmo2`` map;
the q/k norm slices under tensor parallelism. The conformance suite: test_conformance.py."""

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
from tallow_format_safetensors.format import SafetensorsFormat  # noqa: E402

from tallow_model_olmo2.model import Olmo2ForCausalLM  # noqa: E402

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
    "olmo2-tied": lambda: transformers.Olmo2Config(**SMALL, tie_word_embeddings=True),
    "olmo2-bias-mha": lambda: transformers.Olmo2Config(
        **{**SMALL, "num_key_value_heads": 4}, attention_bias=True, rope_theta=500000.0
    ),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def _hf(name: str):
    return random_hf_model(CONFIGS[name](), seed=zlib.crc32(name.encode()) % 1000)


def _load_safetensors(hf, path, **kw) -> Olmo2ForCausalLM:
    return load_saved(hf, path, Olmo2ForCausalLM, SafetensorsFormat().load, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path):
    hf = _hf(name)
    model = _load_safetensors(hf, tmp_path)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (64,) and attn.k_norm.weight.shape == (
        16 * hf.config.num_key_value_heads,
    )
    assert not hasattr(model.model.layers[0], "input_layernorm")
    assert_greedy_parity(model, hf, PROMPT, STEPS, what=name)


def test_gguf_matches_transformers(tmp_path):
    from tallow_format_gguf.format import GGUFFormat

    hf = _hf("olmo2-tied")
    cfg = hf.config
    # tied: like llama.cpp's converter, no output.weight; the head ties to token_embd
    tensors = list(
        gguf_tensors(hf.state_dict(), "olmo2", cfg.num_hidden_layers, skip=("lm_head.weight",))
    )
    names = {name for name, _ in tensors}
    assert {
        "blk.0.attn_q_norm.weight",
        "blk.0.post_attention_norm.weight",
        "blk.0.post_ffw_norm.weight",
    } <= names
    assert "blk.0.attn_norm.weight" not in names and "blk.0.ffn_norm.weight" not in names
    path = tmp_path / "olmo2.gguf"
    write_gguf(path, "olmo2", gguf_metadata(cfg), tensors, cfg.vocab_size)
    ckpt = GGUFFormat().load(str(path))
    config = Olmo2ForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    assert config["architectures"] == ["Olmo2ForCausalLM"]
    model = load_model(Olmo2ForCausalLM, ckpt, config=config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="olmo2 GGUF")


@pytest.mark.parametrize("tp,kv_heads", [(2, 2), (4, 2), (4, 1)])
def test_sharded_qk_norms_slice_their_weights(tp, kv_heads):
    """Under tensor parallelism each rank's q/k norm holds the weight slice of its heads;
    ranks that replicate a KV head hold the same slice."""
    cfg = ArchConfig({**SMALL, "num_attention_heads": 4, "num_key_value_heads": kv_heads})
    full_q, full_k = torch.arange(64.0), torch.arange(16.0 * kv_heads)
    for rank in range(tp):
        model = Olmo2ForCausalLM(cfg, BuildContext(tp_rank=rank, tp_size=tp))
        attn = model.model.layers[0].self_attn
        for norm, full in ((attn.q_norm, full_q), (attn.k_norm, full_k)):
            norm.weight.weight_loader(norm.weight, full)
        q_rows = 64 // tp
        k_rows = 16 * max(1, kv_heads // tp)
        k_slice = rank // max(1, tp // kv_heads)
        torch.testing.assert_close(attn.q_norm.weight, full_q[rank * q_rows : (rank + 1) * q_rows])
        torch.testing.assert_close(
            attn.k_norm.weight, full_k[k_slice * k_rows : (k_slice + 1) * k_rows]
        )


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_on_cuda(name, tmp_path):
    """On the GPU (Triton rotary and norm kernels), float32 against transformers on the CPU;
    bfloat16 stays near it."""
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
    hf = _hf("olmo2-tied")
    _load_safetensors(hf, tmp_path)
    assert_engine_greedy(
        tmp_path,
        hf,
        [PROMPT, PROMPT[::-1][:7]],
        STEPS,
        plugins=["tallow-model-olmo2", "tallow-format-safetensors", "tallow-attention-triton"],
        config={"model": {"device": "cuda"}},
    )
