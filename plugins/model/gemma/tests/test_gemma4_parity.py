"""Parity with transformers on tiny random Gemma 4 text models (CPU, float32).

Each model is saved by transformers as safetensors, read back through tallow-format-safetensors
and run through a paged KV cache: the prompt's logits, 32 greedy tokens and the logits of each
step must match transformers' forward and greedy ``generate``. The 24-token prompt is longer
than the 6-token window. The configs cover sliding and full layers with their own head size and
RoPE (proportional on full layers), per-layer inputs, ``attention_k_eq_v``, the expert block
beside the MLP, KV-shared layers with double-width MLPs, random ``layer_scalar`` values and a
final-logit softcap.
"""

from __future__ import annotations

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

STEPS = 32
WINDOW = 6
SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    vocab_size=256,
    vocab_size_per_layer_input=256,
    hidden_size_per_layer_input=8,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    sliding_window=WINDOW,
    final_logit_softcapping=3.0,
    layer_types=[
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.5,
            "rope_theta": 1000000.0,
        },
    },
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def gemma4_config(**kw):
    return transformers.Gemma4TextConfig(**{**SMALL, **kw})


MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
CONFIGS = {
    # sliding + full layers (full: 32-wide heads), per-layer inputs
    "dense": dict(),
    # full layers: values from the keys over one KV head; no per-layer inputs
    "k-eq-v": dict(
        attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0
    ),
    # experts beside the dense MLP in every layer
    "moe": dict(
        **MOE, attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0
    ),
    # layers 3 (sliding) and 4 (full) read the K/V of layers 2 and 1, with double-width MLPs
    "kv-shared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True),
    # both at once: the shared full layer reads a K=V cache
    "kv-shared-k-eq-v": dict(
        num_kv_shared_layers=2, attention_k_eq_v=True, num_global_key_value_heads=1
    ),
}


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 1000


def build(name: str, path, kit):
    """transformers' model of config ``name`` with random weights and layer scalars, saved."""
    hf = kit.build_hf(gemma4_config(**CONFIGS[name]), seed=_seed(name))
    g = torch.Generator().manual_seed(_seed(name))
    with torch.no_grad():
        for layer in hf.model.layers:  # a buffer: randomize_ leaves it at one
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    hf.save_pretrained(str(path), safe_serialization=True)
    return hf


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path, kit):
    hf = build(name, tmp_path, kit)
    model, ckpt = kit.load_tallow(tmp_path)
    assert ckpt.architecture == "Gemma4ForCausalLM"
    ref_tokens, ref_logits, ref_prompt = kit.hf_generate(hf, kit.PROMPT, STEPS)
    tokens, logits, prompt_logits = kit.PagedRunner(model).greedy(0, kit.PROMPT, STEPS)
    kit.assert_close_logits(prompt_logits, ref_prompt, f"{name}: prompt logits")
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours, ref, f"{name}: logits of step {i}")
    assert tokens == ref_tokens, f"{name}: greedy tokens differ"
    assert len(set(tokens)) > 2, f"{name}: greedy output is nearly constant: {tokens}"


def test_configs_build_what_they_say(tmp_path, kit):
    """The parity above covers each feature: the models hold what the configs ask for."""
    from tallow.layers import SharedKVAttention

    built = {}
    for name in ("k-eq-v", "moe", "kv-shared"):
        build(name, tmp_path / name, kit)
        built[name] = kit.load_tallow(tmp_path / name)[0].model
    full = built["k-eq-v"].layers[1].self_attn
    assert full.qkv_proj is None and full.k_proj is not None
    assert full.attn.layer.head_dim == 32 and full.attn.layer.num_kv_heads == 1
    assert built["k-eq-v"].layers[0].self_attn.qkv_proj is not None
    assert all(layer.experts is not None for layer in built["moe"].layers)
    shared = built["kv-shared"].layers
    assert [type(l.self_attn.attn) is SharedKVAttention for l in shared] == [0, 0, 0, 1, 1]
    assert [l.self_attn.attn.layer.kv_shared_from for l in shared[3:]] == [2, 1]
    assert shared[3].mlp.down_proj.weight.shape[1] == 2 * SMALL["intermediate_size"]
    assert shared[2].per_layer_input_gate is not None


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("dense", {"sliding_window": 1000}),
        ("dense", {"final_logit_softcapping": None}),
        (
            "dense",
            {
                "rope_parameters": {
                    **SMALL["rope_parameters"],
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                }
            },
        ),
        ("kv-shared", {"sliding_window": 1000}),
    ],
)
def test_each_feature_matters(name, change, tmp_path, kit):
    """The same weights with one setting changed no longer match transformers: the window
    (past the prompt's sixth token), the final softcap and the partial rotation of full
    layers are implemented, not merely harmless."""
    hf = build(name, tmp_path, kit)
    model, _ = kit.load_tallow(tmp_path, **change)
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    ours = kit.PagedRunner(model).greedy(0, kit.PROMPT, 0)[2]
    err = float((ours - ref).abs().max())
    assert err > 1e-2, f"{name} with {change}: logits still match transformers ({err:.1e})"


@pytest.mark.parametrize("name", ["kv-shared", "moe"])
def test_chunked_prefill_and_two_sequences(name, tmp_path, kit):
    """Two sequences share each step: one prefilled in chunks that straddle the window while
    the other prefills whole and decodes; then both decode together (shared layers read the
    source layers' K/V of both sequences)."""
    hf = build(name, tmp_path, kit)
    model, _ = kit.load_tallow(tmp_path)
    kit.check_two_sequences(hf, model, name)


def test_multimodal_checkpoint_serves_its_text_model(tmp_path, kit):
    """A Gemma4ForConditionalGeneration checkpoint with a vision tower: the text model is
    read from ``model.language_model.``, the tower is skipped, and text prompts give
    transformers' logits."""
    text = gemma4_config(**CONFIGS["kv-shared"], pad_token_id=0)  # transformers pads images
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        position_embedding_size=64,
    )
    config = transformers.Gemma4Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        # special ids outside the prompt (transformers pads them out of the text model)
        image_token_id=247,
        boi_token_id=246,
        eoi_token_id=245,
        video_token_id=244,
        audio_token_id=243,
        boa_token_id=242,
        eoa_token_index=241,
    )
    hf = kit.build_hf(config, seed=7, cls_name="Gemma4ForConditionalGeneration")
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    model, ckpt = kit.load_tallow(tmp_path)
    assert type(model).__name__ == "Gemma4ForConditionalGeneration"
    assert "text_config" not in model.config and model.config["num_kv_shared_layers"] == 2
    prompt = [t % 240 for t in kit.PROMPT]  # no special id among them
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([prompt])).logits[0]
    ours = kit.PagedRunner(model).greedy(0, prompt, 0)[2]
    kit.assert_close_logits(ours, ref, "multimodal checkpoint: text logits")


def test_bfloat16_build_tracks_float32(tmp_path, kit):
    """bfloat16 weights and activations stay as near the float32 logits as transformers'
    bfloat16 does."""
    hf = build("kv-shared", tmp_path, kit)
    m16, _ = kit.load_tallow(tmp_path, dtype=torch.bfloat16)
    l16 = kit.PagedRunner(m16).greedy(0, kit.PROMPT, 0)[2]
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    err = float((l16 - ref).abs().max())
    bound = 2 * kit.bf16_error_of_transformers(hf, kit.PROMPT) + 1e-2
    assert err <= bound, f"bfloat16 logits {err:.3f} from float32 (transformers' own: <{bound:.3f})"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity_on_cuda(name, tmp_path, kit):
    """Built and run on the GPU (Triton norms, rotary, GeGLU and fused experts; torch
    reference attention) against transformers on the CPU: float32 logits close and the same
    32 greedy tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = build(name, tmp_path, kit)
    model, _ = kit.load_tallow(tmp_path, device="cuda")
    ref_tokens, ref_logits, ref_prompt = kit.hf_generate(hf, kit.PROMPT, STEPS)
    tokens, logits, prompt_logits = kit.PagedRunner(model).greedy(0, kit.PROMPT, STEPS)
    kit.assert_close_logits(prompt_logits.cpu(), ref_prompt, f"{name}: prompt logits", rel=1e-3)
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours.cpu(), ref, f"{name}: logits of step {i}", rel=1e-3)
    assert tokens == ref_tokens
