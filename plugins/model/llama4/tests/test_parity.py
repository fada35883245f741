"""Llama 4 (text) against transformers on tiny random configs: chunked local attention that the
prompt crosses, layers without RoPE with attention temperature tuning, the weightless q/k
norm, interleaved MoE blocks (sigmoid router, input-scaled experts, shared expert) beside
dense ones; logits and 32 greedy tokens."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext, FusedExperts, FusedMoE  # noqa: E402
from tallow.plugin.testing.paged_runner import randomize_  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    clear_routing_prompt,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from tallow_model_llama4.model import (  # noqa: E402
    Llama4ForCausalLM,
    Llama4ForConditionalGeneration,
    Llama4MoE,
    layer_plan,
)

# 4 layers: 0-2 rope + chunked, 3 no rope (interval 4); MoE on 1 and 3 (step 2)
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
# PagedRunner holds 64 positions: prompt and greedy steps fit in them; the 30-token prompt
# spans four 8-token chunks and the steps several more
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
STEPS = 32


def _safetensors():
    return pytest.importorskip(
        "tallow_format_safetensors.format",
        reason="the saved model is read by tallow-format-safetensors",
    )


def _config(**change):
    return transformers.Llama4TextConfig(**{**BASE, **change})


def test_layer_plan_follows_the_config():
    plans = layer_plan(ArchConfig(_config().to_dict()))
    assert [p.use_rope for p in plans] == [True, True, True, False]
    assert [p.chunk_size for p in plans] == [8, 8, 8, None]
    assert [p.moe for p in plans] == [False, True, False, True]
    # what a published config leaves out ([] for no_rope_layers, no moe_layers): the defaults
    raw = {**_config().to_dict(), "no_rope_layers": [], "layer_types": None, "moe_layers": None}
    assert layer_plan(ArchConfig(raw)) == plans


def test_parity_past_chunk_boundaries(tmp_path):
    """The saved checkpoint (stacked experts, ``feed_forward`` names) loads and matches
    transformers on a prompt that crosses three chunk boundaries, and for 32 steps."""
    hf = random_hf_model(_config(), seed=3)
    model = load_saved(hf, tmp_path, Llama4ForCausalLM, _safetensors().SafetensorsFormat().load)
    layers = model.model.layers
    assert [type(layer.mlp).__name__ for layer in layers] == [
        "LlamaMLP",
        "Llama4MoE",
        "LlamaMLP",
        "Llama4MoE",
    ]
    assert [layer.self_attn.attn.layer.attention_chunk_size for layer in layers] == [8, 8, 8, None]
    torch.testing.assert_close(
        layers[1].mlp.experts.w13_weight[2],
        hf.model.layers[1].feed_forward.experts.gate_up_proj[2].T,
    )
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="llama4")


def test_chunking_changes_the_result(tmp_path):
    """The chunk mask matters: the same weights with chunks of 8 and without chunks give
    different logits past the first chunk (so the parity above checks the chunking)."""
    hf = random_hf_model(_config(), seed=3)
    model = Llama4ForCausalLM(ArchConfig(_config().to_dict()), BuildContext())
    model.load_weights(iter(hf.state_dict().items()), naming="hf")
    unchunked = Llama4ForCausalLM(
        ArchConfig(_config(attention_chunk_size=None).to_dict()), BuildContext()
    )
    unchunked.load_weights(iter(hf.state_dict().items()), naming="hf")
    from tallow.plugin.testing import PagedRunner

    _, _, chunked_logits = PagedRunner(model.eval()).greedy(0, PROMPT, 1)
    _, _, full_logits = PagedRunner(unchunked.eval()).greedy(0, PROMPT, 1)
    torch.testing.assert_close(chunked_logits[:8], full_logits[:8])
    assert not torch.allclose(chunked_logits[8:], full_logits[8:], atol=1e-3)


def test_no_qk_norm_no_tuning_top2_all_moe(tmp_path):
    """The other switches: no q/k norm, no temperature tuning, top-2 of 8 experts on every
    layer, one layer without RoPE every second layer."""
    config = _config(
        use_qk_norm=False,
        attn_temperature_tuning=False,
        num_local_experts=8,
        num_experts_per_tok=2,
        interleave_moe_layer_step=1,
        no_rope_layer_interval=2,
    )
    hf = random_hf_model(config, seed=5)
    model = load_saved(hf, tmp_path, Llama4ForCausalLM, _safetensors().SafetensorsFormat().load)
    assert all(isinstance(layer.mlp, FusedMoE) for layer in model.model.layers)
    assert [layer.self_attn.attn.layer.attention_chunk_size for layer in model.model.layers] == [
        8,
        None,
        8,
        None,
    ]
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="llama4 top-2")


def test_llama3_rope_scaling(tmp_path):
    """Scout's rope: ``llama3`` scaling (factor 16 from 8192 positions) slows the low
    frequencies, which a 16-wide head at theta 500000 has."""
    rope = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=16.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    hf = random_hf_model(_config(rope_parameters=rope), seed=6)
    model = load_saved(hf, tmp_path, Llama4ForCausalLM, _safetensors().SafetensorsFormat().load)
    plain = Llama4ForCausalLM(ArchConfig(_config().to_dict()), BuildContext())
    assert not torch.allclose(model.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="llama4 llama3 rope")


def test_moe_block_matches_transformers():
    """One MoE block on 40 tokens: transformers' ``Llama4TextMoe`` output (input-scaled
    experts plus the shared expert), not the output-scaled form."""
    config = _config(num_local_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=7)
    model = Llama4ForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    model.load_weights(iter(hf.state_dict().items()), naming="hf")
    moe = model.model.layers[1].mlp
    assert isinstance(moe, Llama4MoE)
    x = torch.randn(40, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, _ = hf.model.layers[1].feed_forward(x)
        ours = moe(x)
        weights, ids = moe.route(x)
        output_scaled = moe.shared_expert(x) + FusedExperts.forward(moe.experts, x, weights, ids)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(output_scaled, ref, atol=1e-4)


def test_text_model_of_the_multimodal_checkpoint(tmp_path):
    """A ``Llama4ForConditionalGeneration`` checkpoint (``text_config``, ``language_model.``
    names, a vision tower and projector beside them) serves its text model: equal to
    transformers' text path on the same weights."""
    vision = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=28,
        patch_size=14,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
        pixel_shuffle_ratio=0.5,
    )
    config = transformers.Llama4Config(text_config=_config().to_dict(), vision_config=vision)
    torch.manual_seed(9)
    hf = transformers.Llama4ForConditionalGeneration._from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(hf, 9, 0.08)
    hf.eval()
    model = load_saved(
        hf, tmp_path, Llama4ForConditionalGeneration, _safetensors().SafetensorsFormat().load
    )
    assert model.config.get("hidden_size") == BASE["hidden_size"]
    assert_greedy_parity(model, hf.language_model, PROMPT, STEPS, what="llama4 multimodal")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["chunked_attention"] * 3}, "layer_types"),
        ({"no_rope_layers": [1, 1]}, "no_rope_layers"),
        (
            {"attention_chunk_size": None, "layer_types": ["chunked_attention"] * 4},
            "attention_chunk_size",
        ),
    ],
)
def test_config_that_cannot_run_is_refused(change, message):
    config = {**_config().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        Llama4ForCausalLM(ArchConfig(config), BuildContext())


def test_expert_parallelism_is_refused_by_name():
    """The experts take router-scaled inputs, which the expert-parallel all-to-all does not
    carry: building with ``expert_parallel`` over two ranks stops with the reason."""
    build = BuildContext(tp_rank=0, tp_size=2, expert_parallel=True)
    with pytest.raises(ValueError, match="does not run under expert parallelism"):
        Llama4ForCausalLM(ArchConfig(_config().to_dict()), build)


def test_chunked_layers_and_the_paged_backends():
    """The Triton kernels mask by chunk: the backend takes every layer. FlashInfer's do not:
    it refuses the chunked layers by name (automatic selection then passes over it) instead
    of computing full attention, and takes the layers without chunks."""
    triton_backend = pytest.importorskip(
        "tallow_attention_triton.backend", reason="the Triton attention plugin"
    ).TritonAttentionBackend
    flashinfer_backend = pytest.importorskip(
        "tallow_attention_flashinfer.backend", reason="the FlashInfer attention plugin"
    ).FlashInferAttentionBackend
    config = _config(head_dim=64).to_dict()  # a head size FlashInfer's kernels are built for
    model = Llama4ForCausalLM(ArchConfig(config), BuildContext())
    layers = [layer.self_attn.attn.layer for layer in model.model.layers]
    assert [triton_backend.supports_layer(layer) for layer in layers] == [[]] * 4
    assert flashinfer_backend.supports_layer(layers[0]) == [
        "chunked local attention (attention_chunk_size 8)"
    ]
    assert flashinfer_backend.supports_layer(layers[3]) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    """On the GPU the experts run the Triton MoE kernels: float32 greedy parity with
    transformers, bfloat16 prompt logits close to it, on prompts whose routing has no
    near-tie (the bfloat16 one none within 5e-2 of the scores' scale)."""
    hf = random_hf_model(_config(), seed=8)
    read = _safetensors().SafetensorsFormat().load

    def load(**kw):
        return load_saved(hf, tmp_path, Llama4ForCausalLM, read, **kw)

    model, vocab = load(), hf.config.vocab_size
    assert_cuda_parity(
        load,
        hf,
        clear_routing_prompt(model, len(PROMPT), 1e-4, vocab),
        STEPS,
        bf16_prompt=clear_routing_prompt(model, len(PROMPT), 5e-2, vocab),
        what="llama4",
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bfloat16_modules_on_cuda_match_the_cpu(tmp_path):
    """In bfloat16 every norm, linear layer, gated activation and MoE block computes on the
    GPU (Triton kernels, cuBLAS) what our torch path computes on the CPU from the same
    inputs: both accumulate in float32 and round their outputs to bfloat16, so they differ by
    about one bfloat16 step (2^-8 of the scale); 2e-2 allows five. A layer past it is named
    (this localises a bfloat16 prompt-logit error of test_cuda_parity)."""
    from tallow.plugin.testing.module_parity import assert_modules_match

    hf = random_hf_model(_config(), seed=8)
    read = _safetensors().SafetensorsFormat().load

    def load(**kw):
        return load_saved(hf, tmp_path, Llama4ForCausalLM, read, **kw)

    gpu, cpu = load(dtype=torch.bfloat16, device="cuda"), load(dtype=torch.bfloat16)
    assert assert_modules_match(gpu, cpu, PROMPT, 2e-2, "llama4 bfloat16") > 0
