"""Phi-3 against transformers on tiny random models: LongRoPE within and past the original
context, partial rotary (Phi-4-mini), the sliding window (Phi-3-mini-4k).

Each model is saved by transformers as safetensors (q/k/v and gate/up fused, as the real
checkpoints are), read back through tallow-format-safetensors into ``Phi3ForCausalLM`` and run through a
paged KV cache; the prompt's logits, 20 greedy tokens and every step's logits must match
transformers' forward and greedy ``generate``.
"""

from __future__ import annotations

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import LongRoPERotaryEmbedding  # noqa: E402
from tallow.plugin.testing.model import assert_close_logits  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_engine_greedy,
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow.plugin.testing.paged_runner import PagedRunner  # noqa: E402
from tallow_format_safetensors.format import SafetensorsFormat  # noqa: E402

from tallow_model_phi3.model import Phi3ForCausalLM  # noqa: E402

STEPS = 20
ORIGINAL = 16  # a tiny original context, so prompts and generation run past it
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-5,
    max_position_embeddings=64,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _factors(pairs: int, start: float, step: float) -> list[float]:
    return [start + step * i for i in range(pairs)]


def _longrope(kind: str, pairs: int, original: int) -> dict:
    return {
        "type": kind,
        "short_factor": _factors(pairs, 1.0, 0.15),
        "long_factor": _factors(pairs, 1.5, 0.9),
        "original_max_position_embeddings": original,
    }


CONFIGS = {
    # head_dim 16: 8 rotated pairs; the first configs' spelling "su"
    "phi3-longrope-su": lambda: transformers.Phi3Config(
        **SMALL,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=_longrope("su", 8, ORIGINAL),
    ),
    # Phi-4-mini: 3/4 of each head rotated, tied embeddings; the top-level original length
    # wins over the one in rope_scaling
    "phi4-mini-partial": lambda: transformers.Phi3Config(
        **SMALL,
        original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.75,
        tie_word_embeddings=True,
        rope_scaling=_longrope("longrope", 6, 2 * ORIGINAL),
    ),
    "phi3-window": lambda: transformers.Phi3Config(**SMALL, sliding_window=8),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]  # 12 tokens: under ORIGINAL
LONG_PROMPT = PROMPT + [8, 99, 150, 7, 222, 13, 60, 91]  # 20 tokens: over it


def _save(name: str, path) -> object:
    hf = random_hf_model(CONFIGS[name](), seed=zlib.crc32(name.encode()) % 1000)
    hf.save_pretrained(str(path), safe_serialization=True)
    return hf


def _load(path, **kw) -> Phi3ForCausalLM:
    ckpt = SafetensorsFormat().load(str(path))
    assert ckpt.architecture == "Phi3ForCausalLM"
    return load_model(Phi3ForCausalLM, ckpt, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity_past_the_original_context(name, tmp_path):
    """A 20-token prompt and 20 greedy steps, all past the original 16 tokens: every token is
    rotated with the long factors, in the prompt and in generation."""
    hf = _save(name, tmp_path)
    model = _load(tmp_path)
    assert_greedy_parity(model, hf, LONG_PROMPT, STEPS, what=name)


@pytest.mark.parametrize("name", ["phi3-longrope-su", "phi4-mini-partial"])
def test_greedy_parity_within_the_original_context(name, tmp_path):
    """6 prompt tokens and 10 generated stay within the original 16: the short factors."""
    hf = _save(name, tmp_path)
    model = _load(tmp_path)
    assert_greedy_parity(model, hf, PROMPT[:6], 10, what=f"{name} short")


def test_longrope_is_built_with_both_factor_sets(tmp_path):
    _save("phi4-mini-partial", tmp_path)
    rotary = _load(tmp_path).model.rotary_emb
    assert isinstance(rotary, LongRoPERotaryEmbedding)
    assert rotary.rotary_dim == 12 and rotary.original_max_position == ORIGINAL
    assert not torch.allclose(rotary.inv_freq, rotary.long_inv_freq)
    # factor 64 / 16 = 4: sqrt(1 + ln 4 / ln 16)
    assert rotary.attention_scaling == pytest.approx(1.5**0.5)


def test_short_and_long_sequences_share_a_step(tmp_path):
    """Each sequence of a flat batch picks its own factor set: one past the original context
    and one within it, prefilled in the same step, match their separate transformers runs."""
    hf = _save("phi3-longrope-su", tmp_path)
    model = _load(tmp_path)
    runner = PagedRunner(model)
    runner.add(0)
    runner.add(1)
    long_logits, short_logits = runner.step([(0, LONG_PROMPT), (1, PROMPT)])
    with torch.no_grad():
        ref_long = hf(torch.tensor([LONG_PROMPT])).logits[0]
        ref_short = hf(torch.tensor([PROMPT])).logits[0]
    assert_close_logits(long_logits, ref_long, "long sequence")
    assert_close_logits(short_logits, ref_short, "short sequence")
    # the factor sets differ enough that rotating with the wrong one shows
    assert float((ref_short - ref_long[: len(PROMPT)]).abs().max()) > 1e-3


def test_sliding_window_on_every_layer(tmp_path):
    _save("phi3-window", tmp_path)
    windows = [layer.self_attn.attn.layer.sliding_window for layer in _load(tmp_path).model.layers]
    assert windows == [8, 8]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["phi3-longrope-su", "phi4-mini-partial"])
def test_parity_on_cuda(name, tmp_path):
    """Built and run on the GPU (the Triton rotary kernel reading the two-table cache),
    against transformers on the CPU, past and within the original context; bfloat16 stays
    near float32."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _save(name, tmp_path)
    load = lambda **kw: _load(tmp_path, **kw)  # noqa: E731
    assert_cuda_parity(load, hf, LONG_PROMPT, STEPS, what=f"{name} long")
    assert_cuda_parity(load, hf, PROMPT[:6], 10, what=f"{name} short")


@pytest.mark.gpu
def test_through_the_engine_on_cuda(tmp_path):
    """The engine on the GPU: Triton attention, and CUDA graphs replaying the decode steps
    with LongRoPE's row offsets computed on the device."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = _save("phi4-mini-partial", tmp_path)
    engine = dict(
        plugins=["tallow-model-phi3", "tallow-format-safetensors", "tallow-attention-triton"],
        config={"model": {"device": "cuda"}},
    )
    # sequences past the original context from the first step, and one that stays within it
    assert_engine_greedy(tmp_path, hf, [LONG_PROMPT, LONG_PROMPT[::-1]], STEPS, **engine)
    assert_engine_greedy(tmp_path, hf, [PROMPT[:6]], 10, **engine)
