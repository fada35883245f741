"""Gemma GGUF files: llama.cpp's names, its ``+1`` on every norm weight, and the config it
implies, end to end.

Tiny random transformers models are written with the ``gguf`` package's writer as llama.cpp's
converter writes them (``write_gguf`` in conftest), read back through the tallow-format-gguf format
(whose generic config ``config_from_gguf`` completes) and compared with the original model and
with transformers' own GGUF loader on the same file.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("gguf", reason="the gguf package writes the test files")
gguf_format = pytest.importorskip(
    "tallow_format_gguf.format", reason="tallow-format-gguf (the GGUF weight format) not installed"
)

from tallow.layers import ArchConfig, BuildContext  # noqa: E402

from tallow_model_gemma.model import Gemma2ForCausalLM, Gemma3ForCausalLM  # noqa: E402

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    sliding_window=6,
)


def _load(path, cls):
    ckpt = gguf_format.GGUFFormat().load(str(path))
    assert ckpt.naming == "gguf" and ckpt.architecture == f"gguf:{cls.gguf_architectures[0]}"
    cfg = cls.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    model = cls(ArchConfig(cfg), BuildContext())
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    return model.eval()


def _prompt_logits(model, kit):
    return kit.PagedRunner(model).greedy(0, kit.PROMPT, 0)[2]


def _transformers_gguf(path, **config):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation="eager",
        **config,
    )
    return model.eval()


def test_gemma3_gguf(tmp_path, kit):
    """Sliding-window pattern (every 6th layer global) and the local rope base are not in the
    file: they come from what llama.cpp assumes, as transformers' GGUF loader does."""
    config = transformers.Gemma3TextConfig(**SMALL, head_dim=32, query_pre_attn_scalar=32)
    hf = kit.build_hf(config, seed=21)
    path = tmp_path / "gemma3.gguf"
    kit.write_gguf(path, hf, "gemma3")
    model = _load(path, Gemma3ForCausalLM)
    assert model.lm_head.tied
    windows = [layer.self_attn.attn.layer.sliding_window for layer in model.model.layers]
    assert windows == [6, 6, 6, 6, 6, None]
    ours = _prompt_logits(model, kit)
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    kit.assert_close_logits(ours, ref, "gemma3 GGUF vs original")
    # transformers' GGUF loader keeps its config class's query_pre_attn_scalar (256) where
    # llama.cpp (and tallow) take the head size, so it is told the tiny model's value
    theirs = kit.hf_generate(
        _transformers_gguf(path, query_pre_attn_scalar=32), kit.PROMPT, steps=0
    )[2]
    kit.assert_close_logits(ours, theirs, "gemma3 GGUF vs transformers' GGUF loader")


def test_gemma2_gguf_softcaps_from_metadata(tmp_path, kit):
    config = transformers.Gemma2Config(
        **SMALL,
        head_dim=16,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=1.5,
    )
    hf = kit.build_hf(config, seed=22)
    path = tmp_path / "gemma2.gguf"
    kit.write_gguf(path, hf, "gemma2")
    model = _load(path, Gemma2ForCausalLM)
    assert model.final_softcap == 1.5
    assert model.model.layers[0].self_attn.attn.layer.logit_softcap == 2.0
    assert [layer.self_attn.attn.layer.sliding_window for layer in model.model.layers] == [
        6,
        None,
    ] * 3
    ours = _prompt_logits(model, kit)
    kit.assert_close_logits(
        ours, kit.hf_generate(hf, kit.PROMPT, steps=0)[2], "gemma2 GGUF vs original"
    )


def test_norms_are_stored_plus_one(tmp_path, kit):
    """Reading the same file as if its norms were stored as the checkpoint's ``weight`` must
    change the output: the test above would otherwise not show the shift happens."""
    config = transformers.Gemma3TextConfig(**SMALL, head_dim=32, query_pre_attn_scalar=32)
    hf = kit.build_hf(config, seed=23)
    path = tmp_path / "gemma3.gguf"
    kit.write_gguf(path, hf, "gemma3")
    model = _load(path, Gemma3ForCausalLM)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "RMSNorm":
                module.weight += 1.0  # as if nothing were subtracted on load
    wrong = _prompt_logits(model, kit)
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    assert float((wrong - ref).abs().max()) > 1e-2


def test_window_pattern_and_local_base_from_metadata(tmp_path, kit):
    """Newer converters store the pattern (a period) and the local rope base: both are read."""
    config = transformers.Gemma3TextConfig(
        **SMALL,
        head_dim=32,
        query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
    )
    hf = kit.build_hf(config, seed=24)
    path = tmp_path / "gemma3.gguf"
    kit.write_gguf(
        path,
        hf,
        "gemma3",
        extra={"attention.sliding_window_pattern": 3, "rope.freq_base_swa": 500.0},
    )
    model = _load(path, Gemma3ForCausalLM)
    assert [layer.self_attn.attn.layer.sliding_window for layer in model.model.layers] == [
        6,
        6,
        None,
    ] * 2
    kit.assert_close_logits(
        _prompt_logits(model, kit),
        kit.hf_generate(hf, kit.PROMPT, steps=0)[2],
        "pattern from metadata",
    )


@pytest.mark.parametrize(
    ("arch", "layers", "scalar"),
    [("gemma2", 26, 256), ("gemma2", 46, 144), ("gemma3", 34, 256), ("gemma3", 62, 168)],
)
def test_attention_scale_follows_llama_cpp(arch, layers, scalar):
    """``query_pre_attn_scalar`` is not stored: the 27B models use hidden / heads."""
    hidden, heads = {("gemma2", 46): (4608, 32), ("gemma3", 62): (5376, 32)}.get(
        (arch, layers), (2560, 8)
    )
    metadata = {"general.architecture": arch}
    config = {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 4,
        "head_dim": 256 if scalar == 256 else 128,
        "num_hidden_layers": layers,
        "intermediate_size": 1024,
        "vocab_size": 100,
        "sliding_window": None,
    }
    cls = Gemma3ForCausalLM if arch == "gemma3" else Gemma2ForCausalLM
    cfg = cls.config_from_gguf(metadata, config)
    assert cfg["query_pre_attn_scalar"] == scalar
    if arch == "gemma2":
        assert (
            cfg["sliding_window"],
            cfg["attn_logit_softcapping"],
            cfg["final_logit_softcapping"],
        ) == (4096, 50.0, 30.0)
    else:
        assert cfg["rope_local_base_freq"] == 10000.0 and cfg["sliding_window_pattern"] == 6
