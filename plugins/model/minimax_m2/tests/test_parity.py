"""MiniMax M2 beyond the conformance suite: a config.json as the published checkpoints write
it (``rotary_dim``, the routing and norm fields), transformers' in-memory tensor names
(stacked experts, the correction bias on ``mlp``), the settings it refuses, and the GPU."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing import PagedRunner  # noqa: E402
from tallow.plugin.testing.module_parity import assert_modules_match  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
    clear_routing_prompt,
    logits_routed_alike,
    routing_agreement,
    routing_margins,
)

from test_conformance import PROMPT, SMALL, randomize_correction_bias  # noqa: E402
from tallow_model_minimax_m2.model import MiniMaxM2ForCausalLM  # noqa: E402

CONFIG = {
    **SMALL,
    "num_hidden_layers": 3,
    "head_dim": 32,
    "num_local_experts": 6,
    "num_experts_per_tok": 3,
}
#: wider than the default so that the three-layer model does not settle on one token
STD = 0.15


def _published(config) -> dict:
    """``config``'s dict as MiniMax-M2's config.json spells it: the rotary width only as
    ``rotary_dim``, ``rope_theta`` at the top, the family's routing / norm / layer fields."""
    raw = config.to_dict()
    params = raw.pop("rope_parameters")
    raw.update(
        rope_theta=params["rope_theta"],
        rotary_dim=16,
        scoring_func="sigmoid",
        use_routing_bias=True,
        use_qk_norm=True,
        qk_norm_type="per_layer",
        attn_type_list=[1, 1, 1],
    )
    raw.pop("partial_rotary_factor", None)
    return raw


def test_published_config_and_in_memory_names():
    """Half of each 32-wide head rotated from ``rotary_dim`` 16 alone; the tensors under
    transformers' own names (``mlp.experts.gate_up_proj``, ``mlp.e_score_correction_bias``);
    32 greedy tokens and their logits as transformers'."""
    config = transformers.MiniMaxM2Config(**CONFIG, rotary_dim=16)
    hf = random_hf_model(config, seed=51, std=STD)
    randomize_correction_bias(hf, 52)
    model = MiniMaxM2ForCausalLM(ArchConfig(_published(config)), BuildContext())
    assert model.model.rotary_emb.rotary_dim == 16
    state = hf.state_dict()
    assert "model.layers.0.mlp.e_score_correction_bias" in state
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    model.load_weights(iter(state.items()), naming="hf")
    model.process_weights_after_loading()
    assert_greedy_parity(model.eval(), hf, PROMPT, 32, what="minimax-m2 published config")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
        ({"qk_norm_type": "per_head"}, "qk_norm_type 'per_head' is not supported"),
        ({"attn_type_list": [0, 1, 1]}, "attn_type_list asks for linear"),
        ({"use_qk_norm": False}, "use_qk_norm false"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_refused_configs(change, message):
    raw = {**_published(transformers.MiniMaxM2Config(**CONFIG, rotary_dim=16)), **change}
    with pytest.raises(ValueError, match=message):
        MiniMaxM2ForCausalLM(ArchConfig(raw), BuildContext())


def _gpu_test_model(tmp_path):
    """transformers' model of :func:`test_cuda_parity` and a loader of ours from its saved
    checkpoint (``load(dtype=..., device=...)``)."""
    hf = random_hf_model(transformers.MiniMaxM2Config(**CONFIG, rotary_dim=16), seed=53, std=STD)
    randomize_correction_bias(hf, 54)
    from tallow_format_safetensors.format import SafetensorsFormat

    def load(**kw):
        return load_saved(hf, tmp_path, MiniMaxM2ForCausalLM, SafetensorsFormat().load, **kw)

    return hf, load


def test_the_gpu_weights_meet_a_routing_near_tie(tmp_path):
    """The weights of :func:`test_cuda_parity` put token 7 of ``PROMPT`` on a near-tie in the
    first MoE layer (its third and fourth experts' biased scores a few millionths apart):
    float32 rounding on the GPU may pick the other one, after which the logits rightly differ
    from transformers' by far more than rounding. The CUDA check compares what comes before
    such a near-tie; a choice with a wide margin that changes is still a failure."""
    hf, load = _gpu_test_model(tmp_path)
    model = load()
    margins = routing_margins(model, PROMPT)
    assert float(margins[0][7]) < 1e-4 < float(margins[0][:7].min())
    # our float32 CPU run routes every token as itself: nothing to leave out
    assert routing_agreement(model, model, PROMPT, 1e-4) == len(PROMPT)
    prompt = clear_routing_prompt(model, len(PROMPT), 5e-2, CONFIG["vocab_size"])
    assert all(float(m.min()) > 5e-2 for m in routing_margins(model, prompt))


def test_routing_agreement_refuses_a_wide_margin_change(tmp_path):
    """A router that differs beyond rounding (two experts' gate rows swapped in one layer, as
    a wrong loader would) changes choices whose margins are wide: an assertion, not a
    shorter comparison."""
    hf, load = _gpu_test_model(tmp_path)
    model, broken = load(), load()
    gate = broken.model.layers[1].mlp.gate.weight
    with torch.no_grad():
        gate[[0, 1]] = gate[[1, 0]].clone()
    with pytest.raises(AssertionError, match="takes other experts in MoE layer 1"):
        routing_agreement(model, broken, PROMPT, 1e-4, "swapped")


def test_logits_routed_alike_hands_over_the_routing(tmp_path):
    """Our float32 model given the experts a broken router chose computes the broken model's
    logits (their experts are the same); run plainly the two differ. And a bfloat16 model's
    logits are those of the float32 one routed alike, to bfloat16 rounding."""
    hf, load = _gpu_test_model(tmp_path)
    model, broken = load(), load()
    gate = broken.model.layers[1].mlp.gate.weight
    with torch.no_grad():
        gate[[0, 1]] = gate[[1, 0]].clone()
    plain = PagedRunner(model).greedy(0, PROMPT, 0)[2]
    ours, ref = logits_routed_alike(broken, model, PROMPT)
    assert float((plain - ours).abs().max()) > 0.1
    torch.testing.assert_close(ref, ours, rtol=0, atol=1e-5)
    low = load(dtype=torch.bfloat16)
    ours, ref = logits_routed_alike(low, model, PROMPT)
    assert float((ours.float() - ref).abs().max()) <= 5e-2 * float(ref.abs().max())


def test_modules_match_names_the_module_that_differs(tmp_path):
    """Two copies of one model agree module by module; a copy whose router in layer 1 has
    two experts' rows swapped is named as the first module that differs."""
    hf, load = _gpu_test_model(tmp_path)
    model, same, broken = load(dtype=torch.bfloat16), load(dtype=torch.bfloat16), load()
    assert assert_modules_match(model, same, PROMPT, 1e-6) > 3 * 5
    gate = broken.model.layers[1].mlp.gate.weight
    with torch.no_grad():
        gate[[0, 1]] = gate[[1, 0]].clone()
    with pytest.raises(AssertionError, match=r"model\.layers\.1\.mlp output"):
        assert_modules_match(load(), broken, PROMPT, 1e-4)


def _cuda_parity(tmp_path, device: str) -> None:
    hf, load = _gpu_test_model(tmp_path)
    model, vocab = load(), CONFIG["vocab_size"]
    assert_cuda_parity(
        load,
        hf,
        clear_routing_prompt(model, len(PROMPT), 1e-4, vocab),
        32,
        bf16_prompt=clear_routing_prompt(model, len(PROMPT), 5e-2, vocab),
        what="minimax-m2",
        device=device,
    )


def test_cuda_parity_checks_on_the_cpu(tmp_path):
    """The GPU check's steps on the CPU (our torch paths): float32 greedy parity, bfloat16
    prompt logits on a prompt without near-ties."""
    _cuda_parity(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    """On the GPU (FusedMoE kernels, paged attention): float32 greedy parity with
    transformers, bfloat16 prompt logits close to it, on a prompt whose routing has no
    near-tie (:func:`~tallow.plugin.testing.model_parity.clear_routing_prompt`)."""
    _cuda_parity(tmp_path, "cuda")
