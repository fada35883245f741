"""fp8 experts of a tiny Qwen3-MoE on the CPU: checkpoints whose per-expert tensors are e4m3
(the HF ``fp8`` format, 128 x 128 blocks as Qwen3-30B-A3B-FP8 ships it, and per tensor), load
time quantization (``model.isq fp8``) of a float model's experts, and the tensor-parallel
split of the experts. The oracle is transformers on the same model with the quantized weights
dequantized to float32: logits within float32 rounding, greedy tokens equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow.layers import BuildContext, FusedMoE, RouterSpec
from tallow.plugin.testing.model_parity import assert_greedy_parity, random_hf_model
from tallow.plugin.testing.paged_runner import PagedRunner
from tallow_quant_fp8.formats import Fp8Config
from tallow_quant_fp8.scheme import Fp8QuantScheme
from tallow_quant_fp8.weights import FP8, quantize_rows

transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
pytest.importorskip("tallow_model_qwen_moe", reason="the model is tallow-model-qwen-moe's")

H, I, E = 128, 256, 8
PROMPT = [3, 17, 250, 9, 64, 101, 7, 44, 45, 200, 12]  # at most 16 rows: weight-only linears
STEPS = 8


def tiny_config():
    return transformers.Qwen3MoeConfig(
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


def hf_model(seed: int = 3):
    return random_hf_model(tiny_config(), seed=seed).float().eval()


def quantize(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3, the checkpoint's scale tensor, the dequantized float32 weight) of ``w [N, K]``."""
    w = w.float()
    if kind == "block":
        n, k = w.shape
        blocks = w.reshape(n // 128, 128, k // 128, 128)
        scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
        q = (blocks / scale[:, None, :, None]).clamp(-448, 448).reshape(n, k).to(FP8)
        expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    else:
        scale = (w.abs().amax() / 448.0).clamp(min=1e-12).reshape(())
        q = (w / scale).clamp(-448, 448).to(FP8)
        expanded = scale
    return q, scale, q.float() * expanded


def write_checkpoint(hf, out: Path, kind: str):
    """Save ``hf`` with its experts as per-expert e4m3 tensors (HF ``fp8`` naming); returns the
    oracle: the same model with its experts dequantized."""
    from safetensors.torch import save_file

    from tallow.plugin.testing import save_tokenizer

    tensors, oracle_state = {}, {}
    scale_name = "weight_scale_inv" if kind == "block" else "weight_scale"
    for name, value in hf.state_dict().items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = value.contiguous()
            continue
        prefix = name.rsplit(".", 1)[0]
        deq = torch.empty_like(value, dtype=torch.float32)
        for e in range(value.shape[0]):
            parts = (
                {"gate_proj": value[e, :I], "up_proj": value[e, I:]}
                if name.endswith("gate_up_proj")
                else {"down_proj": value[e]}
            )
            rows = 0
            for part, w in parts.items():
                q, s, d = quantize(w, kind)
                tensors[f"{prefix}.{e}.{part}.weight"] = q.contiguous()
                tensors[f"{prefix}.{e}.{part}.{scale_name}"] = s.contiguous()
                deq[e, rows : rows + w.shape[0]] = d
                rows += w.shape[0]
        oracle_state[name] = deq
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = hf.config.to_dict()
    config["architectures"] = ["Qwen3MoeForCausalLM"]
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        **({"weight_block_size": [128, 128]} if kind == "block" else {}),
    }
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
            }
        )
    )


@pytest.mark.parametrize("kind", ["block", "tensor"])
def test_checkpoint_experts_stay_fp8_and_equal_the_dequantized_model(kind, tmp_path):
    oracle = write_checkpoint(hf_model(), tmp_path / kind, kind)
    eng = engine(str(tmp_path / kind))
    model = eng.parts.loaded.model
    experts = model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == FP8 and experts.w13_weight.shape == (E, 2 * I, H)
    assert experts.w2_weight.dtype == FP8 and experts.w2_weight.shape == (E, H, I)
    if kind == "block":
        assert experts.w13_weight_scale_inv.shape == (E, 2 * I // 128, H // 128)
    else:
        assert experts.w13_weight_scale.shape == (E, 2 * I)
    assert "2 expert layers" in eng.parts.loaded.quant.summary()
    assert_greedy_parity(model, oracle, PROMPT, STEPS, what=f"fp8 {kind} experts")


def _layer(scheme: Fp8QuantScheme, rank: int, tp: int) -> FusedMoE:
    return FusedMoE(
        E,
        H,
        I,
        router=RouterSpec(top_k=2, renormalize=True),
        build=BuildContext(quant=scheme, tp_rank=rank, tp_size=tp),
        prefix="mlp",
        reduce_results=False,
    )


def _load_experts(layer: FusedMoE, tensors: dict[tuple[int, str], tuple], scale_name: str):
    params = dict(layer.experts.named_parameters())
    for (e, part), (q, s) in tensors.items():
        stacked = "w2" if part == "down" else "w13"
        for suffix, t in (("weight", q), (scale_name, s)):
            p = params[f"{stacked}_{suffix}"]
            p.weight_loader(p, t, (str(e), part))
    layer.experts.quant_method.process_weights_after_loading(layer.experts)


@pytest.mark.parametrize("kind", ["block", "tensor"])
def test_tensor_parallel_ranks_sum_to_the_whole_layer(kind):
    """Each of two ranks holds its rows of gate and up and its columns of down (block scales
    sliced on block boundaries); their partial outputs add up to the unsplit layer's."""
    g = torch.Generator().manual_seed(11)
    tensors = {}
    for e in range(E):
        for part, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
            q, s, _ = quantize(torch.randn(*shape, generator=g) * 0.05, kind)
            tensors[(e, part)] = (q, s)
    fmt = Fp8Config("block", "group") if kind == "block" else Fp8Config("tensor", "token")
    scale_name = fmt.scale_name
    x = torch.randn(9, H, generator=g)
    weights, ids = torch.randn(9, E, generator=g).softmax(-1).topk(2, dim=-1)
    outs = []
    for rank, tp in ((0, 1), (0, 2), (1, 2)):
        scheme = Fp8QuantScheme()
        scheme.checkpoint = fmt
        layer = _layer(scheme, rank, tp)
        _load_experts(layer, tensors, scale_name)
        outs.append(layer.experts(x, weights, ids))
    torch.testing.assert_close(outs[1] + outs[2], outs[0], rtol=1e-5, atol=1e-6)
    assert outs[1].abs().max() > 0 and not torch.allclose(outs[1], outs[0])


def test_block_scales_need_whole_blocks_per_rank():
    scheme = Fp8QuantScheme()
    scheme.checkpoint = Fp8Config("block", "group")
    with pytest.raises(ValueError, match="multiple of 128"):
        FusedMoE(
            E, H, 192, router=RouterSpec(top_k=2), build=BuildContext(quant=scheme), prefix="mlp"
        )


def test_isq_quantizes_the_experts_per_row(tmp_path):
    """``model.isq fp8`` of a float checkpoint: every linear layer and the experts become e4m3
    with one scale per row; the model equals transformers with those weights dequantized."""
    hf = hf_model(5)
    hf.save_pretrained(str(tmp_path / "float"), safe_serialization=True)
    from tallow.plugin.testing import save_tokenizer

    save_tokenizer(tmp_path / "float")
    eng = engine(str(tmp_path / "float"), isq="fp8")
    experts = eng.parts.loaded.model.model.layers[1].mlp.experts
    assert experts.w13_weight.dtype == FP8 and experts.w2_weight_scale.shape == (E, H)
    oracle = hf_model(5)
    state = {}
    for name, w in hf.state_dict().items():
        if w.dim() >= 2 and "embed_tokens" not in name and "lm_head" not in name:
            flat = w.reshape(-1, w.shape[-1])
            state[name] = quantize_rows(flat).dequantize().reshape(w.shape)
    oracle.load_state_dict(state, strict=False)
    assert_greedy_parity(eng.parts.loaded.model, oracle, PROMPT, STEPS, what="isq fp8 experts")


def test_isq_random_model_draws_quantized_experts():
    eng = engine("random:tiny-qwen3-moe", isq="fp8")
    experts = eng.parts.loaded.model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == FP8
    assert torch.isfinite(experts.w13_weight_scale).all() and experts.w13_weight_scale.min() > 0
    tokens, _, _ = PagedRunner(eng.parts.loaded.model).greedy(0, [1, 2, 3, 4], 4)
    assert len(tokens) == 4
