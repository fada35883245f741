"""Load-time quantization (``model.isq: fp8``) on the CPU: every linear layer of a float
checkpoint (and with ``isq_vocab`` the embedding and head) becomes e4m3 with one float32 scale
per row as it arrives, and the model computes what transformers computes with those weights
(quantized here with plain torch: ``scale = amax(|row|) / 448``, values ``w / scale`` rounded
to nearest even), with the activations of products of more than 16 rows quantized per token. ``random:`` models draw and
quantize a slice of rows at a time; what cannot work is refused clearly."""

from __future__ import annotations

import pytest
import torch

from fp8_checkpoints import (
    FakeQuantActivations,
    oracle_logits,
    save_tokenizer,
    tiny_llama,
    write_hf_fp8,
)
from tallow.config import ConfigError, config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow.plugin import SelectionError
from tallow.plugin.testing.paged_runner import PagedRunner

PROMPT = [3, 17, 250, 9, 64, 101, 7]
LONG_PROMPT = [(i * 53 + 5) % 300 + 3 for i in range(20)]
STEPS = 6


def per_row_fp8(w: torch.Tensor) -> torch.Tensor:
    """``w`` through e4m3 with one scale per row, dequantized (float32)."""
    scale = (w.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1e-12)
    return (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale


VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("isq") / "float"
    tiny_llama(1).save_pretrained(directory)
    save_tokenizer(directory)
    return directory


def oracle_model(vocab: bool):
    """The transformers model of the quantized weights (every linear layer; with ``vocab`` the
    embedding and head too)."""
    model, oracle = tiny_llama(1), tiny_llama(1)
    oracle.load_state_dict(
        {
            name: per_row_fp8(w) if w.dim() == 2 and (vocab or name not in VOCAB) else w
            for name, w in model.state_dict().items()
        }
    )
    return oracle


def engine(source: str, isq_vocab: bool | None = None, **model) -> LLMEngine:
    settings = {} if isq_vocab is None else {"tallow-quant-fp8": {"isq_vocab": isq_vocab}}
    return LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": source,
                    "device": "cpu",
                    "dtype": "float32",
                    "max_model_len": 128,
                    **model,
                },
                "cache": {"num_blocks": 32},
                "plugins": {"settings": settings},
            }
        )
    )


@pytest.mark.parametrize("vocab", [False, True])
def test_isq_equals_the_model_of_the_quantized_weights(float_dir, vocab):
    eng = engine(str(float_dir), isq_vocab=vocab if vocab else None, isq="fp8")  # False: default
    loaded = eng.parts.loaded
    assert loaded.quant.summary() == (
        "fp8: e4m3 per channel, activations per token; "
        f"{10 if vocab else 8} layers (quantized at load)"
    )
    model = loaded.model
    assert model.model.layers[1].mlp.down_proj.qweight.dtype == torch.float8_e4m3fn
    for layer in (model.model.embed_tokens, model.lm_head):
        if vocab:
            assert layer.qweight.dtype == torch.float8_e4m3fn
        else:
            assert layer.weight.dtype == torch.float32
    dense = engine(str(float_dir)).parts.loaded
    # 8 bits and a scale per row, not 32 (the float32 embedding and head of this tiny model
    # are 40 % of it)
    assert loaded.weight_bytes < (0.3 if vocab else 0.55) * dense.weight_bytes

    oracle = oracle_model(vocab)
    for seq, prompt in enumerate((PROMPT, LONG_PROMPT)):
        hooks = FakeQuantActivations(oracle, "token", gemv_max_rows=16, head=vocab)
        try:
            expected = oracle_logits(oracle, prompt, STEPS)
        finally:
            hooks.remove()
        tokens, steps, prompt_logits = PagedRunner(model).greedy(seq, prompt, STEPS)
        scale = float(expected[1].abs().max())
        torch.testing.assert_close(prompt_logits, expected[1], rtol=0, atol=2e-4 * scale)
        for a, b in zip(steps, expected[2]):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-4 * scale)
        assert tokens == expected[0]


def test_a_random_model_is_drawn_and_quantized_a_slice_at_a_time(monkeypatch):
    from tallow_quant_fp8 import method, weights

    seen = []
    real = weights.quantize_rows

    def recording(w):
        seen.append(tuple(w.shape))
        return real(w)

    monkeypatch.setattr(method, "quantize_rows", recording)
    monkeypatch.setattr(method, "RANDOM_CHUNK_ROWS", 100)
    eng = engine("random:tiny-llama", isq_vocab=True, isq="fp8")
    assert seen and max(rows for rows, _ in seen) <= 100
    # the head (512 rows) came in slices
    assert sum(rows for rows, cols in seen if cols == 64) >= 2 * 512
    dense = engine("random:tiny-llama")

    def weights_of(e: LLMEngine) -> int:  # parameters and buffers, without the rotary tables
        model = e.parts.loaded.model
        return e.parts.loaded.weight_bytes - sum(
            b.nbytes for n, b in model.named_buffers() if "cos_sin" in n or "inv_freq" in n
        )

    assert weights_of(eng) < 0.3 * weights_of(dense)


def test_wrong_requests_are_refused_clearly(tmp_path):
    directory = tmp_path / "fp8"
    write_hf_fp8(tiny_llama(2), directory, block=False)
    with pytest.raises(Exception, match="already quantized"):
        engine(str(directory), isq="fp8")
    with pytest.raises(ConfigError, match=r"model\.isq"):
        config_from_mapping({"model": {"isq": "FP-8"}})
    # a well-formed type no installed scheme offers: refused listing those offered
    with pytest.raises(
        SelectionError,
        match=r"model\.isq 'fp6': no installed quant scheme .*"
        r"fp8 \(tallow-quant-fp8\)",
    ):
        engine("random:tiny-llama", isq="fp6")
    with pytest.raises(ValueError, match=r"plugins\.settings\.tallow-quant-fp8\.gemv_max_rows"):
        LLMEngine.from_config(
            config_from_mapping(
                {
                    "model": {"source": "random:tiny-llama", "device": "cpu", "isq": "fp8"},
                    "plugins": {"settings": {"tallow-quant-fp8": {"gemv_max_rows": 64}}},
                }
            )
        )


def test_isq_is_refused_on_a_gpu_without_float8(monkeypatch):
    from tallow_quant_fp8 import ops
    from tallow_quant_fp8.scheme import Fp8QuantScheme

    monkeypatch.setattr(ops, "device_capability", lambda device: (8, 0))
    config = config_from_mapping({"model": {"device": "cuda:0", "isq": "fp8"}})
    reasons = Fp8QuantScheme.validate(config)
    assert len(reasons) == 1 and "compute capability 8.9" in reasons[0] and "8.0" in reasons[0]
    # a checkpoint in fp8 is still served there (by the reference path)
    assert Fp8QuantScheme.validate(config_from_mapping({"model": {"device": "cuda:0"}})) == []
