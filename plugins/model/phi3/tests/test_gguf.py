"""Phi-3 GGUF files as llama.cpp's converter writes them (fused ``attn_qkv`` and ``ffn_up``,
LongRoPE as ``rope.scaling.attn_factor`` plus two factor tensors), read through tallow-format-gguf
with a config built by ``config_from_gguf`` alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("gguf", reason="the gguf package writes the test files")

from tallow.layers import LongRoPERotaryEmbedding, WeightLoadError  # noqa: E402
from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors, write_gguf  # noqa: E402
from tallow.plugin.testing.model import hf_greedy  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow_format_gguf.format import GGUFFormat  # noqa: E402

from tallow_model_phi3.model import Phi3ForCausalLM  # noqa: E402

ORIGINAL, MAX = 16, 64
SHORT = [1.0 + 0.15 * i for i in range(6)]
LONG = [1.5 + 0.9 * i for i in range(6)]
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42, 8, 99, 150, 7, 222, 13, 60, 91]


def _phi4_mini_like():
    config = transformers.Phi3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        rms_norm_eps=1e-5,
        max_position_embeddings=MAX,
        original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.75,
        rope_scaling={
            "type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": ORIGINAL,
        },
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return random_hf_model(config, seed=22)


def _write(path, hf, *, longrope: bool = True, factors: bool = True) -> None:
    cfg = hf.config
    # the converter writes 0 for "no window"
    metadata = gguf_metadata(
        cfg, **{"rope.scaling.original_context_length": ORIGINAL, "attention.sliding_window": 0}
    )
    assert metadata["rope.dimension_count"] == 12
    tensors = list(gguf_tensors(hf.state_dict(), "phi3", cfg.num_hidden_layers))
    if longrope:
        metadata["rope.scaling.attn_factor"] = math.sqrt(
            1 + math.log(MAX / ORIGINAL) / math.log(ORIGINAL)
        )
    if factors:
        tensors += [
            ("rope_factors_long.weight", np.array(LONG, dtype=np.float32)),
            ("rope_factors_short.weight", np.array(SHORT, dtype=np.float32)),
        ]
    write_gguf(path, "phi3", metadata, tensors, cfg.vocab_size)


def _load(path) -> Phi3ForCausalLM:
    ckpt = GGUFFormat().load(str(path))
    assert ckpt.naming == "gguf" and ckpt.architecture == "gguf:phi3"
    config = Phi3ForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    return load_model(Phi3ForCausalLM, ckpt, config=config)


def test_gguf_with_longrope_matches_transformers(tmp_path):
    hf = _phi4_mini_like()
    names = [name for name, _ in gguf_tensors(hf.state_dict(), "phi3", 2)]
    assert "blk.0.attn_qkv.weight" in names and "blk.0.ffn_up.weight" in names
    assert not any("ffn_gate" in n or "attn_q." in n for n in names)
    path = tmp_path / "phi4-mini.gguf"
    _write(path, hf)
    model = _load(path)
    rotary = model.model.rotary_emb
    assert isinstance(rotary, LongRoPERotaryEmbedding) and rotary.rotary_dim == 12
    torch.testing.assert_close(
        rotary.long_inv_freq, 1.0 / (torch.tensor(LONG) * 10000.0 ** (torch.arange(0, 12, 2) / 12))
    )
    assert [layer.self_attn.attn.layer.sliding_window for layer in model.model.layers] == [
        None,
        None,
    ]
    assert_greedy_parity(model, hf, PROMPT, 20, what="phi3 GGUF, long prompt")
    assert_greedy_parity(_load(path), hf, PROMPT[:6], 10, what="phi3 GGUF, short prompt")


def test_gguf_missing_factor_tensors_is_an_error(tmp_path):
    hf = _phi4_mini_like()
    path = tmp_path / "no-factors.gguf"
    _write(path, hf, factors=False)
    with pytest.raises(
        WeightLoadError, match="rope_factors_long.weight and rope_factors_short.weight is missing"
    ):
        _load(path)


def test_gguf_factor_tensors_without_longrope_metadata_are_refused(tmp_path):
    hf = _phi4_mini_like()
    path = tmp_path / "no-attn-factor.gguf"
    _write(path, hf, longrope=False)
    with pytest.raises(WeightLoadError, match="no LongRoPE scaling"):
        _load(path)


def test_config_from_gguf():
    metadata = {
        "general.architecture": "phi3",
        "phi3.block_count": 32,
        "phi3.embedding_length": 3072,
        "phi3.feed_forward_length": 8192,
        "phi3.attention.head_count": 24,
        "phi3.attention.head_count_kv": 8,
        "phi3.context_length": 131072,
        "phi3.rope.dimension_count": 96,
        "phi3.rope.freq_base": 10000.0,
        "phi3.rope.scaling.original_context_length": 4096,
        "phi3.rope.scaling.attn_factor": 1.19,
        "phi3.attention.sliding_window": 0,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(200064)],
    }
    cfg = Phi3ForCausalLM.config_from_gguf(metadata, {})
    assert cfg["architectures"] == ["Phi3ForCausalLM"] and cfg["head_dim"] == 128
    assert cfg["partial_rotary_factor"] == 0.75
    assert cfg["rope_scaling"] == {
        "rope_type": "longrope",
        "attention_factor": 1.19,
        "original_max_position_embeddings": 4096,
        "short_factor": None,
        "long_factor": None,
    }


def _q8_0_file(tmp_path):
    """A Q8_0 Phi-3 file (fused attn_qkv and ffn_up kept quantized) without LongRoPE, which
    transformers' own GGUF loader reads too: the oracle of the quantized path."""
    config = transformers.Phi3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        rms_norm_eps=1e-5,
        max_position_embeddings=MAX,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    hf = random_hf_model(config, seed=22)
    path = tmp_path / "phi3-q8_0.gguf"
    write_gguf(
        path,
        "phi3",
        gguf_metadata(config),
        gguf_tensors(hf.state_dict(), "phi3", 2),
        config.vocab_size,
        quantize="Q8_0",
    )
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    return path, theirs.eval()


def _engine_tokens(path, **config) -> tuple[list[int], object]:
    from tallow import SamplingParams
    from tallow.plugin.testing import offline_llm

    llm = offline_llm(
        str(path),
        plugins=[
            "tallow-model-phi3",
            "tallow-format-gguf",
            "tallow-quant-gguf",
            "tallow-attention-triton",
        ],
        config={"model": {"dtype": "float32"}, **config},
    )
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    return list(out.outputs[0].token_ids), llm.engine.parts.loaded.quant


@pytest.mark.parametrize("keep_quantized", [False, True])
def test_q8_0_file_through_the_engine_matches_transformers_gguf_loader(tmp_path, keep_quantized):
    """The engine on a quantized file, dequantized at load or kept in Q8_0 blocks by the
    tallow-quant-gguf scheme (fused projections included), generates what transformers
    generates from the same file."""
    path, theirs = _q8_0_file(tmp_path)
    settings = {"plugins": {"settings": {"tallow-quant-gguf": {"cpu": keep_quantized}}}}
    tokens, quant = _engine_tokens(path, **settings)
    assert (quant is not None) == keep_quantized
    assert tokens == hf_greedy(theirs, PROMPT, 20)[0]


@pytest.mark.gpu
def test_q8_0_file_through_the_engine_on_cuda(tmp_path):
    """On the GPU the quant scheme keeps the blocks and runs its Triton matmuls on the fused
    qkv and gate|up projections; Triton attention, CUDA graphs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path, theirs = _q8_0_file(tmp_path)
    tokens, quant = _engine_tokens(path, model={"dtype": "float32", "device": "cuda"})
    assert quant is not None
    assert tokens == hf_greedy(theirs, PROMPT, 20)[0]
