"""Tiny Gemma checkpoints through the whole engine (``tallow.LLM``) on the CPU: the plugin's
registration, the engine's config completion (``config_from_hf``), chunked prefill and the
prefix cache across the sliding window, against transformers' greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip(
    "tallow_format_safetensors", reason="tallow-format-safetensors reads the checkpoints"
)

from tallow.plugin import ArchitectureRegistry  # noqa: E402
from tallow.plugin.testing import modules_imported_by_registration  # noqa: E402

from tallow_model_gemma import plugin  # noqa: E402

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=300,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    sliding_window=7,
    query_pre_attn_scalar=32,
    layer_types=["sliding_attention", "full_attention"] * 2,
    bos_token_id=1,
    eos_token_id=0,
    pad_token_id=0,
)
PROMPTS = [
    [5 + (7 * i) % 290 for i in range(40)],
    [9, 31, 77, 120, 4, 18, 260, 45, 11, 3],
    [200 - i for i in range(25)],
]
STEPS = 12


def _save_with_tokenizer(hf, path) -> None:
    from tallow.engine.random_model import synthetic_tokenizer

    hf.save_pretrained(str(path), safe_serialization=True)
    synthetic_tokenizer(hf.config.get_text_config().vocab_size).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<0>", "add_bos_token": False})
    )


def _hf_tokens(hf, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


def _llm(path):
    from tallow import LLM

    return LLM(
        model=str(path),
        dtype="float32",
        device="cpu",
        block_size=4,
        prefill_chunk_size=16,
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
    )


def _generate(llm, prompts):
    from tallow import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    return llm.generate(prompts, params)


def test_registration_imports_no_torch():
    assert (
        modules_imported_by_registration(
            "tallow_model_gemma.plugin", "tallow_register_architectures", "ArchitectureRegistry"
        )
        == []
    )
    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    assert registry.for_gguf("gemma3").name == "Gemma3ForCausalLM"
    assert registry.for_gguf("gemma2").name == "Gemma2ForCausalLM"
    assert "Gemma3ForConditionalGeneration" in registry
    assert "Gemma4ForCausalLM" in registry and "Gemma4ForConditionalGeneration" in registry


def test_engine_serves_gemma4_with_kv_sharing(tmp_path, kit):
    """A Gemma 4 model whose last two layers read earlier layers' K/V (one of them from the
    sliding group, whose old blocks the engine frees) through the whole engine: prompts
    longer than the window prefilled in chunks beside decodes, the first again from the prefix
    cache, as transformers decodes them; the shared layers take no cache."""
    from tallow.engine.cache_groups import find_cache_groups

    config = transformers.Gemma4TextConfig(
        **{k: v for k, v in SMALL.items() if k != "query_pre_attn_scalar"},
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=300,
        global_head_dim=16,
        final_logit_softcapping=5.0,
    )
    hf = kit.build_hf(config, seed=8)
    _save_with_tokenizer(hf, tmp_path)
    llm = _llm(tmp_path)
    model = llm.engine.parts.loaded.model
    assert type(model).__name__ == "Gemma4ForCausalLM"
    groups = find_cache_groups(model)
    assert sorted(a.layer.layer_index for g in groups for a in g.layers) == [0, 1]
    outs = _generate(llm, PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == _hf_tokens(hf, prompt)
    again = _generate(llm, PROMPTS[:1])[0]
    assert again.num_cached_tokens >= 32
    assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_engine_greedy_matches_transformers(arch, tmp_path, kit):
    """Prompts longer than the window, prefilled in 16-token chunks beside each other's
    decodes; the first prompt again from the prefix cache."""
    config = (
        transformers.Gemma2Config(**SMALL, attn_logit_softcapping=3.0, final_logit_softcapping=2.0)
        if arch == "gemma2"
        else transformers.Gemma3TextConfig(**SMALL)
    )
    hf = kit.build_hf(config, seed=5)
    _save_with_tokenizer(hf, tmp_path)
    llm = _llm(tmp_path)
    assert type(llm.engine.parts.loaded.model).__name__ == type(hf).__name__
    outs = _generate(llm, PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == _hf_tokens(hf, prompt)
    again = _generate(llm, PROMPTS[:1])[0]
    assert again.num_cached_tokens >= 32
    assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_multimodal_checkpoint_serves_its_text_model(tmp_path, kit):
    """A Gemma3ForConditionalGeneration checkpoint: the engine builds its text model from
    ``text_config`` (completed with Gemma 3's defaults), and text prompts decode as
    transformers' (the vision tower is loaded beside it, see test_vision_parity.py)."""
    text = transformers.Gemma3TextConfig(**SMALL)
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        image_token_index=299,
        boi_token_index=297,
        eoi_token_index=298,
    )
    hf = kit.build_hf(config, seed=6, cls_name="Gemma3ForConditionalGeneration")
    _save_with_tokenizer(hf, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    # the sparse text_config hub checkpoints have: only what differs from the defaults
    saved["text_config"] = {
        k: saved["text_config"][k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "sliding_window",
            "query_pre_attn_scalar",
            "layer_types",
            "max_position_embeddings",
            "model_type",
        )
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    llm = _llm(tmp_path)
    model = llm.engine.parts.loaded.model
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert model.config["rope_local_base_freq"] == 10000.0  # a default, not in the file
    # the engine sized everything from the flattened, completed config too
    engine_config = llm.engine.parts.loaded.config
    assert "text_config" not in engine_config and engine_config["vocab_size"] == 300
    assert engine_config["rms_norm_eps"] == 1e-6
    for prompt, out in zip(PROMPTS, _generate(llm, PROMPTS)):
        assert out.outputs[0].token_ids == _hf_tokens(hf, prompt)
