"""Parity with transformers beyond the conformance suite's config: the published checkpoint
names, a sliding window the prompt crosses, top-2 of 16 experts, transformers 5's stacked
in-memory tensors, the router's arithmetic, and the engine on ``random:`` shapes."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext, FusedMoE  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_mixtral.model import MixtralForCausalLM  # noqa: E402

BASE = dict(
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=160,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# PagedRunner holds 64 positions: prompt and greedy steps fit in them
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
STEPS = 32


def _safetensors():
    return pytest.importorskip(
        "tallow_format_safetensors.format",
        reason="the saved model is read by tallow-format-safetensors",
    )


def test_saved_checkpoint_uses_the_published_names(tmp_path):
    """transformers 5 writes Mixtral back with ``block_sparse_moe`` and per-expert ``w1/w2/w3``
    tensors, the names of the released checkpoints: those are what the model loads here."""
    config = transformers.MixtralConfig(**BASE, num_local_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=3)
    model = load_saved(hf, tmp_path, MixtralForCausalLM, _safetensors().SafetensorsFormat().load)
    index = tmp_path / "model.safetensors.index.json"
    if index.exists():
        names = set(json.loads(index.read_text())["weight_map"])
    else:
        from safetensors import safe_open

        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            names = set(f.keys())
    assert "model.layers.0.block_sparse_moe.gate.weight" in names
    assert "model.layers.2.block_sparse_moe.experts.7.w3.weight" in names
    assert all(isinstance(layer.mlp, FusedMoE) for layer in model.model.layers)
    moe = model.model.layers[1].mlp
    assert torch.equal(
        moe.experts.w2_weight[5], hf.model.layers[1].mlp.experts.down_proj[5].detach()
    )
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="mixtral")


def test_sliding_window_and_16_experts(tmp_path):
    """A 12-token window every layer (the 30-token prompt and the steps cross it), top-2 of
    16 experts."""
    config = transformers.MixtralConfig(
        **BASE, num_local_experts=16, num_experts_per_tok=2, sliding_window=12
    )
    hf = random_hf_model(config, seed=4)
    model = load_saved(hf, tmp_path, MixtralForCausalLM, _safetensors().SafetensorsFormat().load)
    assert all(layer.self_attn.attn.layer.sliding_window == 12 for layer in model.model.layers)
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="mixtral sliding window")


def test_router_matches_transformers():
    """Softmax over every expert's logit, top-2, renormalised: the weights and experts of
    transformers' ``MixtralTopKRouter`` (not a softmax over the raw top-2 logits scaled some
    other way, nor the unnormalised top-2 probabilities)."""
    config = transformers.MixtralConfig(**BASE, num_local_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=5)
    model = MixtralForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    model.load_weights(iter(hf.state_dict().items()), naming="hf")
    hidden = torch.randn(40, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    weights, ids = model.model.layers[0].mlp.route(hidden)[:2]
    _, ref_weights, ref_ids = hf.model.layers[0].mlp.gate(hidden)
    order, ref_order = ids.sort(-1), ref_ids.sort(-1)
    assert torch.equal(order.values, ref_order.values)
    torch.testing.assert_close(
        weights.float().gather(-1, order.indices), ref_weights.gather(-1, ref_order.indices)
    )
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(40))


def test_loads_the_stacked_expert_tensors_of_transformers_5():
    """transformers 5's state dict (``mlp.gate``, ``mlp.experts.gate_up_proj [E, 2I, H]``,
    ``mlp.experts.down_proj [E, H, I]``) loads as it is."""
    config = transformers.MixtralConfig(**BASE, num_local_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=7)
    state = hf.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    model = MixtralForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    model.load_weights(iter(state.items()), naming="hf")
    assert_greedy_parity(model.eval(), hf, PROMPT, STEPS, what="stacked experts")


@pytest.mark.parametrize(
    "change, message",
    [({"hidden_act": "gelu"}, "hidden_act"), ({"num_local_experts": None}, "num_local_experts")],
)
def test_config_the_experts_cannot_run_is_refused(change, message):
    config = {**transformers.MixtralConfig(**BASE).to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        MixtralForCausalLM(ArchConfig(config), BuildContext())


def test_engine_runs_the_random_shape():
    """``random:tiny-mixtral`` builds, fills and generates through the whole engine."""
    from tallow import LLM, SamplingParams

    llm = LLM(
        model="random:tiny-mixtral", device="cpu", dtype="float32", num_blocks=16, max_model_len=256
    )
    assert type(llm.engine.core.runner.model).__name__ == "MixtralForCausalLM"
    outs = llm.generate(
        [[1, 2, 3, 4, 5], list(range(40, 80))],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]


def test_mixtral_8x7b_shape():
    """``random:mixtral-8x7b`` is Mixtral-8x7B's shape (46.7B parameters), checked without
    building it."""
    from tallow.engine.random_model import shape_config

    cfg = shape_config("random:mixtral-8x7b")
    hidden, inter, layers, vocab = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_hidden_layers"],
        cfg["vocab_size"],
    )
    kv = hidden // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = (
        hidden * (2 * hidden + 2 * kv)
        + cfg["num_local_experts"] * 3 * hidden * inter
        + hidden * cfg["num_local_experts"]
        + 2 * hidden
    )
    total = layers * per_layer + 2 * vocab * hidden + hidden
    assert cfg["architectures"] == ["MixtralForCausalLM"]
    assert abs(total / 1e9 - 46.7) < 0.05, total


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    """On the GPU the experts run the Triton kernels: float32 greedy parity with transformers
    (prompt and decode steps, so both the GEMM and the GEMV path), bfloat16 prompt logits
    close to it."""
    config = transformers.MixtralConfig(
        **BASE, num_local_experts=8, num_experts_per_tok=2, sliding_window=12
    )
    hf = random_hf_model(config, seed=8)
    read = _safetensors().SafetensorsFormat().load
    assert_cuda_parity(
        lambda **kw: load_saved(hf, tmp_path, MixtralForCausalLM, read, **kw),
        hf,
        PROMPT,
        STEPS,
        what="mixtral",
    )
