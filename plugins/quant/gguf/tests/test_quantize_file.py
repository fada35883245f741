"""Quantized GGUF files written by ``tallow_quant_gguf.quantize_file``, checked by their
readers: the ``gguf`` package (types, shapes, metadata), transformers
(``from_pretrained(dir, gguf_file=...)``) and tallow itself, on tiny random llama and qwen2
models saved by transformers; plus llama.cpp's mix rules, case by case (the authority on types
and bytes is test_quantize_llama_cpp.py, which runs llama.cpp itself)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tallow_quant_gguf.quantize_file import quantize_checkpoint
from tallow_quant_gguf.quantize_mix import (
    FILE_TYPES,
    LLAMA_FILE_TYPES,
    ModelTraits,
    check_file_type,
    layer_of,
    model_traits,
    tensor_type,
    use_more_bits,
)

transformers = pytest.importorskip("transformers", reason="transformers is the GGUF oracle")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Paged attention stores keys and values in blocks.",
    "naïve café über 🙂",
] * 20


# ---------------------------------------------------------------------------------------------
# Mix rules (test_quantize_llama_cpp.py checks them against llama.cpp itself)
# ---------------------------------------------------------------------------------------------
def test_q4_k_m_follows_llama_cpp_rules_on_a_24_layer_model() -> None:
    more = [i for i in range(24) if use_more_bits(i, 24)]
    # first and last eighth, then every third layer from the first eighth on
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    untied = ModelTraits(n_layers=24, tied_output=False)
    tied = ModelTraits(n_layers=24, tied_output=True)
    assert tensor_type("output.weight", (32000, 4096), "q4_k_m", untied) == "q6_k"
    assert tensor_type("token_embd.weight", (32000, 4096), "q4_k_m", untied) == "q4_k"
    assert tensor_type("token_embd.weight", (32000, 4096), "q4_k_m", tied) == "q6_k"
    assert tensor_type("blk.5.attn_v.weight", (1024, 4096), "q4_k_m", untied) == "q6_k"
    assert tensor_type("blk.6.attn_v.weight", (1024, 4096), "q4_k_m", untied) == "q4_k"
    assert tensor_type("blk.23.ffn_down.weight", (4096, 14336), "q5_k_m", untied) == "q6_k"
    assert tensor_type("blk.7.ffn_down.weight", (4096, 14336), "q5_k_m", untied) == "q5_k"
    assert tensor_type("blk.7.attn_q.weight", (4096, 4096), "q4_k_m", untied) == "q4_k"
    assert tensor_type("blk.7.attn_norm.weight", (4096,), "q4_k_m", untied) is None
    assert tensor_type("blk.7.attn_q.bias", (4096,), "q4_k_m", untied) is None


def test_plain_types_keep_the_output_head_wider_as_llama_quantize_does() -> None:
    """``--type q4_0`` is llama.cpp's Q4_0 file: the head is Q6_K (Q8_0 when its rows are not
    whole 256-blocks), a tied embedding with it; everything else Q4_0."""
    untied = ModelTraits(n_layers=24, tied_output=False)
    for plain in ("q4_0", "q4_1", "q5_0", "q5_1", "q6_k"):
        assert tensor_type("output.weight", (151936, 4096), plain, untied) == "q6_k"
        assert tensor_type("token_embd.weight", (151936, 4096), plain, untied) == plain[:4]
    assert tensor_type("output.weight", (151936, 4096), "q8_0", untied) == "q8_0"
    assert (
        tensor_type(
            "token_embd.weight", (151936, 896), "q4_0", ModelTraits(n_layers=24, tied_output=True)
        )
        == "q8_0"
    )
    assert tensor_type("blk.3.ffn_down.weight", (896, 4864), "q4_0", untied) == "q4_0"


def test_the_k_quant_mixes_and_aliases() -> None:
    m = ModelTraits(n_layers=32, tied_output=False, n_gqa=4)
    v, down, out = (1024, 4096), (4096, 14336), (4096, 4096)
    # llama-quantize's aliases: Q4_K is Q4_K_M (file type 15), Q3_K is Q3_K_M, Q5_K is Q5_K_M
    assert LLAMA_FILE_TYPES["q4_k"] == 15 and LLAMA_FILE_TYPES["q3_k"] == 12
    assert LLAMA_FILE_TYPES["q5_k"] == 17 and LLAMA_FILE_TYPES["q4_k_s"] == 14
    assert tensor_type("blk.0.attn_v.weight", v, "q4_k", m) == "q6_k"
    # Q2_K: attn_v Q4_K with 4+ query heads per KV head (else Q3_K); ffn_down, attn_output Q3_K
    assert tensor_type("blk.9.attn_v.weight", v, "q2_k", m) == "q4_k"
    assert tensor_type("blk.9.attn_v.weight", v, "q2_k", ModelTraits(32, False, 2)) == "q3_k"
    assert tensor_type("blk.9.ffn_down.weight", down, "q2_k", m) == "q3_k"
    assert tensor_type("blk.9.attn_output.weight", out, "q2_k", m) == "q3_k"
    assert tensor_type("blk.9.ffn_up.weight", (14336, 4096), "q2_k", m) == "q2_k"
    # Q3_K_M: attn_v Q5_K for the first 2, ffn_down Q5_K for the first 1/16, else Q4_K
    assert [tensor_type(f"blk.{i}.attn_v.weight", v, "q3_k_m", m) for i in (1, 2)] == [
        "q5_k",
        "q4_k",
    ]
    assert [tensor_type(f"blk.{i}.ffn_down.weight", down, "q3_k_m", m) for i in (1, 2)] == [
        "q5_k",
        "q4_k",
    ]
    assert tensor_type("blk.2.attn_output.weight", out, "q3_k_m", m) == "q4_k"
    assert tensor_type("blk.2.attn_q.weight", out, "q3_k_s", m) == "q3_k"
    assert tensor_type("blk.20.ffn_down.weight", down, "q3_k_l", m) == "q5_k"
    # Q4_K_S: attn_v Q5_K for the first 4, ffn_down Q5_K for the first eighth
    assert [tensor_type(f"blk.{i}.attn_v.weight", v, "q4_k_s", m) for i in (3, 4)] == [
        "q5_k",
        "q4_k",
    ]
    assert [tensor_type(f"blk.{i}.ffn_down.weight", down, "q4_k_s", m) for i in (3, 4)] == [
        "q5_k",
        "q4_k",
    ]
    assert tensor_type("blk.0.ffn_down.weight", down, "q5_k_s", m) == "q5_k"
    # a 70B-class model: attn_v raised to Q5_K from Q3_K/Q4_K
    big = ModelTraits(n_layers=80, tied_output=False, n_gqa=8, is_70b=True)
    assert tensor_type("blk.40.attn_v.weight", v, "q4_k_m", big) == "q5_k"
    assert tensor_type("blk.40.attn_v.weight", v, "q3_k_s", big) == "q5_k"
    assert tensor_type("blk.0.attn_v.weight", v, "q4_k_m", big) == "q6_k"
    assert model_traits(
        {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8},
        "gguf:llama",
        tied_output=False,
    ).is_70b
    assert not model_traits(
        {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 64},
        "llama",
        tied_output=False,
    ).is_70b
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model_traits({}, "llama", tied_output=False)


def test_q4_k_m_of_the_shipped_qwen_gguf_reproduces_llama_cpp_types_exactly() -> None:
    """The embedded Qwen2.5-Coder-0.5B GGUF is Q4_K_M from an older llama.cpp, which counted
    the attn_v/ffn_down tensors in name order (blk.0, blk.1, blk.10, ...) where the version
    tallow follows counts them in layer order: given that count as the index, the rules give
    every one of its 291 tensors the type it has (fallbacks included)."""
    from gguf import GGUFReader

    from tallow.default_model import default_model_path

    reader = GGUFReader(default_model_path())
    names = [t.name for t in reader.tensors]
    traits = ModelTraits(n_layers=24, tied_output="output.weight" not in names, n_gqa=7)
    name_order = sorted(range(24), key=str)
    got = {}
    for t in reader.tensors:
        layer = layer_of(t.name)
        index = None if layer is None else name_order.index(layer)
        kind = tensor_type(
            t.name, tuple(int(d) for d in reversed(list(t.shape))), "q4_k_m", traits, index=index
        )
        got[t.name] = kind or "f32"
    want = {t.name: t.tensor_type.name.lower() for t in reader.tensors}
    assert got == want
    assert reader.fields["general.file_type"].contents() == 15  # MOSTLY_Q4_K_M
    assert [i for i in range(24) if want[f"blk.{i}.ffn_down.weight"] == "q6_k"] == [
        0,
        1,
        3,
        6,
        7,
        8,
        9,
        10,
        13,
        16,
        19,
        21,
    ]


def test_rows_that_do_not_fit_the_block_fall_back_as_llama_cpp_does() -> None:
    m = ModelTraits(n_layers=24, tied_output=True)
    # Qwen2.5-0.5B: hidden size 896 is not a multiple of 256
    assert tensor_type("blk.5.attn_q.weight", (896, 896), "q4_k_m", m) == "q5_0"
    assert tensor_type("blk.5.attn_q.weight", (896, 896), "q5_k_m", m) == "q5_1"
    assert tensor_type("blk.5.attn_q.weight", (896, 896), "q6_k", m) == "q8_0"
    assert tensor_type("blk.5.attn_q.weight", (896, 896), "q3_k_s", m) == "q4_0"
    assert tensor_type("blk.5.ffn_down.weight", (896, 4864), "q4_k_s", m) == "q4_k"
    assert tensor_type("token_embd.weight", (151936, 896), "q4_k_m", m) == "q8_0"
    assert tensor_type("blk.0.attn_q.weight", (8, 48), "q8_0", m) == "f16"
    assert tensor_type("blk.0.attn_q.weight", (8, 48), "q4_k_m", m) == "f16"
    assert check_file_type("Q4_K_M") == "q4_k_m" and "q5_k_m" in FILE_TYPES
    with pytest.raises(ValueError, match="'q4_k_x'.*q4_k_m"):
        check_file_type("q4_k_x")


# ---------------------------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------------------------
def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|eos|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def save_tiny(path: Path, model_type: str) -> Path:
    tok = _tokenizer()
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        eos_token_id=0,
        bos_token_id=1,
        tie_word_embeddings=(model_type == "qwen2"),
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05 if p.dim() == 2 else 0.02).add_(1.0 if p.dim() == 1 else 0.0)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|eos|>",
                "bos_token": "<|bos|>",
                "add_bos_token": False,
                "chat_template": "{% for m in messages %}{{ m.content }}\n{% endfor %}",
            }
        )
    )
    return path


def _checkpoint(source: Path):
    if source.suffix == ".gguf":
        from tallow_format_gguf.format import GGUFFormat

        return GGUFFormat().load(str(source))
    from tallow_format_safetensors.format import SafetensorsFormat

    return SafetensorsFormat().load(str(source))


def _tallow_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    from tallow import LLM, SamplingParams

    llm = LLM(model=str(path), dtype="float32", device="cpu", num_blocks=64)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return out[0].outputs[0].token_ids


PROMPT_TEXT = "The quick brown fox jumps over the lazy"


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("file_type", ["q8_0", "q4_k_m"])
def test_safetensors_model_to_gguf_that_gguf_transformers_and_tallow_read(
    tmp_path: Path, model_type: str, file_type: str
) -> None:
    from gguf import GGUFReader

    src = save_tiny(tmp_path / "hf", model_type)
    out = tmp_path / "gguf" / f"tiny-{file_type}.gguf"
    out.parent.mkdir()
    summary = quantize_checkpoint(_checkpoint(src), out, file_type, progress=False)
    assert summary["bytes"] == out.stat().st_size and summary["requantized"] == 0

    reader = GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    assert arch == model_type
    assert types["blk.0.attn_norm.weight"] == "F32"
    if file_type == "q8_0":
        assert types["blk.1.attn_q.weight"] == "Q8_0" and types["token_embd.weight"] == "Q8_0"
    else:  # 3 layers: use_more_bits holds for layer 2 only (the last eighth)
        assert types["blk.2.attn_v.weight"] == "Q6_K" and types["blk.1.attn_v.weight"] == "Q4_K"
        assert types["blk.2.ffn_down.weight"] == "Q6_K" and types["blk.1.ffn_up.weight"] == "Q4_K"
        head = "token_embd.weight" if model_type == "qwen2" else "output.weight"
        assert types[head] == "Q6_K"
    assert ("output.weight" in types) == (model_type == "llama")

    # transformers reads the file (dequantizing it, undoing llama's Q/K permutation): every
    # weight is the original within the quantization error of its type
    hf_gguf = transformers.AutoModelForCausalLM.from_pretrained(
        out.parent, gguf_file=out.name, dtype=torch.float32
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(out.parent, gguf_file=out.name)
    original = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    loaded, ref = hf_gguf.state_dict(), original.state_dict()
    assert set(loaded) == set(ref)
    for name, weight in ref.items():
        rel = float((loaded[name] - weight).norm() / weight.norm())
        assert rel < (0.008 if file_type == "q8_0" else 0.09), (name, rel)
    prompt = hf_tok.encode(PROMPT_TEXT, add_special_tokens=False)
    assert prompt == _tokenizer().encode(PROMPT_TEXT).ids

    # tallow serves the file: greedy tokens equal transformers' on the same GGUF
    hf_tokens = hf_gguf.generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert _tallow_greedy(out, prompt, 8) == hf_tokens


def test_gguf_source_is_dequantized_requantized_and_keeps_its_metadata(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gguf import GGUFReader

    src = save_tiny(tmp_path / "hf", "qwen2")
    first = tmp_path / "a.gguf"
    quantize_checkpoint(_checkpoint(src), first, "q8_0", progress=False)
    second = tmp_path / "b.gguf"
    with caplog.at_level(logging.WARNING, logger="tallow.quant.gguf"):
        summary = quantize_checkpoint(_checkpoint(first), second, "q4_0", progress=False)
    assert "dequantized and requantized" in caplog.text
    # every Q8_0 matrix is requantized: to Q4_0, the tied embedding (the head) to Q6_K
    assert summary["requantized"] == summary["tensors"]["q4_0"] + summary["tensors"]["q6_k"]
    assert summary["tensors"]["q6_k"] == 1 and summary["tensors"]["q4_0"] > 0
    a, b = GGUFReader(first), GGUFReader(second)
    assert {t.name: t.tensor_type.name for t in b.tensors}["blk.0.ffn_up.weight"] == "Q4_0"
    assert b.fields["general.file_type"].contents() == 2
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "qwen2.block_count",
        "tokenizer.chat_template",
        "tokenizer.ggml.eos_token_id",
    ):
        assert b.fields[key].contents() == a.fields[key].contents(), key
    # the requantized values are Q4_0 of the Q8_0 values
    from gguf.quants import dequantize, quantize

    ta = next(t for t in a.tensors if t.name == "blk.0.ffn_up.weight")
    tb = next(t for t in b.tensors if t.name == "blk.0.ffn_up.weight")
    values = dequantize(np.asarray(ta.data), ta.tensor_type)
    assert np.array_equal(np.asarray(tb.data), quantize(values, tb.tensor_type))


def test_tallow_quantize_reaches_this_writer_through_a_quant_scheme(tmp_path: Path) -> None:
    """The core command's path: weight format → the scheme offering the type → the file."""
    from gguf import GGUFReader

    from tallow.plugin import QuantScheme, hookimpl
    from tallow.plugin.testing import isolated_plugin_manager
    from tallow.quantize_cli import quantize_model

    from tallow_quant_gguf.quantize_file import FileQuantization

    class Scheme(FileQuantization, QuantScheme):
        name = "gguf"

    class Plugin:
        @hookimpl
        def tallow_register_quant_schemes(self, registry):
            registry.register("gguf", Scheme)

    src = save_tiny(tmp_path / "hf", "llama")
    out = tmp_path / "tiny-q5_k_m.gguf"
    pm = isolated_plugin_manager(
        "tallow_format_safetensors.plugin", ("tallow-quant-gguf", Plugin()), builtins=True
    )
    summary = quantize_model(
        pm.registries, str(src), str(out), "Q5_K_M", device="cpu", progress=False
    )
    assert summary["scheme"] == "gguf (tallow-quant-gguf)" and summary["file_type"] == "q5_k_m"
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    assert types["blk.0.attn_q.weight"] == "Q5_K" and types["output.weight"] == "Q6_K"
