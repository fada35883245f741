"""Granite 3 against transformers on tiny random models (safetensors and GGUF), and the plugin's
registration.

A model is saved by transformers, read back through a weight format into ``GraniteForCausalLM``
and run through a paged KV cache: the prompt's logits, 20 greedy tokens and every step's logits
must match transformers' forward and greedy ``generate``. The multipliers are far from 1 so that
a missing one shows. The GGUF file is written like llama.cpp's converter writes ``granite``:
the ``gguf`` package's name map, Q/K rows permuted as for ``llama``, the multipliers under their
``*_scale`` keys.
"""

from __future__ import annotations

import zlib
from importlib.metadata import entry_points

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin import ArchitectureRegistry  # noqa: E402
from tallow.plugin.model_testing import (  # noqa: E402
    PagedRunner, assert_close_logits, assert_greedy_parity, gguf_tensors, load_model,
    random_hf_model, write_gguf,
)
from tallow.plugin.testing import modules_imported_by_registration  # noqa: E402
from tallow_safetensors.format import SafetensorsFormat  # noqa: E402

from tallow_granite import plugin  # noqa: E402
from tallow_granite.model import GraniteForCausalLM  # noqa: E402

STEPS = 20
MULTIPLIERS = dict(embedding_multiplier=2.0, residual_multiplier=1.5,
                   attention_multiplier=0.09, logits_scaling=4.0)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, rms_norm_eps=1e-5,
             max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
             pad_token_id=None)
CONFIGS = {
    # Granite 3 ties its head to the embedding
    "granite-tied": lambda: transformers.GraniteConfig(**SMALL, **MULTIPLIERS,
                                                       tie_word_embeddings=True),
    "granite-bias": lambda: transformers.GraniteConfig(**SMALL, **MULTIPLIERS,
                                                       attention_bias=True, mlp_bias=True),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def _hf(name: str):
    # weights a little larger than usual: a tied head over a stream dominated by the input
    # embedding would only echo the last token
    return random_hf_model(CONFIGS[name](), seed=zlib.crc32(name.encode()) % 1000, std=0.15)


def _load_safetensors(hf, path, **kw) -> GraniteForCausalLM:
    hf.save_pretrained(str(path), safe_serialization=True)
    ckpt = SafetensorsFormat().load(str(path))
    assert ckpt.architecture == "GraniteForCausalLM"
    return load_model(GraniteForCausalLM, ckpt, **kw)


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
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    ckpt = SafetensorsFormat().load(str(tmp_path))
    model = load_model(GraniteForCausalLM, ckpt, config={**ckpt.config, key: 1.0})
    wrong = PagedRunner(model).greedy(0, PROMPT, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    assert float((wrong - ref).abs().max()) > 1e-2


def test_a_zero_multiplier_is_refused():
    with pytest.raises(ValueError, match="'logits_scaling' is 0"):
        GraniteForCausalLM(ArchConfig({**SMALL, "logits_scaling": 0}), BuildContext())


def llama_cpp_permute(w, n_head: int):
    """What llama.cpp's converter does to the Q and K rows of ``llama``-lineage models."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_gguf_matches_transformers(tmp_path):
    from tallow_gguf.format import GGUFFormat

    hf = _hf("granite-tied")
    cfg = hf.config

    def permute(name, array):
        if name.endswith("q_proj.weight"):
            return llama_cpp_permute(array, cfg.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return llama_cpp_permute(array, cfg.num_key_value_heads)
        return array

    tensors = gguf_tensors(hf.state_dict(), "granite", cfg.num_hidden_layers,
                           transform=permute, skip=("lm_head.weight",))
    path = tmp_path / "granite.gguf"
    write_gguf(path, "granite", {
        "block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        "rope.dimension_count": 16, "rope.freq_base": 10000.0,
        "attention.scale": 0.09, "embedding_scale": 2.0, "residual_scale": 1.5,
        "logit_scale": 4.0,
    }, tensors, cfg.vocab_size)
    ckpt = GGUFFormat().load(str(path))
    config = GraniteForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    assert {k: round(config[k], 6) for k in MULTIPLIERS} == MULTIPLIERS
    model = load_model(GraniteForCausalLM, ckpt, config=config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="granite GGUF")


def test_gguf_without_attention_scale_uses_the_default():
    metadata = {"general.architecture": "granite", "granite.block_count": 2,
                "granite.embedding_length": 64, "granite.attention.head_count": 4,
                "granite.vocab_size": 256, "granite.embedding_scale": 12.0}
    config = GraniteForCausalLM.config_from_gguf(metadata, {})
    assert config["attention_multiplier"] == 16 ** -0.5 and config["embedding_multiplier"] == 12
    assert "residual_multiplier" not in config and "logits_scaling" not in config


def test_registration_is_lazy():
    eps = {ep.name: ep.value for ep in entry_points(group="tallow")}
    assert eps["tallow-granite"] == "tallow_granite.plugin"
    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    assert registry.get("GraniteForCausalLM") is GraniteForCausalLM
    assert registry.for_gguf("granite").name == "GraniteForCausalLM"
    assert modules_imported_by_registration("tallow_granite.plugin",
                                            "tallow_register_architectures",
                                            "ArchitectureRegistry") == []


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_on_cuda(name, tmp_path):
    """On the GPU, float32 against transformers on the CPU; bfloat16 stays near it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _hf(name)
    model = _load_safetensors(hf, tmp_path / "f32", device="cuda")
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers()])
    assert_greedy_parity(model, hf, PROMPT, STEPS, what=f"{name} on cuda")
    m16 = _load_safetensors(hf, tmp_path / "bf16", dtype=torch.bfloat16, device="cuda")
    l16 = PagedRunner(m16).greedy(0, PROMPT, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    assert_close_logits(l16.cpu(), ref, f"{name}: bfloat16 prompt logits", rel=5e-2)
