"""Real FP4 checkpoints on CPU: a tiny random Llama whose linear layers are MXFP4 (gpt-oss's
``weight_blocks``/``weight_scales``), compressed-tensors MXFP4 or NVFP4 loads through tallow's
safetensors format into the ``fp4`` scheme; its logits equal those of the transformers model
of the decoded weights and its greedy tokens are that model's. ``--isq mxfp4`` computes what
the float model of its decoded weights computes."""

from __future__ import annotations

import pytest
import torch

from fp4_checkpoints import write_checkpoint

pytest.importorskip("transformers", reason="transformers is the float oracle")
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77]


def _engine(source: str, **model):
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine

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


def _tokens(eng, prompt, steps):
    from tallow import SamplingParams

    rid = eng.next_request_id()
    eng.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    out = []
    while eng.has_unfinished():
        out = [list(o.outputs[0].token_ids) for o in eng.step() if o.finished] or out
    return out[0]


@torch.no_grad()
def _hf(model, prompt, steps):
    ids = torch.tensor([prompt])
    first = model(ids).logits[0]
    logits, out = first, []
    for _ in range(steps):
        out.append(int(logits[-1].argmax()))
        ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
        logits = model(ids).logits[0]
    return out, first


@pytest.mark.parametrize("kind", ["mxfp4", "ct-mxfp4", "nvfp4"])
def test_a_checkpoint_computes_its_decoded_float_model(tmp_path, kind):
    from tallow.engine.loader import load_model
    from tallow.plugin.testing import PagedRunner

    path, hf = write_checkpoint(tmp_path, kind)
    eng = _engine(str(path))
    loaded = eng.parts.loaded
    assert type(loaded.quant).__name__ == "FP4QuantScheme"
    expected = "nvfp4" if kind == "nvfp4" else "mxfp4"
    assert loaded.model.model.layers[0].self_attn.qkv_proj.quant_method.type_names() == [expected]
    tokens, logits_hf = _hf(hf, PROMPT, 8)
    fresh = load_model(
        eng.plugin_manager.registries,
        str(path),
        device=torch.device("cpu"),
        dtype="float32",
        config=None,
    )
    runner = PagedRunner(fresh.model)
    runner.add(0)
    logits = runner.step([(0, PROMPT)])[0]
    scale = float(logits_hf.abs().max())
    torch.testing.assert_close(logits, logits_hf, rtol=1e-4, atol=1e-4 * scale)
    assert _tokens(eng, PROMPT, 8) == tokens


def test_isq_mxfp4_equals_the_float_model_of_its_decoded_weights(tmp_path):
    import transformers

    from tallow.engine.random_model import synthetic_tokenizer
    from tallow_quant_fp4.isq import quantize_mxfp4
    from tallow_quant_fp4.layout import dequantize

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
    model.save_pretrained(tmp_path / "float")
    synthetic_tokenizer(320).save(str(tmp_path / "float" / "tokenizer.json"))
    decoded = {
        n: dequantize(quantize_mxfp4(w.float(), torch.device("cpu")))
        for n, w in model.state_dict().items()
        if w.dim() == 2 and "embed" not in n
    }
    model.load_state_dict(decoded, strict=False)
    model.save_pretrained(tmp_path / "decoded")
    synthetic_tokenizer(320).save(str(tmp_path / "decoded" / "tokenizer.json"))
    quantized = _engine(str(tmp_path / "float"), isq="mxfp4")
    assert quantized.parts.loaded.quant.summary() == "fp4: mxfp4 x9, quantized at load to mxfp4"
    reference = _engine(str(tmp_path / "decoded"))
    for prompt in ([3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]):
        assert _tokens(quantized, prompt, 8) == _tokens(reference, prompt, 8)
