"""Qwen3-MoE and Qwen2-MoE as llama.cpp writes them (``qwen3moe``, ``qwen2moe``: stacked
``ffn_*_exps`` experts, the router ``ffn_gate_inp``, Qwen2-MoE's shared expert and its gate),
written by the ``gguf`` package with float32 tensors, read back through tallow-format-gguf: the config
from the metadata, then logits and 32 greedy tokens against transformers on the same weights."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("gguf", reason="the gguf package writes the files")
pytest.importorskip("tallow_format_gguf", reason="tallow-format-gguf reads the files")

from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors, write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow_format_gguf.format import GGUFFormat  # noqa: E402

from tallow_model_qwen_moe.model import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM  # noqa: E402

BASE = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=160,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
STEPS = 32


def moe_metadata(config, **extra):
    """What llama.cpp's converter writes for a Qwen-MoE config."""
    return gguf_metadata(
        config,
        expert_count=config.num_experts,
        expert_used_count=config.num_experts_per_tok,
        expert_feed_forward_length=config.moe_intermediate_size,
        **extra,
    )


def load_gguf(path, cls):
    ckpt = GGUFFormat().load(str(path))
    assert (
        ckpt.architecture
        == "gguf:" + {Qwen3MoeForCausalLM: "qwen3moe", Qwen2MoeForCausalLM: "qwen2moe"}[cls]
    )
    assert ckpt.quantization is None
    config = cls.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    return config, load_model(cls, ckpt, config=config)


def test_qwen3_moe_gguf_matches_transformers(tmp_path):
    config = transformers.Qwen3MoeConfig(
        **BASE, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True
    )
    hf = random_hf_model(config, seed=11)
    tensors = list(gguf_tensors(hf.state_dict(), "qwen3moe", config.num_hidden_layers))
    names = {name for name, _ in tensors}
    assert {
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_down_exps.weight",
        "blk.0.ffn_gate_inp.weight",
    } <= names
    path = tmp_path / "qwen3moe.gguf"
    write_gguf(path, "qwen3moe", moe_metadata(config), tensors, config.vocab_size)
    cfg, model = load_gguf(path, Qwen3MoeForCausalLM)
    assert (
        cfg["num_experts"],
        cfg["num_experts_per_tok"],
        cfg["moe_intermediate_size"],
        cfg["norm_topk_prob"],
    ) == (8, 2, 32, True)
    assert type(model.model.layers[1].mlp).__name__ == "FusedMoE"
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen3moe GGUF")


def test_qwen2_moe_gguf_with_its_gated_shared_expert(tmp_path):
    """llama.cpp's ``qwen2moe`` does not renormalise the top-k weights; the shared expert's
    size is ``expert_shared_feed_forward_length`` and its gate ``ffn_gate_inp_shexp`` is
    stored as a vector of the hidden size."""
    config = transformers.Qwen2MoeConfig(
        **BASE,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        shared_expert_intermediate_size=40,
    )
    hf = random_hf_model(config, seed=12)

    def as_vector(name, array):
        return array.reshape(-1) if name.endswith("shared_expert_gate.weight") else array

    tensors = list(
        gguf_tensors(hf.state_dict(), "qwen2moe", config.num_hidden_layers, transform=as_vector)
    )
    shapes = {name: array.shape for name, array in tensors}
    assert shapes["blk.0.ffn_gate_inp_shexp.weight"] == (64,)
    assert shapes["blk.0.ffn_gate_shexp.weight"] == (40, 64)
    path = tmp_path / "qwen2moe.gguf"
    write_gguf(
        path,
        "qwen2moe",
        moe_metadata(config, expert_shared_feed_forward_length=40),
        tensors,
        config.vocab_size,
    )
    cfg, model = load_gguf(path, Qwen2MoeForCausalLM)
    assert cfg["shared_expert_intermediate_size"] == 40 and cfg["norm_topk_prob"] is False
    assert model.model.layers[0].mlp.shared_expert_gate is not None
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen2moe GGUF")


def test_expert_weights_norm_in_the_file_decides_the_renormalisation():
    metadata = {
        "general.architecture": "qwen2moe",
        "qwen2moe.expert_count": 4,
        "qwen2moe.expert_used_count": 2,
        "qwen2moe.expert_feed_forward_length": 8,
        "qwen2moe.expert_weights_norm": True,
        "qwen2moe.block_count": 1,
        "qwen2moe.embedding_length": 16,
        "qwen2moe.attention.head_count": 2,
        "qwen2moe.vocab_size": 32,
    }
    assert Qwen2MoeForCausalLM.config_from_gguf(metadata, {})["norm_topk_prob"] is True
    del metadata["qwen2moe.expert_feed_forward_length"]
    with pytest.raises(ValueError, match="expert_feed_forward_length"):
        Qwen2MoeForCausalLM.config_from_gguf(metadata, {})


def test_the_plugin_serves_both_gguf_architectures():
    from tallow.plugin.registry import Registries
    from tallow_model_qwen_moe.plugin import tallow_register_architectures

    registries = Registries()
    tallow_register_architectures(registries.architectures)
    assert registries.architectures.for_gguf("qwen3moe").name == "Qwen3MoeForCausalLM"
    assert registries.architectures.for_gguf("qwen2moe").name == "Qwen2MoeForCausalLM"
