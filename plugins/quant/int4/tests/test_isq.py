"""Load-time quantization (``model.isq: int4``) on CPU: each float matrix becomes 4-bit codes
with a float16 scale per 128 columns as it arrives; the model then computes what the float
model of the decoded weights computes; ``random:`` models are drawn and quantized a slice of
rows at a time; the quantizer's choices are the nearest codes for the stored scale."""

from __future__ import annotations

import pytest
import torch

from engines import engine, greedy
from tallow_quant_int4 import isq
from tallow_quant_int4.layout import dequantize

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoint")
PROMPTS = [[3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]]


def test_codes_are_the_nearest_for_the_stored_scale():
    w = torch.randn(64, 384, generator=torch.Generator().manual_seed(0))
    q = isq.quantize_rtn(w, torch.device("cpu"))
    assert (q.bits, q.group, q.zeros, q.perm) == (4, 128, None, None)
    assert q.scales.dtype == torch.float16 and q.scales.shape == (64, 3)
    decoded = dequantize(q)
    scale = q.scales.float().repeat_interleave(128, dim=1)
    # within half a step of the weight, except where the chosen range clips it
    inside = w.abs() <= 7 * scale
    assert bool(((decoded - w).abs()[inside] <= scale[inside] / 2 + 1e-6).all())
    # the search never does worse than the plain largest-magnitude scale
    plain = w.reshape(64, 3, 128)
    top = torch.maximum(plain.amax(-1) / 7, (-plain).amax(-1) / 8).to(torch.float16).float()
    codes = torch.round(plain / top[..., None]).clamp(-8, 7)
    plain_err = ((codes * top[..., None] - plain) ** 2).sum(-1)
    err = ((decoded.reshape(64, 3, 128) - plain) ** 2).sum(-1)
    assert bool((err <= plain_err + 1e-7).all()) and float(err.sum()) < float(plain_err.sum())


def test_group_size_follows_the_row_length():
    assert isq.group_size_for(4096) == 128 and isq.group_size_for(96) == 32
    assert isq.group_size_for(100) is None
    assert isq.quantize_rtn(torch.randn(4, 100), torch.device("cpu")) is None
    assert isq.quantize_rtn(torch.randn(4, 192), torch.device("cpu")).group == 64
    zero = isq.quantize_rtn(torch.zeros(2, 128), torch.device("cpu"))
    assert bool((dequantize(zero) == 0).all())


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A tiny random llama saved as safetensors, and the same model whose matrices (the head
    included: it is not tied) are the decoded int4 weights."""
    from tallow.engine.random_model import synthetic_tokenizer

    root = tmp_path_factory.mktemp("isq")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=320,
                                      max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(root / "float")
    synthetic_tokenizer(320).save(str(root / "float" / "tokenizer.json"))
    decoded = {name: dequantize(isq.quantize_rtn(w.float(), torch.device("cpu")))
               for name, w in model.state_dict().items()
               if w.dim() == 2 and "embed_tokens" not in name}
    model.load_state_dict(decoded, strict=False)
    model.save_pretrained(root / "decoded")
    synthetic_tokenizer(320).save(str(root / "decoded" / "tokenizer.json"))
    return root / "float", root / "decoded"


def test_isq_equals_the_float_model_of_the_decoded_weights(hf_dirs):
    float_dir, decoded_dir = hf_dirs
    quantized = engine(str(float_dir), isq="int4")
    loaded = quantized.parts.loaded
    assert loaded.quant.isq == "int4"
    model = loaded.model
    assert model.model.layers[0].self_attn.qkv_proj.quant_method.type_names() == ["int4 g128"]
    assert model.lm_head.quant_method.type_names() == ["int4 g128"]
    assert loaded.quant.summary() == "int4: int4 g128 x9, quantized at load to int4"
    reference = engine(str(decoded_dir))
    assert reference.parts.loaded.quant is None
    assert greedy(quantized, PROMPTS, 8) == greedy(reference, PROMPTS, 8)


def test_a_random_model_is_drawn_and_quantized_a_slice_at_a_time(monkeypatch):
    from tallow_quant_int4.method import IntLinearMethod

    seen = []
    real = isq.quantize_rtn

    def recording(weight, device, bits=4):
        seen.append(tuple(weight.shape))
        return real(weight, device, bits)

    monkeypatch.setattr(isq, "quantize_rtn", recording)
    monkeypatch.setattr(IntLinearMethod, "random_chunk_rows", 100)
    eng = engine("random:tiny-llama", isq="int4")
    assert seen and max(rows for rows, _ in seen) <= 100
    dense = engine("random:tiny-llama")

    def linear_bytes(e) -> int:
        model = e.parts.loaded.model
        return sum(b.nbytes for n, b in model.named_buffers() if ".int_" in f".{n}"
                   or n.split(".")[-1].startswith("int_")) + sum(
            p.nbytes for n, p in model.named_parameters() if "embed" not in n
            and p.dim() == 2)

    assert linear_bytes(eng) < 0.2 * linear_bytes(dense)  # 4.1 bits per weight, not 32
    assert len(greedy(eng, PROMPTS, 8)[0]) == 8
