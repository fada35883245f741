"""Mixture-of-experts models whose experts are GGML blocks, on the CPU: a tiny Qwen3-MoE GGUF
with Q4_K gate/up and Q6_K down experts (quantized by this plugin, decoded by the ``gguf``
package as the oracle) keeps them quantized and equals transformers run on the decoded
weights; ``model.isq`` quantizes a float MoE's experts as they load (and a ``random:`` one's
as they are drawn), equal to the float model of the decoded blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quant_engine_runs import engine, greedy

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_model_qwen_moe", reason="tallow-model-qwen-moe builds the model")
pytest.importorskip("tallow_format_gguf", reason="tallow-format-gguf reads the file")

from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors, write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    random_hf_model,
)

BASE = dict(
    hidden_size=256,
    intermediate_size=256,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=160,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
PROMPTS = [[3, 17, 150, 9, 64], [128, 5, 77, 31, 100, 1, 42]]
#: the type of each stacked expert tensor in the file
EXPERT_TYPES = {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q6_K"}


def decoded(w: torch.Tensor, qtype: str) -> tuple[np.ndarray, torch.Tensor]:
    """(this plugin's ``qtype`` blocks of ``w``'s rows, their values decoded by ``gguf``)."""
    import gguf

    from tallow_quant_gguf.quantize import quantize

    rows = w.detach().float().reshape(-1, w.shape[-1])
    blocks = quantize(rows, qtype.lower()).numpy()
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
    return blocks, torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(w.shape)


def write_quantized_qwen3_moe(path, hf) -> None:
    """The file llama.cpp would write with these expert types (everything else float32), and
    ``hf``'s experts replaced by the decoded values of those blocks."""
    from tallow_quant_gguf.qtypes import QUANT_TYPES

    cfg = hf.config
    writer_tensors = []
    for name, array in gguf_tensors(hf.state_dict(), "qwen3moe", cfg.num_hidden_layers):
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if kind in EXPERT_TYPES:
            qtype = EXPERT_TYPES[kind]
            blocks, _ = decoded(torch.from_numpy(array), qtype)
            raw = blocks.reshape(
                *array.shape[:-1],
                array.shape[-1] // QUANT_TYPES[qtype].block * QUANT_TYPES[qtype].block_bytes,
            )
            writer_tensors.append((name, raw, qtype))
        else:
            writer_tensors.append((name, array))
    state = {}
    for name, w in hf.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            state[name] = decoded(w, "Q4_K")[1]
        elif name.endswith("experts.down_proj"):
            state[name] = decoded(w, "Q6_K")[1]
    hf.load_state_dict(state, strict=False)

    metadata = gguf_metadata(
        cfg,
        expert_count=cfg.num_experts,
        expert_used_count=cfg.num_experts_per_tok,
        expert_feed_forward_length=cfg.moe_intermediate_size,
    )
    write_gguf(path, "qwen3moe", metadata, writer_tensors, cfg.vocab_size)


@pytest.fixture(scope="module")
def quantized_file(tmp_path_factory):
    hf = random_hf_model(transformers.Qwen3MoeConfig(**BASE), seed=31)
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-q4k.gguf"
    write_quantized_qwen3_moe(path, hf)
    return path, hf


def test_q4_k_experts_stay_quantized_and_match_the_decoded_float_model(quantized_file):
    from tallow.layers import ArchConfig, BuildContext
    from tallow_format_gguf.format import GGUFFormat
    from tallow_model_qwen_moe.model import Qwen3MoeForCausalLM
    from tallow_quant_gguf.experts import GGUFMoEMethod
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    path, hf = quantized_file
    ckpt = GGUFFormat().load(str(path))
    assert ckpt.quantization == "gguf"
    assert ckpt.extra["gguf_tensor_types"]["blk.0.ffn_down_exps.weight"] == "Q6_K"
    config = Qwen3MoeForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    scheme = GGUFQuantScheme(None)
    model = Qwen3MoeForCausalLM(ArchConfig(config), BuildContext(dtype=torch.float32, quant=scheme))
    model.load_weights(ckpt.tensors(), naming="gguf")
    method = model.model.layers[0].mlp.experts.quant_method
    assert isinstance(method, GGUFMoEMethod)
    assert {k: p.type_name for k, p in method.stacked.items()} == {"w13": "Q4_K", "w2": "Q6_K"}
    assert "Q4_K x2" in scheme.summary() and "Q6_K x2" in scheme.summary()
    assert_greedy_parity(model.eval(), hf, PROMPT, 32, what="qwen3moe Q4_K experts")


def test_the_engine_serves_the_quantized_file(quantized_file):
    path, hf = quantized_file
    eng = engine(str(path), keep_quantized_on_cpu=True)
    assert "Q4_K" in eng.parts.loaded.quant.summary()
    # the greedy tokens are transformers' on the decoded weights
    for prompt, tokens in zip(PROMPTS, greedy(eng, PROMPTS, 8)):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
        assert tokens == out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def float_dirs(tmp_path_factory):
    """A tiny Qwen3-MoE saved as safetensors, and the same model whose matrices (experts
    included) are ``gguf``'s decoding of this plugin's q4_k blocks of them."""
    from tallow.engine.random_model import synthetic_tokenizer

    root = tmp_path_factory.mktemp("moe-isq")
    hf = random_hf_model(transformers.Qwen3MoeConfig(**BASE), seed=32)
    hf.save_pretrained(root / "float")
    synthetic_tokenizer(BASE["vocab_size"]).save(str(root / "float" / "tokenizer.json"))
    state = {name: decoded(w, "Q4_K")[1] for name, w in hf.state_dict().items() if w.dim() >= 2}
    hf.load_state_dict(state, strict=False)
    hf.save_pretrained(root / "decoded")
    synthetic_tokenizer(BASE["vocab_size"]).save(str(root / "decoded" / "tokenizer.json"))
    return root / "float", root / "decoded"


def test_isq_quantizes_the_experts(float_dirs):
    float_dir, decoded_dir = float_dirs
    isq = engine(str(float_dir), isq="q4_k")
    experts = isq.parts.loaded.model.model.layers[0].mlp.experts
    assert {k: p.type_name for k, p in experts.quant_method.stacked.items()} == {
        "w13": "Q4_K",
        "w2": "Q4_K",
    }
    reference = engine(str(decoded_dir))
    assert isq.parts.loaded.weight_bytes < 0.25 * reference.parts.loaded.weight_bytes
    assert greedy(isq, PROMPTS, 8) == greedy(reference, PROMPTS, 8)


def test_a_random_moe_draws_and_quantizes_one_expert_at_a_time(monkeypatch):
    from tallow_quant_gguf import isq as isq_module

    seen = []
    real = isq_module.quantize

    def recording(weight, qtype):
        seen.append((tuple(weight.shape), qtype))
        return real(weight, qtype)

    monkeypatch.setattr(isq_module, "quantize", recording)
    eng = engine("random:tiny-qwen3-moe", isq="q4_k")
    experts = eng.parts.loaded.model.model.layers[0].mlp.experts
    # 64- and 32-wide rows take llama.cpp's fallback of Q4_K
    assert {p.type_name for p in experts.quant_method.stacked.values()} == {"Q5_0"}
    # per layer, 8 experts' gate and up (32 rows each) and down (64 rows), one expert at a
    # time; the k and v projections are 32 x 64 too
    assert seen.count(((32, 64), "q5_0")) == 2 * (2 * 8 + 2)
    assert seen.count(((64, 32), "q5_0")) == 2 * 8
    assert len(greedy(eng, PROMPTS, 8)[0]) == 8
