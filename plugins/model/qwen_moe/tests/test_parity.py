"""Parity with transformers beyond the conformance suite's configs: many experts with top-8
routing, ``decoder_sparse_step`` and ``mlp_only_layers`` (dense layers between MoE ones), the
stacked expert tensors transformers 5 holds in memory, and the engine on ``random:`` shapes."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    clear_routing_prompt,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_qwen_moe.model import (  # noqa: E402
    Qwen2MoeForCausalLM,
    Qwen3MoeForCausalLM,
    is_moe_layer,
)

BASE = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
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
#: the qwen3 GPU model's spread: at the default 0.08 its eight-of-64 experts' sum is nearly
#: the same for every token and transformers' greedy output is one token repeated, which
#: checks nothing (assert_greedy_parity refuses it); wider weights make the layers' outputs
#: depend on the token
QWEN3_STD = 0.15


def _safetensors():
    return pytest.importorskip(
        "tallow_format_safetensors.format",
        reason="the saved model is read by tallow-format-safetensors",
    )


def test_sparse_step_and_dense_layers_with_64_experts(tmp_path):
    config = transformers.Qwen3MoeConfig(
        **BASE,
        head_dim=16,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    )
    arch = ArchConfig(config.to_dict())
    assert [is_moe_layer(arch, i) for i in range(4)] == [False, True, False, False]
    hf = random_hf_model(config, seed=5)
    model = load_saved(hf, tmp_path, Qwen3MoeForCausalLM, _safetensors().SafetensorsFormat().load)
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == [
        "LlamaMLP",
        "FusedMoE",
        "LlamaMLP",
        "LlamaMLP",
    ]
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen3-moe sparse step")
    moe = model.model.layers[1].mlp
    with torch.no_grad():
        hidden = model.model.embed_tokens(torch.tensor(PROMPT))
        used = torch.unique(moe.route(hidden)[1]).numel()
    assert used >= 32, f"the prompt reaches only {used} of 64 experts"


def test_qwen2_moe_renormalized_and_ungated_paths(tmp_path):
    """Qwen2-MoE with ``norm_topk_prob`` and top-4 of 16 experts, its shared expert gated."""
    config = transformers.Qwen2MoeConfig(
        **BASE,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        shared_expert_intermediate_size=40,
    )
    hf = random_hf_model(config, seed=6)
    model = load_saved(hf, tmp_path, Qwen2MoeForCausalLM, _safetensors().SafetensorsFormat().load)
    assert model.model.layers[0].mlp.shared_expert_gate is not None
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen2-moe")


def test_loads_the_stacked_expert_tensors_of_transformers_5():
    """transformers 5 keeps each layer's experts stacked in memory (``mlp.experts.gate_up_proj
    [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``); its state dict loads as it is."""
    config = transformers.Qwen3MoeConfig(**BASE, head_dim=16, num_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=7)
    state = hf.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    model = Qwen3MoeForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    model.load_weights(iter(state.items()), naming="hf")
    assert_greedy_parity(model.eval(), hf, PROMPT, STEPS, what="stacked experts")


@pytest.mark.parametrize("shape", ["tiny-qwen3-moe"])
def test_engine_runs_the_random_shape(shape):
    """``random:`` shapes of the family build, fill and generate through the whole engine."""
    from tallow import LLM, SamplingParams

    llm = LLM(
        model=f"random:{shape}", device="cpu", dtype="float32", num_blocks=16, max_model_len=256
    )
    assert type(llm.engine.core.runner.model).__name__ == "Qwen3MoeForCausalLM"
    outs = llm.generate(
        [[1, 2, 3, 4, 5], list(range(40, 80))],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_cuda_parity(family, tmp_path):
    """On the GPU the experts run the Triton kernels: float32 greedy parity with transformers
    (prompt and decode steps, so both the GEMM and the GEMV path), bfloat16 prompt logits
    close to it."""
    if family == "qwen3":
        config = transformers.Qwen3MoeConfig(
            **BASE, head_dim=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=True
        )
        cls = Qwen3MoeForCausalLM
    else:
        config = transformers.Qwen2MoeConfig(
            **BASE, num_experts=16, num_experts_per_tok=4, shared_expert_intermediate_size=40
        )
        cls = Qwen2MoeForCausalLM
    hf = random_hf_model(config, seed=8, std=QWEN3_STD if family == "qwen3" else 0.08)
    read = _safetensors().SafetensorsFormat().load

    def load(**kw):
        return load_saved(hf, tmp_path, cls, read, **kw)

    # a prompt whose routing has no float32 near-tie; among 64 experts the eighth and ninth
    # best lie too close for one without bfloat16 ones, so the bfloat16 logits are compared
    # up to the first token that takes other experts (assert_cuda_parity)
    prompt = clear_routing_prompt(load(), len(PROMPT), 1e-4, BASE["vocab_size"])
    assert_cuda_parity(load, hf, prompt, STEPS, what=family)
