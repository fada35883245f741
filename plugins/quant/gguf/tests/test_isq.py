"""Load-time quantization (``model.isq``) on CPU: every float tensor is quantized as it arrives
into the same kernels, and the model computes exactly what a float model whose weights are the
``gguf`` package's decoding of those blocks computes; ``random:`` models draw and quantize one
slice of rows at a time; wrong requests are refused clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quant_engine_runs import engine as _engine
from quant_engine_runs import greedy
from quant_gguf_files import MIXED, write_llama_gguf
from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoint")
PROMPTS = [[3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A tiny random llama (256-wide rows) saved as safetensors, and the same model whose
    matrices are replaced by ``gguf.quants.dequantize`` of this plugin's q4_k blocks."""
    import gguf

    from tallow.engine.random_model import synthetic_tokenizer
    from tallow_quant_gguf.quantize import quantize

    root = tmp_path_factory.mktemp("isq")
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(root / "float")
    synthetic_tokenizer(320).save(str(root / "float" / "tokenizer.json"))
    decoded = {}
    for name, w in model.state_dict().items():
        if w.dim() == 2:
            # every matrix takes q4_k (256-wide rows: no fallback type)
            blocks = quantize(w.float(), "q4_k").numpy()
            values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_K)
            decoded[name] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    model.load_state_dict(decoded, strict=False)
    model.save_pretrained(root / "decoded")
    synthetic_tokenizer(320).save(str(root / "decoded" / "tokenizer.json"))
    return root / "float", root / "decoded"


def test_isq_equals_the_float_model_of_the_decoded_blocks(hf_dirs):
    float_dir, decoded_dir = hf_dirs
    isq = _engine(str(float_dir), isq="q4_k")
    loaded = isq.parts.loaded
    assert loaded.quant.isq == "q4_k"
    model = loaded.model
    types = lambda m: [p.type_name for p in m.quant_method.parts]  # noqa: E731
    assert types(model.model.layers[0].self_attn.qkv_proj) == ["Q4_K"]
    assert types(model.model.embed_tokens) == ["Q4_K"] and types(model.lm_head) == ["Q4_K"]
    reference = _engine(str(decoded_dir))
    assert reference.parts.loaded.quant is None
    assert loaded.weight_bytes < 0.25 * reference.parts.loaded.weight_bytes
    assert greedy(isq, PROMPTS, 8) == greedy(reference, PROMPTS, 8)


def test_a_random_model_is_drawn_and_quantized_a_slice_at_a_time(monkeypatch):
    from tallow_quant_gguf import isq as isq_module
    from tallow_quant_gguf import method

    seen = []
    real = isq_module.quantize

    def recording(weight, qtype):
        seen.append((tuple(weight.shape), qtype))
        return real(weight, qtype)

    monkeypatch.setattr(isq_module, "quantize", recording)
    monkeypatch.setattr(method, "RANDOM_CHUNK_ROWS", 100)
    engine = _engine("random:tiny-llama", isq="q8_0")
    assert max(rows for (rows, _), _ in seen) <= 100
    assert {q for _, q in seen} == {"q8_0"}
    # the head (512 rows) came in six slices, and nothing float stayed behind
    assert sum(rows for (rows, cols), _ in seen if cols == 64) >= 2 * 512
    dense = _engine("random:tiny-llama")

    def weights(e: LLMEngine) -> int:  # parameters and planes, without the rotary tables
        model = e.parts.loaded.model
        return e.parts.loaded.weight_bytes - sum(
            b.nbytes for n, b in model.named_buffers() if "cos_sin" in n or "inv_freq" in n
        )

    assert weights(engine) < 0.28 * weights(dense)  # 8.5 bits per weight, not 32
    assert len(greedy(engine, PROMPTS, 8)[0]) == 8


def test_a_float_gguf_file_is_quantized_at_load(tmp_path):
    layers = [{k: "F16" for k in MIXED[0]}]
    path = write_llama_gguf(
        tmp_path / "f16.gguf", layer_types=layers, embed_type="F32", head_type="F16"
    )
    engine = _engine(str(path), isq="q5_0")
    summary = engine.parts.loaded.quant.summary()
    # qkv, o, gate_up, down (neighbours of one type stacked), embedding and head
    assert summary == "gguf: Q5_0 x6, quantized at load to q5_0", summary


def test_wrong_requests_are_refused_clearly(tmp_path):
    from tallow.config import ConfigError
    from tallow.plugin import SelectionError

    path = write_llama_gguf(tmp_path / "q.gguf")
    with pytest.raises(Exception, match="already quantized"):
        _engine(str(path), isq="q4_k")
    with pytest.raises(ConfigError, match=r"model\.isq"):
        config_from_mapping({"model": {"isq": "Q4 K"}})
    # a well-formed type no installed scheme offers: refused listing the offered ones
    with pytest.raises(
        SelectionError,
        match=r"model\.isq 'q9_k': no installed quant scheme .*"
        r"q4_0, .*q6_k \(tallow-quant-gguf\)",
    ):
        _engine(str(path), isq="q9_k")
