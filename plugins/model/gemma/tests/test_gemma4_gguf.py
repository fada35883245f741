"""Gemma 4 as llama.cpp writes it (``gemma4``): tiny random transformers models converted by
the test-side converter (:mod:`gemma4_gguf_convert`, llama.cpp's rules), read back through
tallow-format-gguf with the config from the metadata, then prompt logits and 32 greedy tokens
against transformers: float32 and float16 files (transformers on the float16-rounded weights),
and a Q8_0 file kept quantized (transformers on the weights the ``gguf`` package decodes from
its blocks); the engine end to end on a ``.gguf`` path; missing keys refused by name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
gguf = pytest.importorskip("gguf", reason="the gguf package writes the files")
pytest.importorskip("tallow_format_gguf", reason="tallow-format-gguf reads the files")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.gguf_files import write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_model,
)
from tallow_format_gguf.format import GGUFFormat  # noqa: E402

from tallow_model_gemma.gemma4 import Gemma4ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gemma4_gguf_convert import gemma4_metadata, gemma4_tensors, hf_weights_of  # noqa: E402
from test_gemma4_parity import build  # noqa: E402

STEPS = 32


def write(path: Path, hf: Any, tensors: list | None = None, **metadata_changes: Any) -> Path:
    cfg = hf.config
    metadata = {**gemma4_metadata(cfg), **metadata_changes}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    rows = tensors if tensors is not None else [(g, a) for g, _, a in gemma4_tensors(hf)]
    write_gguf(path, "gemma4", metadata, rows, cfg.vocab_size)
    return path


def load(
    path: Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu", **build_kw: Any
) -> tuple[dict[str, Any], Any]:
    """(config, model) of a GGUF file; ``build_kw`` adds to the build (a quant scheme)."""
    ckpt = GGUFFormat().load(str(path))
    assert ckpt.architecture == "gguf:gemma4" and ckpt.naming == "gguf"
    config = Gemma4ForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    if build_kw:
        build_ctx = BuildContext(dtype=dtype, device=torch.device(device), **build_kw)
        model = Gemma4ForCausalLM(ArchConfig(config), build_ctx)
        model.load_weights(ckpt.tensors(), naming="gguf")
        return config, model.eval()
    return config, load_model(Gemma4ForCausalLM, ckpt, config=config, dtype=dtype, device=device)


@pytest.mark.parametrize("name", ["dense", "kv-shared", "moe", "kv-shared-k-eq-v"])
def test_float32_file_matches_transformers(name, tmp_path, kit):
    hf = build(name, tmp_path / "hf", kit)
    config, model = load(write(tmp_path / f"{name}.gguf", hf))
    cfg = hf.config
    assert config["layer_types"] == list(cfg.layer_types)
    assert (config["head_dim"], config["global_head_dim"]) == (16, 32)
    assert config["attention_k_eq_v"] == bool(cfg.attention_k_eq_v)
    assert config["num_kv_shared_layers"] == cfg.num_kv_shared_layers
    assert config["use_double_wide_mlp"] == bool(cfg.use_double_wide_mlp)
    assert config["hidden_size_per_layer_input"] == (cfg.hidden_size_per_layer_input or 0)
    assert config["enable_moe_block"] == bool(cfg.enable_moe_block)
    assert config["final_logit_softcapping"] == pytest.approx(3.0)
    assert_greedy_parity(model, hf, kit.PROMPT, STEPS, what=f"gemma4 {name} F32 GGUF")


def test_without_rope_freqs_the_full_layers_rotate_whole_heads(tmp_path, kit):
    """The ``rope_freqs`` tensor is what makes full layers rotate only part of each head (half,
    in the tiny config): a file without it no longer matches transformers."""
    hf = build("dense", tmp_path / "hf", kit)
    rows = [(g, a) for g, _, a in gemma4_tensors(hf) if g != "rope_freqs.weight"]
    _, model = load(write(tmp_path / "no-freqs.gguf", hf, rows))
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    ours = kit.PagedRunner(model).greedy(0, kit.PROMPT, 0)[2]
    assert float((ours - ref).abs().max()) > 1e-2


def test_float16_file_matches_transformers_on_the_rounded_weights(tmp_path, kit):
    hf = build("kv-shared", tmp_path / "hf", kit)
    rows, rounded = [], {}
    for g, h, a in gemma4_tensors(hf):
        if a.ndim >= 2:
            a = a.astype(np.float16)
            rounded[h] = a.astype(np.float32)
        rows.append((g, a))
    path = write(tmp_path / "f16.gguf", hf, rows)
    assert GGUFFormat().load(str(path)).extra["gguf_tensor_types"]["blk.0.attn_q.weight"] == "F16"
    hf_weights_of(hf, rounded)
    _, model = load(path)
    assert_greedy_parity(model, hf, kit.PROMPT, STEPS, what="gemma4 F16 GGUF")


def _quantizable(gguf_name: str, array: np.ndarray) -> bool:
    """Matrices whose rows are whole 32-value Q8_0 blocks; the router stays float, as the
    converter keeps ``ffn_gate_inp``."""
    return array.ndim >= 2 and array.shape[-1] % 32 == 0 and ".ffn_gate_inp." not in gguf_name


def write_q8_0(directory: Path, hf: Any) -> Path:
    """A Q8_0 file of ``hf``; ``hf`` then holds the weights its blocks decode to."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    rows, decoded = [], {}
    for g, h, a in gemma4_tensors(hf):
        if not _quantizable(g, a):
            rows.append((g, a))
            continue
        blocks = gguf.quants.quantize(a, q8)
        rows.append((g, blocks, "Q8_0"))
        decoded[h] = gguf.quants.dequantize(blocks, q8).astype(np.float32)
    path = write(directory / "q8_0.gguf", hf, rows)
    hf_weights_of(hf, decoded)
    return path


@pytest.fixture
def q8_0_moe(tmp_path, kit) -> tuple[Path, Any]:
    hf = build("moe", tmp_path / "hf", kit)
    return write_q8_0(tmp_path, hf), hf


def test_q8_0_moe_file_stays_quantized_and_matches_the_decoded_weights(q8_0_moe, kit):
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    path, hf = q8_0_moe
    types = GGUFFormat().load(str(path)).extra["gguf_tensor_types"]
    assert types["blk.0.ffn_gate_up_exps.weight"] == types["blk.1.attn_q.weight"] == "Q8_0"
    scheme = GGUFQuantScheme(None)
    _, model = load(path, quant=scheme)
    assert "Q8_0" in scheme.summary()
    assert_greedy_parity(model, hf, kit.PROMPT, STEPS, what="gemma4 moe Q8_0 GGUF")


def test_the_engine_serves_the_q8_0_file(q8_0_moe, kit):
    """The whole path of a ``.gguf`` source: the format plugin, the architecture found by
    ``gemma4``, the config from the metadata, the blocks kept by tallow-quant-gguf, prompts
    prefilled in chunks."""
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    from tallow import SamplingParams
    from tallow.plugin.testing.engine import offline_llm
    from tallow.plugin.testing.model import hf_greedy

    path, hf = q8_0_moe
    prompts = [list(kit.PROMPT), list(range(60, 83)), [5, 9, 2]]
    llm = offline_llm(
        str(path),
        plugins=["tallow-model-gemma", "tallow-format-gguf", "tallow-quant-gguf"],
        config={
            "model": {"dtype": "float32", "max_model_len": 96},
            "cache": {"num_blocks": 64, "block_size": 4},
            "scheduler": {"max_num_batched_tokens": 5, "prefill_chunk_size": 5},
            "plugins": {"settings": {"tallow-quant-gguf": {"cpu": True}}},
        },
    )
    assert type(llm.engine.parts.loaded.model).__name__ == "Gemma4ForCausalLM"
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params)
    assert [list(o.outputs[0].token_ids) for o in outs] == [
        hf_greedy(hf, p, 16)[0] for p in prompts
    ]


@pytest.mark.parametrize(
    "key",
    ["attention.shared_kv_layers", "embedding_length_per_layer_input", "rope.freq_base"],
)
def test_a_missing_key_is_named(key, tmp_path, kit):
    hf = build("dense", tmp_path / "hf", kit)
    path = write(tmp_path / "missing.gguf", hf, **{key: None})
    with pytest.raises(ValueError, match=rf"'gemma4\.{key}' is missing"):
        load(path)


@pytest.mark.parametrize("key", ["attention.sliding_window_pattern", "attention.key_length_swa"])
def test_a_missing_head_size_key_is_named_by_the_format(key, tmp_path, kit):
    """Without the sliding layers' head size, or without knowing which layers slide, the
    sliding layers' projections are too small for the heads: the format names the key."""
    hf = build("dense", tmp_path / "hf", kit)
    path = write(tmp_path / "missing.gguf", hf, **{key: None})
    with pytest.raises(ValueError, match=rf"gemma4\.{key}"):
        load(path)


def test_values_unlike_gemma_4_are_refused_by_key(tmp_path, kit):
    hf = build("dense", tmp_path / "hf", kit)
    cases = {
        "attention.value_length_swa": (8, "value_length_swa is 8"),
        "rope.dimension_count": (8, "rope.dimension_count is 8"),
        "attention.sliding_window_pattern": ([True] * 5, "last layer must be"),
    }
    for key, (value, message) in cases.items():
        path = write(tmp_path / f"{key}.gguf", hf, **{key: value})
        with pytest.raises(ValueError, match=message):
            load(path)


def test_the_engine_names_the_key_a_file_lacks(tmp_path, kit):
    from tallow.plugin.testing.engine import offline_llm

    hf = build("dense", tmp_path / "hf", kit)
    path = write(tmp_path / "missing.gguf", hf, **{"attention.key_length_swa": None})
    with pytest.raises(Exception, match=r"gemma4\.attention\.key_length_swa"):
        offline_llm(str(path), plugins=["tallow-model-gemma", "tallow-format-gguf"])


@pytest.mark.gpu
def test_float32_file_on_cuda(tmp_path, kit):
    """A KV-shared model with per-layer inputs from a float32 file, built on the GPU: float32
    greedy parity with transformers on the CPU, bfloat16 prompt logits close."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = build("kv-shared", tmp_path / "hf", kit)
    path = write(tmp_path / "kv-shared.gguf", hf)
    assert_cuda_parity(
        lambda **kw: load(path, **kw)[1], hf, kit.PROMPT, STEPS, what="gemma4 F32 GGUF"
    )


@pytest.mark.gpu
def test_q8_0_moe_file_on_cuda(q8_0_moe, kit):
    """The Q8_0 MoE file with its blocks kept on the GPU (tallow-quant-gguf) against
    transformers on the decoded weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    path, hf = q8_0_moe
    assert_cuda_parity(
        lambda **kw: load(path, quant=GGUFQuantScheme(None), **kw)[1],
        hf,
        kit.PROMPT,
        STEPS,
        what="gemma4 moe Q8_0 GGUF",
    )
