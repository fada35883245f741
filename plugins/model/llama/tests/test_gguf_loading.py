"""GGUF tensor names, llama.cpp's Q/K permutation and config_from_gguf, end to end.

Tiny random transformers models are written as real GGUF files with the ``gguf`` package's
writer the way llama.cpp's converter lays them out (its names, its Q/K row permutation for
``llama``, ``rope_freqs`` for Llama 3.1 scaling, no ``output.weight`` when tied). tallow reads
them back (``gguf.GGUFReader``) with ``naming="gguf"`` and a config built by
``config_from_gguf`` alone; the logits must match the original transformers model, and, where
transformers can load the file itself, transformers' own GGUF loader.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
gguf = pytest.importorskip("gguf", reason="the gguf package writes the test files")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402

from tallow_model_llama.model import (  # noqa: E402
    LlamaForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from tallow_model_llama.naming import gguf_name_map  # noqa: E402

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42, 99, 150]

# llama.cpp's names for the per-layer tensors of the Llama family
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q and K rows of ``llama`` models."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(cfg: Any) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp's converter writes for Llama 3.1 scaling."""
    s = cfg.rope_parameters
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    base = s["rope_theta"]
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(
    path: Path, hf: Any, arch: str, *, permute: bool, rope_freqs: np.ndarray | None = None
) -> None:
    cfg = hf.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    if head_dim != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_token_scores([0.0] * cfg.vocab_size)
    w.add_token_types([1] * cfg.vocab_size)
    tied = cfg.tie_word_embeddings
    for name, t in hf.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        a = t.float().numpy()
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if m:
            layer, module, kind = m.groups()
            gname = f"blk.{layer}.{LAYER_NAMES[module]}.{kind}"
            if permute and module == "self_attn.q_proj":
                a = llama_cpp_permute(a, cfg.num_attention_heads)
            if permute and module == "self_attn.k_proj":
                a = llama_cpp_permute(a, cfg.num_key_value_heads)
        else:
            module, _, kind = name.rpartition(".")
            gname = f"{TOP_NAMES[module]}.{kind}"
        w.add_tensor(gname, np.ascontiguousarray(a))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_gguf(path: Path) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    reader = gguf.GGUFReader(str(path))
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [
        (t.name, torch.from_numpy(np.array(t.data, dtype=np.float32))) for t in reader.tensors
    ]
    return metadata, tensors


def tallow_from_gguf(cls: type, path: Path, config: dict[str, Any] | None = None) -> Any:
    metadata, tensors = read_gguf(path)
    cfg = cls.config_from_gguf(metadata, dict(config or {}))
    model = cls(ArchConfig(cfg), BuildContext())
    model.load_weights(tensors, naming="gguf")
    return model.eval()


def random_hf(config: Any, kit: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    kit.randomize_(model, seed)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def prompt_logits(model: Any, kit: Any) -> torch.Tensor:
    return kit.PagedRunner(model).greedy(0, PROMPT, 0)[2]


def hf_logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]


def test_llama_gguf_unpermutes_q_and_k(tmp_path, kit):
    hf = random_hf(transformers.LlamaConfig(**SMALL), kit)
    path = tmp_path / "llama.gguf"
    write_gguf(path, hf, "llama", permute=True)
    model = tallow_from_gguf(LlamaForCausalLM, path)
    ours = prompt_logits(model, kit)
    kit.assert_close_logits(ours, hf_logits(hf), "llama GGUF vs original")
    # transformers' own GGUF loader reads the same file to the same numbers
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    kit.assert_close_logits(ours, hf_logits(theirs.eval()), "llama GGUF vs transformers GGUF")


def test_llama_gguf_biases_are_unpermuted_too(tmp_path, kit):
    hf = random_hf(transformers.LlamaConfig(**SMALL, attention_bias=True), kit, seed=4)
    path = tmp_path / "llama.gguf"
    write_gguf(path, hf, "llama", permute=True)
    # Metadata does not say that a llama file has biases; the generic GGUF config (which sees
    # the tensor names) does.
    model = tallow_from_gguf(LlamaForCausalLM, path, {"attention_bias": True})
    kit.assert_close_logits(prompt_logits(model, kit), hf_logits(hf), "biased llama GGUF")


def test_llama_gguf_permutation_matters(tmp_path, kit):
    """Loading permuted rows as if they were not must change the output: the test above would
    otherwise not show that un-permuting happens."""
    hf = random_hf(transformers.LlamaConfig(**SMALL), kit)
    path = tmp_path / "llama.gguf"
    write_gguf(path, hf, "llama", permute=True)
    metadata, tensors = read_gguf(path)
    cfg = LlamaForCausalLM.config_from_gguf(metadata, {})
    plain = LlamaForCausalLM(ArchConfig(cfg), BuildContext())
    plain.weight_name_maps = {"gguf": gguf_name_map(interleaved_qk=False)}
    plain.load_weights(tensors, naming="gguf")
    wrong = prompt_logits(plain.eval(), kit)
    ref = hf_logits(hf)
    assert float((wrong - ref).abs().max()) > 1e-2


def test_qwen2_gguf_tied_and_biased(tmp_path, kit):
    config = transformers.Qwen2Config(
        **{**SMALL, "tie_word_embeddings": True}, rope_theta=1000000.0
    )
    hf = random_hf(config, kit, seed=3)
    path = tmp_path / "qwen2.gguf"
    write_gguf(path, hf, "qwen2", permute=False)
    model = tallow_from_gguf(Qwen2ForCausalLM, path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ours = prompt_logits(model, kit)
    kit.assert_close_logits(ours, hf_logits(hf), "qwen2 GGUF vs original")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    kit.assert_close_logits(ours, hf_logits(theirs.eval()), "qwen2 GGUF vs transformers GGUF")


def test_qwen3_gguf_head_dim_from_key_length(tmp_path, kit):
    hf = random_hf(transformers.Qwen3Config(**SMALL, head_dim=32), kit, seed=5)
    path = tmp_path / "qwen3.gguf"
    write_gguf(path, hf, "qwen3", permute=False)
    model = tallow_from_gguf(Qwen3ForCausalLM, path)
    assert model.config.head_dim == 32
    kit.assert_close_logits(prompt_logits(model, kit), hf_logits(hf), "qwen3 GGUF vs original")


def test_llama31_rope_freqs_tensor(tmp_path, kit):
    """Llama 3.1 GGUF files carry their RoPE scaling as a ``rope_freqs`` tensor, not metadata."""
    config = transformers.LlamaConfig(
        **SMALL,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    hf = random_hf(config, kit, seed=11)
    factors = llama3_rope_factors(hf.config)
    assert len(set(factors.tolist())) > 2  # the test covers kept, scaled and blended frequencies
    path = tmp_path / "llama31.gguf"
    write_gguf(path, hf, "llama", permute=True, rope_freqs=factors)
    model = tallow_from_gguf(LlamaForCausalLM, path)
    assert model.config.get("rope_scaling") is None  # metadata says nothing of the scaling
    kit.assert_close_logits(prompt_logits(model, kit), hf_logits(hf), "llama 3.1 GGUF")


def test_through_the_gguf_format_plugin(tmp_path, kit):
    """The engine's path: tallow-format-gguf's checkpoint and generic config, then config_from_gguf."""
    fmt_module = pytest.importorskip(
        "tallow_format_gguf.format",
        reason="tallow-format-gguf (the GGUF weight format) not installed",
    )
    hf = random_hf(transformers.LlamaConfig(**SMALL), kit, seed=2)
    path = tmp_path / "llama.gguf"
    write_gguf(path, hf, "llama", permute=True)
    ckpt = fmt_module.GGUFFormat().load(str(path))
    assert ckpt.naming == "gguf"
    cfg = LlamaForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    model = LlamaForCausalLM(ArchConfig(cfg), BuildContext())
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    kit.assert_close_logits(
        prompt_logits(model.eval(), kit), hf_logits(hf), "via tallow-format-gguf"
    )


def test_config_from_gguf_yarn_and_partial_rotary():
    metadata = {
        "general.architecture": "qwen2",
        "qwen2.block_count": 2,
        "qwen2.embedding_length": 64,
        "qwen2.feed_forward_length": 128,
        "qwen2.attention.head_count": 4,
        "qwen2.attention.head_count_kv": 2,
        "qwen2.context_length": 131072,
        "qwen2.rope.freq_base": 1e6,
        "qwen2.rope.dimension_count": 8,
        "qwen2.rope.scaling.type": "yarn",
        "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 32768,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(300)],
    }
    cfg = Qwen2ForCausalLM.config_from_gguf(metadata, {})
    assert cfg["vocab_size"] == 300 and cfg["head_dim"] == 16
    assert cfg["partial_rotary_factor"] == 0.5
    assert cfg["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    # a model builds from it, rotating half of each head
    model = Qwen2ForCausalLM(ArchConfig(cfg), BuildContext())
    assert model.model.rotary_emb.rotary_dim == 8


def test_config_from_gguf_names_what_is_missing():
    with pytest.raises(ValueError, match="hidden_size"):
        LlamaForCausalLM.config_from_gguf(
            {"general.architecture": "llama", "llama.block_count": 2}, {}
        )
    with pytest.raises(ValueError, match="rope.scaling.type 'longrope'"):
        LlamaForCausalLM.config_from_gguf(
            {
                "general.architecture": "llama",
                "llama.block_count": 2,
                "llama.embedding_length": 64,
                "llama.attention.head_count": 4,
                "llama.vocab_size": 9,
                "llama.rope.scaling.type": "longrope",
            },
            {},
        )
