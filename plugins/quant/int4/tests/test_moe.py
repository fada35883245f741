"""Integer experts of a tiny Qwen3-MoE on the CPU: GPTQ, AWQ and compressed-tensors
(pack-quantized) checkpoints whose per-expert tensors are packed integers, load-time rounding
(``model.isq int4``) of a float model's experts, and the tensor-parallel split of the experts.
The oracle is transformers on the same model with the experts decoded to float32: logits
within float32 rounding, greedy tokens equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from int_weights import dense_of
from tiny_checkpoints import FORMATS, _as_stored, _layer_tensors, quantize
from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow.layers import BuildContext, FusedMoE, RouterSpec
from tallow.plugin.testing import save_tokenizer
from tallow.plugin.testing.model_parity import assert_greedy_parity, random_hf_model
from tallow.plugin.testing.paged_runner import PagedRunner
from tallow_quant_int4.checkpoint_config import checkpoint_layout
from tallow_quant_int4.layout import dequantize
from tallow_quant_int4.scheme import IntQuantScheme

transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
pytest.importorskip("tallow_model_qwen_moe", reason="the model is tallow-model-qwen-moe's")

H, I, E = 128, 128, 8
PROMPT = [3, 17, 250, 9, 64, 101, 7, 44, 45, 200, 12, 13, 90, 91, 92, 5, 6, 7, 300, 2]
STEPS = 8


def hf_model(seed: int = 3):
    config = transformers.Qwen3MoeConfig(
        hidden_size=H,
        intermediate_size=256,
        moe_intermediate_size=I,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=E,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        vocab_size=320,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return random_hf_model(config, seed=seed).float().eval()


def write_checkpoint(hf, out: Path, fmt: str):
    """Save ``hf`` with its experts as per-expert packed integers of ``fmt`` (the other layers
    in floats); returns the oracle: the same model with its experts decoded."""
    from safetensors.torch import save_file

    qcfg, bits, group, zeros, _ = FORMATS[fmt]
    tensors, oracle_state = {}, {}
    for name, value in hf.state_dict().items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = value.contiguous()
            continue
        prefix = name.rsplit(".", 1)[0]
        decoded = torch.empty_like(value, dtype=torch.float32)
        for e in range(value.shape[0]):
            parts = (
                {"gate_proj": value[e, :I], "up_proj": value[e, I:]}
                if name.endswith("gate_up_proj")
                else {"down_proj": value[e]}
            )
            row = 0
            for part, w in parts.items():
                u = quantize(
                    w.float(), bits=bits, group=group, zeros=zeros, act_order=False, seed=e
                )
                for suffix, t in _layer_tensors(fmt, qcfg, u).items():
                    tensors[f"{prefix}.{e}.{part}.{suffix}"] = t.contiguous()
                decoded[e, row : row + w.shape[0]] = dense_of(_as_stored(qcfg, u))
                row += w.shape[0]
        oracle_state[name] = decoded
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf.config.to_dict()
    config.update(architectures=["Qwen3MoeForCausalLM"], quantization_config=qcfg)
    (out / "config.json").write_text(json.dumps(config))
    save_tokenizer(out)
    oracle = hf_model()
    oracle.load_state_dict(oracle_state, strict=False)
    return oracle


def engine(source: str, **model) -> LLMEngine:
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
                "plugins": {"settings": {"tallow-quant-int4": {"method": "rtn"}}},
            }
        )
    )


@pytest.mark.parametrize("fmt", ["gptq", "awq", "compressed-tensors"])
def test_checkpoint_experts_stay_packed_and_equal_the_decoded_model(fmt, tmp_path):
    oracle = write_checkpoint(hf_model(), tmp_path / fmt, fmt)
    eng = engine(str(tmp_path / fmt))
    model = eng.parts.loaded.model
    experts = model.model.layers[0].mlp.experts
    assert experts.w13_int_codes.dtype == torch.int32
    assert experts.w13_int_codes.shape == (E, 2 * I, H // 8)
    assert "experts int4" in eng.parts.loaded.quant.summary()
    assert_greedy_parity(model, oracle, PROMPT, STEPS, what=f"{fmt} experts")


def test_tensor_parallel_ranks_sum_to_the_whole_layer():
    """Each of two ranks holds its rows of gate and up and its columns (whole groups) of
    down; their partial outputs add up to the unsplit layer's."""
    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False}
    g = torch.Generator().manual_seed(4)
    tensors = {}
    for e in range(E):
        for part, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
            u = quantize(
                torch.randn(*shape, generator=g) * 0.05,
                bits=4,
                group=32,
                zeros=True,
                act_order=False,
                seed=e,
            )
            tensors[(e, part)] = _layer_tensors("gptq", qcfg, u)
    x = torch.randn(9, H, generator=g)
    weights, ids = torch.randn(9, E, generator=g).softmax(-1).topk(2, dim=-1)
    outs = []
    for rank, tp in ((0, 1), (0, 2), (1, 2)):
        scheme = IntQuantScheme()
        scheme.use_checkpoint_config({"quantization_config": qcfg})
        layer = FusedMoE(
            E,
            H,
            I,
            router=RouterSpec(top_k=2, renormalize=True),
            build=BuildContext(quant=scheme, tp_rank=rank, tp_size=tp),
            prefix="mlp",
            reduce_results=False,
        )
        params = dict(layer.experts.named_parameters())
        for (e, part), pieces in tensors.items():
            for name, t in pieces.items():
                p = params[f"{'w2' if part == 'down' else 'w13'}_{name}"]
                p.weight_loader(p, t, (str(e), part))
        layer.experts.quant_method.process_weights_after_loading(layer.experts)
        outs.append(layer.experts(x, weights, ids))
    torch.testing.assert_close(outs[1] + outs[2], outs[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(outs[1], outs[0])


def test_act_order_experts_are_refused():
    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True}
    scheme = IntQuantScheme()
    scheme.use_checkpoint_config({"quantization_config": qcfg})
    assert checkpoint_layout({"quantization_config": qcfg}).desc_act
    layer = FusedMoE(
        2, 64, 64, router=RouterSpec(top_k=1), build=BuildContext(quant=scheme), prefix="mlp"
    )
    params = dict(layer.experts.named_parameters())
    for e in range(2):
        for part, shape in (("gate", (64, 64)), ("up", (64, 64)), ("down", (64, 64))):
            u = quantize(torch.randn(*shape), bits=4, group=32, zeros=False, act_order=True, seed=e)
            for name, t in _layer_tensors("gptq", qcfg, u).items():
                p = params[f"{'w2' if part == 'down' else 'w13'}_{name}"]
                p.weight_loader(p, t, (str(e), part))
    with pytest.raises(ValueError, match="act-order"):
        layer.experts.quant_method.process_weights_after_loading(layer.experts)


def test_isq_rounds_the_experts(tmp_path):
    """``model.isq int4`` (rtn) of a float checkpoint: every linear layer and the experts
    become codes; the model equals transformers with those weights decoded."""
    hf = hf_model(5)
    hf.save_pretrained(str(tmp_path / "float"), safe_serialization=True)
    save_tokenizer(tmp_path / "float")
    eng = engine(str(tmp_path / "float"), isq="int4")
    model = eng.parts.loaded.model
    experts = model.model.layers[1].mlp.experts
    assert experts.w13_int_codes.shape == (E, 2 * I, H // 8)
    oracle = hf_model(5)
    state = oracle.state_dict()
    for i, layer in enumerate(model.model.layers):
        w13, w2 = layer.mlp.experts.quant_method.experts.dequantize()
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = w13
        state[f"model.layers.{i}.mlp.experts.down_proj"] = w2
        attn = layer.self_attn
        for hf_name, module in (("o_proj", attn.o_proj),):
            [part] = module.quant_method.parts
            state[f"model.layers.{i}.self_attn.{hf_name}.weight"] = dequantize(part)
        qkv = torch.cat(
            [
                dequantize(p) if not isinstance(p, torch.Tensor) else p
                for p in attn.qkv_proj.quant_method.parts
            ]
        )
        q, k, v = qkv.split([128, 64, 64])
        for hf_name, w in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            state[f"model.layers.{i}.self_attn.{hf_name}.weight"] = w
        [gate] = layer.mlp.gate.quant_method.parts
        state[f"model.layers.{i}.mlp.gate.weight"] = (
            dequantize(gate) if not isinstance(gate, torch.Tensor) else gate
        )
    [head] = model.lm_head.quant_method.parts
    state["lm_head.weight"] = dequantize(head)
    oracle.load_state_dict(state)
    assert_greedy_parity(model, oracle, PROMPT, STEPS, what="isq int4 experts")


def test_isq_random_model_draws_rounded_experts():
    eng = engine("random:tiny-qwen3-moe", isq="int4")
    experts = eng.parts.loaded.model.model.layers[0].mlp.experts
    assert experts.w13_int_codes.dtype == torch.int32
    tokens, _, _ = PagedRunner(eng.parts.loaded.model).greedy(0, [1, 2, 3, 4], 4)
    assert len(tokens) == 4
