"""Parity with transformers beyond the conformance suite's config: the router's and the
experts' arithmetic and layouts, YaRN at gpt-oss's own settings, other layer patterns, the
config defaults, and the ``random:`` shapes."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext, FusedMoE  # noqa: E402
from tallow.layers import SlidingWindowSpec  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_gpt_oss.model import GptOssForCausalLM  # noqa: E402

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
    "rope_theta": 150000.0,
}
BASE = dict(
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=160,
    num_local_experts=8,
    num_experts_per_tok=4,
    sliding_window=6,
    max_position_embeddings=256,
    rope_parameters=YARN,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
STEPS = 32


def _config(**kw):
    return transformers.GptOssConfig(**{**BASE, "num_hidden_layers": 2, **kw})


def _ours(hf) -> GptOssForCausalLM:
    model = GptOssForCausalLM(ArchConfig(hf.config.to_dict()), BuildContext())
    model.load_weights(iter(hf.state_dict().items()), naming="hf")
    return model.eval()


def _safetensors():
    return pytest.importorskip(
        "tallow_format_safetensors.format",
        reason="the saved model is read by tallow-format-safetensors",
    )


def test_router_matches_transformers():
    """The biased router's top-4 logits softmaxed among themselves: transformers'
    ``GptOssTopKRouter`` weights and experts."""
    hf = random_hf_model(_config(), seed=5)
    model = _ours(hf)
    hidden = torch.randn(40, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    weights, ids = model.model.layers[0].mlp.route(hidden)
    _, ref_weights, ref_ids = hf.model.layers[0].mlp.router(hidden)
    order, ref_order = ids.sort(-1), ref_ids.sort(-1)
    assert torch.equal(order.values, ref_order.values)
    torch.testing.assert_close(
        weights.gather(-1, order.indices), ref_weights.gather(-1, ref_order.indices)
    )
    assert float(hf.model.layers[0].mlp.router.bias.detach().abs().sum()) > 0  # the bias takes part


def test_experts_match_transformers():
    """The interleaved, transposed ``gate_up_proj`` and the ``down_proj`` (with biases) load
    into the core's layout: the whole MoE block gives ``GptOssMLP``'s output, with the clamp
    reached (large inputs)."""
    hf = random_hf_model(_config(), seed=6)
    model = _ours(hf)
    moe = model.model.layers[1].mlp
    experts = hf.model.layers[1].mlp.experts
    torch.testing.assert_close(
        moe.experts.w13_weight[3, :64], experts.gate_up_proj[3, :, 0::2].T.detach()
    )
    torch.testing.assert_close(
        moe.experts.w13_bias[3, 64:], experts.gate_up_proj_bias[3, 1::2].detach()
    )
    hidden = torch.randn(1, 50, BASE["hidden_size"], generator=torch.Generator().manual_seed(1)) * 8
    with torch.no_grad():
        ref = hf.model.layers[1].mlp(hidden)[0][0]
        gate_up = hidden[0] @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
        ours = moe(hidden[0])
    assert float(gate_up.abs().max()) > 7.0, "the clamp at swiglu_limit is never reached"
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_yarn_of_the_released_models_matches_transformers():
    """gpt-oss's own rotary settings (theta 150000, YaRN factor 32 over 4096, not truncated,
    head size 64): q and k rotated as transformers rotates them, out to position 131071."""
    from transformers.models.gpt_oss.modeling_gpt_oss import (
        GptOssRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    cfg = transformers.GptOssConfig(num_hidden_layers=1)  # the released defaults
    assert cfg.rope_parameters["rope_type"] == "yarn"
    model = GptOssForCausalLM(
        ArchConfig(
            {
                **BASE,
                "num_hidden_layers": 1,
                "head_dim": 64,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 131072,
                "rope_parameters": None,
            }
        ),
        BuildContext(),
    )
    rope = model.model.rotary_emb
    hf_rope = GptOssRotaryEmbedding(cfg)
    gen = torch.Generator().manual_seed(0)
    positions = torch.cat([torch.arange(8), torch.randint(8, 131072, (40,), generator=gen)])
    n = positions.shape[0]
    q = torch.randn(n, 2 * 64, generator=gen)
    k = torch.randn(n, 64, generator=gen)
    cos, sin = hf_rope(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(
        q.view(1, n, 2, 64).transpose(1, 2), k.view(1, n, 1, 64).transpose(1, 2), cos, sin
    )
    out_q, out_k = rope(positions, q, k)
    torch.testing.assert_close(out_q, ref_q.transpose(1, 2).reshape(n, -1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_k, ref_k.transpose(1, 2).reshape(n, -1), rtol=1e-4, atol=1e-4)
    assert rope.attention_scaling == pytest.approx(hf_rope.attention_scaling)


def test_layer_pattern_of_the_config(tmp_path):
    """``layer_types`` decides each layer's window (here full, sliding, sliding, full): the
    cache specs follow it, and greedy decoding across the 6-token window matches."""
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    hf = random_hf_model(_config(num_hidden_layers=4, layer_types=types), seed=7)
    model = load_saved(hf, tmp_path, GptOssForCausalLM, _safetensors().SafetensorsFormat().load)
    specs = [layer.self_attn.attn.cache_spec() for layer in model.model.layers]
    assert [isinstance(s, SlidingWindowSpec) for s in specs] == [False, True, True, False]
    assert all(isinstance(layer.mlp, FusedMoE) for layer in model.model.layers)
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="gpt-oss layer_types")


def test_config_defaults_are_transformers():
    """A config.json that leaves out what GptOssConfig assumes (layer types, YaRN, biases,
    the window, the SwiGLU clamp) is completed the same way."""
    minimal = dict(
        architectures=["GptOssForCausalLM"],
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=160,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    ours = GptOssForCausalLM.config_from_hf(minimal)
    ref = transformers.GptOssConfig(**minimal)
    assert ours["layer_types"] == ref.layer_types
    for key in ("sliding_window", "attention_bias", "head_dim", "swiglu_limit", "swiglu_alpha"):
        assert ours[key] == getattr(ref, key), key
    scaling = ours["rope_scaling"]
    for key, value in ref.rope_parameters.items():
        if key != "rope_theta":
            assert scaling[key] == value, key
    assert ours["rope_theta"] == ref.rope_parameters["rope_theta"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"layer_types": ["local", "full_attention"]}, "layer_types"),
        ({"num_local_experts": None}, "num_local_experts"),
    ],
)
def test_config_the_model_cannot_build_is_refused(change, message):
    config = {**_config().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        GptOssForCausalLM(ArchConfig(config), BuildContext())


def test_gpt_oss_20b_shape():
    """``random:gpt-oss-20b`` is gpt-oss-20b's shape (20.9B parameters, MXFP4 experts),
    checked without building it."""
    from tallow.engine.random_model import shape_config

    cfg = shape_config("random:gpt-oss-20b")
    h, i, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q, kv = (
        cfg["num_attention_heads"] * cfg["head_dim"],
        cfg["num_key_value_heads"] * cfg["head_dim"],
    )
    attention = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + cfg["num_attention_heads"]
    experts = e * (h * 2 * i + 2 * i + i * h + h)
    per_layer = attention + h * e + e + experts + 2 * h
    total = cfg["num_hidden_layers"] * per_layer + 2 * cfg["vocab_size"] * h + h
    assert cfg["architectures"] == ["GptOssForCausalLM"]
    assert abs(total / 1e9 - 20.9) < 0.05, total
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    assert cfg["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert len(cfg["layer_types"]) == cfg["num_hidden_layers"] == 24
