"""gpt-oss with MXFP4 experts, as the released checkpoints store them (``*_blocks`` /
``*_scales``, ``quantization_config.quant_method: mxfp4``), kept packed by tallow-quant-fp4:
parity with transformers running the float model on the same blocks decoded by its own
``_convert_moe_packed_tensors``, through the model and through the whole engine; and
``random:tiny-gpt-oss`` in the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_quant_fp4", reason="tallow-quant-fp4 keeps the experts packed")

from transformers.integrations.mxfp4 import _convert_moe_packed_tensors  # noqa: E402

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_engine_greedy,
    assert_greedy_parity,
    random_hf_model,
)
from tallow_quant_fp4.isq import mxfp4_codes  # noqa: E402
from tallow_quant_fp4.moe import MXFP4MoEMethod  # noqa: E402
from tallow_quant_fp4.moe_ops import pack_blocks  # noqa: E402
from tallow_quant_fp4.scheme import FP4QuantScheme  # noqa: E402

from tallow_model_gpt_oss.model import GptOssForCausalLM  # noqa: E402

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
    "rope_theta": 150000.0,
}
CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=160,
    num_local_experts=8,
    num_experts_per_tok=4,
    sliding_window=6,
    max_position_embeddings=256,
    rope_parameters=YARN,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
PROMPT = [(37 * i + 11) % 160 for i in range(30)]


def mxfp4_checkpoint(hf) -> dict[str, torch.Tensor]:
    """``hf``'s tensors with its experts quantized to MXFP4 in gpt-oss's checkpoint layout
    (``[E, out, in / 32, 16]``, gate/up interleaved as transformers keeps them); ``hf``'s
    experts are replaced by transformers' own decoding of those blocks, so that it is the
    oracle of the quantized model."""
    out = {}
    for name, tensor in hf.state_dict().items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name] = tensor
            continue
        codes, scales = mxfp4_codes(tensor.transpose(1, 2))  # [E, out, in]
        blocks = pack_blocks(codes)
        out[f"{name}_blocks"], out[f"{name}_scales"] = blocks, scales
        decoded = _convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert decoded.shape == tensor.shape
        with torch.no_grad():
            hf.get_parameter(name).copy_(decoded)
    return out


def test_mxfp4_experts_match_transformers():
    hf = random_hf_model(transformers.GptOssConfig(**CONFIG), seed=11)
    tensors = mxfp4_checkpoint(hf)
    config = {**hf.config.to_dict(), "quantization_config": MXFP4}
    scheme = FP4QuantScheme()
    scheme.use_checkpoint_config(config)
    model = GptOssForCausalLM(ArchConfig(config), BuildContext(quant=scheme))
    model.load_weights(iter(tensors.items()), naming="hf")
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.quant_method, MXFP4MoEMethod)
    assert experts.w13_blocks.dtype == torch.uint8 and not hasattr(experts, "w13_weight")
    assert "mxfp4 experts x2" in scheme.summary()
    assert_greedy_parity(model.eval(), hf, PROMPT, 32, what="gpt-oss mxfp4")


def test_engine_serves_a_saved_mxfp4_checkpoint(tmp_path: Path):
    """A directory as gpt-oss is published (config.json with the mxfp4 quantization_config,
    blocks and scales in model.safetensors) through the whole engine: the fp4 scheme claims it
    and the greedy tokens are transformers'."""
    from safetensors.torch import save_file

    hf = random_hf_model(transformers.GptOssConfig(**CONFIG), seed=12)
    tensors = mxfp4_checkpoint(hf)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    for f in tmp_path.glob("*.safetensors*"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = MXFP4
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert_engine_greedy(
        tmp_path,
        hf,
        [PROMPT, PROMPT[:9]],
        16,
        plugins=["tallow-model-gpt-oss", "tallow-quant-fp4", "tallow-format-safetensors"],
    )


def test_engine_runs_the_random_shape():
    """``random:tiny-gpt-oss`` builds with MXFP4 experts (as ``random:gpt-oss-20b`` does),
    fills and generates through the whole engine."""
    from tallow import LLM, SamplingParams

    llm = LLM(
        model="random:tiny-gpt-oss", device="cpu", dtype="float32", num_blocks=16, max_model_len=256
    )
    model = llm.engine.core.runner.model
    assert type(model).__name__ == "GptOssForCausalLM"
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.quant_method, MXFP4MoEMethod)
    assert int(experts.w13_blocks.count_nonzero()) > 0  # random codes, not zeros
    outs = llm.generate(
        [[1, 2, 3, 4, 5], list(range(40, 80))],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
    assert len(set(outs[1].outputs[0].token_ids)) > 1
