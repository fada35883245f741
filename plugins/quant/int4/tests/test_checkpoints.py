"""Real checkpoints of every format, on CPU: a tiny random Llama quantized into GPTQ (4-bit,
act-order with zero points, 8-bit ``gptq_v2``), AWQ, compressed-tensors (4-bit groups, 8-bit
asymmetric channels), Marlin and GPTQ-in-Marlin-format (the 8-bit one with its LM head quantized too), written as ``config.json`` with its
``quantization_config`` plus ``model.safetensors``, loads through tallow's safetensors format
into the ``int4`` scheme; its logits equal (float32 tolerance) those of the transformers model
whose weights are the decoded codes, and its greedy tokens are that model's."""

from __future__ import annotations

import json

import pytest
import torch

from engines import engine, greedy, settings
from tallow.engine.loader import load_model
from tallow.plugin.testing import PagedRunner
from tiny_checkpoints import FORMATS, write_checkpoint

pytest.importorskip("transformers", reason="transformers is the float oracle")
pytest.importorskip("compressed_tensors", reason="compressed-tensors packs its checkpoints")
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77]
#: the layout each format's q/k/v layer ends up in
EXPECTED = {
    "gptq": "int4 g128",
    "gptq-act-order-asym": "int4 asym g64 act-order",
    "gptq-8bit-v2": "int8 per-channel",
    "awq": "int4 asym g128",
    "compressed-tensors": "int4 g128",
    "compressed-tensors-8bit-asym": "int8 asym per-channel",
    "marlin": "int4 g128",
    "gptq-marlin-format": "int4 g128",
}


@torch.no_grad()
def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([prompt])
    logits = model(ids).logits[0]
    first = logits
    out = []
    for _ in range(steps):
        tok = int(logits[-1].argmax())
        out.append(tok)
        ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
        logits = model(ids).logits[0]
    return out, first


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_checkpoint_computes_its_decoded_float_model(tmp_path, fmt):
    path, hf = write_checkpoint(tmp_path, fmt)
    eng = engine(str(path))
    loaded = eng.parts.loaded
    assert type(loaded.quant).__name__ == "IntQuantScheme"
    layer = loaded.model.model.layers[0]
    assert layer.self_attn.qkv_proj.quant_method.type_names() == [EXPECTED[fmt]]
    assert layer.mlp.gate_up_proj.quant_method.type_names() == [EXPECTED[fmt]]
    # GPTQModel's lm_head: true quantizes the head too
    head = [EXPECTED[fmt]] if FORMATS[fmt][0].get("lm_head") else ["dense"]
    assert loaded.model.lm_head.quant_method.type_names() == head
    expected_tokens, expected_logits = hf_greedy(hf, PROMPT, 8)
    fresh = load_model(
        eng.plugin_manager.registries,
        str(path),
        device=torch.device("cpu"),
        dtype="float32",
        config=settings(str(path)),
    )
    runner = PagedRunner(fresh.model)
    runner.add(0)
    logits = runner.step([(0, PROMPT)])[0]
    scale = float(expected_logits.abs().max())
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4 * scale)
    assert greedy(eng, [PROMPT], 8) == [expected_tokens]


def test_unsupported_configs_are_refused_naming_the_field(tmp_path):
    path, _ = write_checkpoint(tmp_path, "gptq")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"config\.json: .*quantization_config\.bits: 3 is not "
        r"supported \(expected 4 or 8\)",
    ):
        engine(str(path))
    config["quantization_config"].update(bits=4, checkpoint_format="gptq_v3")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"quantization_config\.checkpoint_format: 'gptq_v3'"):
        engine(str(path))


def test_isq_is_refused_for_a_quantized_checkpoint(tmp_path):
    path, _ = write_checkpoint(tmp_path, "awq")
    with pytest.raises(Exception, match="already quantized"):
        engine(str(path), isq="int4")
