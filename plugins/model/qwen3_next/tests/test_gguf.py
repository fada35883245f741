"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE as llama.cpp writes them (``qwen3next``, ``qwen35``,
``qwen35moe``): tiny random transformers models converted by the test-side converter
(:mod:`gguf_convert`, llama.cpp's rules), read back through tallow-format-gguf, the config from
the metadata, then prompt logits and 32 greedy tokens against transformers on the original
weights (float32 files), and a Q8_0 file kept quantized against transformers on the weights the
``gguf`` package decodes from its blocks. Malformed files are refused naming the tensor."""

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

from tallow.layers import ArchConfig, BuildContext, WeightLoadError  # noqa: E402
from tallow.plugin.testing.gguf_files import write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow.plugin.testing.seeds import seed_of  # noqa: E402
from tallow_format_gguf.format import GGUFFormat  # noqa: E402

from tallow_model_qwen3_next.model import Qwen3NextForCausalLM  # noqa: E402
from tallow_model_qwen3_next.qwen3_5 import (  # noqa: E402
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
)

sys.path.insert(0, str(Path(__file__).parent))
from gguf_convert import hybrid_gguf_tensors, hybrid_metadata  # noqa: E402
from tiny_config import TINY  # noqa: E402

PROMPT = [(37 * i + 11) % 128 for i in range(30)]
STEPS = 32
_MOE_KEYS = (
    "mlp_only_layers",
    "norm_topk_prob",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
)
#: Qwen3.5's configs have no mlp_only_layers / norm_topk_prob
DENSE = {k: v for k, v in TINY.items() if k not in _MOE_KEYS}
MOE = dict(
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
)


def next_config(**changes: Any) -> Any:
    """Qwen3-Next with experts in every layer: llama.cpp's ``qwen3next`` has no dense MLP."""
    return transformers.Qwen3NextConfig(**dict(TINY, mlp_only_layers=[], **changes))


def qwen3_5_config() -> Any:
    # a head size other than hidden / heads: the file then states attention.key_length
    return transformers.Qwen3_5TextConfig(**dict(DENSE, head_dim=32))


def qwen3_5_moe_config() -> Any:
    return transformers.Qwen3_5MoeTextConfig(**DENSE, **MOE)


def write(path: Path, hf: Any, arch: str, **options: Any) -> Path:
    cfg = hf.config
    tensors = options.pop("tensors", None) or hybrid_gguf_tensors(hf, arch, **options)
    write_gguf(path, arch, hybrid_metadata(cfg, arch), tensors, cfg.vocab_size)
    return path


def load(path: Path, cls: type, **build: Any) -> tuple[dict[str, Any], Any]:
    ckpt = GGUFFormat().load(str(path))
    assert ckpt.architecture == "gguf:" + cls.gguf_architectures[0]
    config = cls.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))
    if build:
        model = cls(ArchConfig(config), BuildContext(dtype=torch.float32, **build))
        model.load_weights(ckpt.tensors(), naming="gguf")
        return config, model.eval()
    return config, load_model(cls, ckpt, config=config)


@pytest.mark.parametrize("legacy_ssm_in", [False, True], ids=["attn_qkv", "ssm_in"])
def test_qwen3_next_gguf_matches_transformers(tmp_path, legacy_ssm_in):
    """Both layouts of the projection: today's converter splits ``in_proj_qkvz`` into
    ``attn_qkv`` + ``attn_gate``; earlier ones wrote it whole as ``ssm_in``."""
    hf = random_hf_model(next_config(), seed=seed_of("qwen3-next-gguf", 41))
    path = write(tmp_path / "qwen3next.gguf", hf, "qwen3next", legacy_ssm_in=legacy_ssm_in)
    names = set(GGUFFormat().load(str(path)).extra["gguf_tensor_types"])
    layout = {"blk.0.ssm_in.weight"} if legacy_ssm_in else {"blk.0.attn_qkv.weight"}
    assert layout | {"blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_ba.weight"} <= names
    config, model = load(path, Qwen3NextForCausalLM)
    expected = {
        "layer_types": list(hf.config.layer_types),
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "partial_rotary_factor": 0.25,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "norm_topk_prob": True,
        "num_hidden_layers": 4,
    }
    assert {k: config[k] for k in expected} == expected
    assert_greedy_parity(model, hf, PROMPT, STEPS, what=f"qwen3next GGUF ({layout})")


def test_qwen3_5_gguf_with_tiled_value_heads(tmp_path):
    """``qwen35`` regroups the value heads (2 key heads, 4 value heads here) and has a dense
    MLP in every layer."""
    hf = random_hf_model(qwen3_5_config(), seed=seed_of("qwen3-next-gguf", 42))
    path = write(tmp_path / "qwen35.gguf", hf, "qwen35")
    config, model = load(path, Qwen3_5ForCausalLM)
    assert config["head_dim"] == 32 and "num_experts" not in config
    assert config["intermediate_size"] == 96
    assert type(model.model.layers[0].mlp).__name__ == "DenseMLP"
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen35 GGUF")


def fuse_gate_up(tensors: list) -> list:
    """``ffn_gate_exps`` and ``ffn_up_exps`` of each block as llama.cpp's converter can fuse
    them: ``ffn_gate_up_exps`` ``[E, 2I, H]``, gate first."""
    gates = {n: a for n, a in tensors if ".ffn_gate_exps." in n}
    fused = []
    for name, array in tensors:
        if ".ffn_up_exps." in name:
            gate = gates.pop(name.replace("ffn_up_exps", "ffn_gate_exps"))
            fused.append(
                (
                    name.replace("ffn_up_exps", "ffn_gate_up_exps"),
                    np.concatenate([gate, array], axis=1),
                )
            )
        elif ".ffn_gate_exps." not in name:
            fused.append((name, array))
    assert not gates
    return fused


@pytest.mark.parametrize("fused", [False, True], ids=["gate-and-up", "fused-gate-up"])
def test_qwen3_5_moe_gguf_skips_the_multi_token_prediction_block(tmp_path, fused):
    """The converter appends the MTP layer as block ``block_count - 1`` and states
    ``nextn_predict_layers``; the decoder is the blocks before it."""
    hf = random_hf_model(qwen3_5_moe_config(), seed=seed_of("qwen3-next-gguf", 43))
    tensors = hybrid_gguf_tensors(hf, "qwen35moe")
    if fused:
        tensors = fuse_gate_up(tensors)
        assert "blk.0.ffn_gate_up_exps.weight" in {n for n, _ in tensors}
    n = hf.config.num_hidden_layers
    mtp = [(name.replace("blk.2.", f"blk.{n}."), a) for name, a in tensors if "blk.2." in name]
    rng = np.random.default_rng(seed_of("qwen3-next-gguf-mtp"))
    for name, shape in (
        ("nextn.eh_proj.weight", (64, 128)),
        ("nextn.enorm.weight", (64,)),
        ("nextn.hnorm.weight", (64,)),
        ("nextn.shared_head_norm.weight", (64,)),
    ):
        mtp.append((f"blk.{n}.{name}", rng.standard_normal(shape).astype(np.float32)))
    metadata = hybrid_metadata(hf.config, "qwen35moe", block_count=n + 1, nextn_predict_layers=1)
    path = tmp_path / "qwen35moe.gguf"
    write_gguf(path, "qwen35moe", metadata, tensors + mtp, hf.config.vocab_size)
    config, model = load(path, Qwen3_5MoeForCausalLM)
    assert config["num_hidden_layers"] == n and len(model.model.layers) == n
    assert config["norm_topk_prob"] is True
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen35moe GGUF")


def _q8_0(array: np.ndarray) -> np.ndarray:
    return gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)


def _decoded(array: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(_q8_0(array), gguf.GGMLQuantizationType.Q8_0)


def _gguf_float(name: str, array: np.ndarray) -> bool:
    """What llama.cpp's converter keeps in float32 in a Q8_0 file: vectors, the convolution,
    the router and the shared expert's gate."""
    return array.ndim < 2 or ".ssm_conv1d." in name or ".ffn_gate_inp" in name


def _hf_float(name: str, array: np.ndarray) -> bool:
    """The Hugging Face tensors of what :func:`_gguf_float` keeps."""
    return (
        array.ndim < 2
        or ".conv1d." in name
        or name.endswith((".mlp.gate.weight", ".shared_expert_gate.weight"))
    )


def write_q8_0(directory: Path, hf: Any) -> tuple[Path, Any]:
    """(a Qwen3-Next Q8_0 file of ``hf`` in ``directory``, ``hf`` on the weights ``gguf``
    decodes from its blocks): every matrix but the convolution and the routers as Q8_0 blocks,
    quantized by the ``gguf`` package. The converter only moves whole rows of Qwen3-Next's
    matrices (and Q8_0 quantizes each row on its own), so quantizing the Hugging Face tensors
    gives the file's blocks."""
    tensors = [
        (name, array) if _gguf_float(name, array) else (name, _q8_0(array), "Q8_0")
        for name, array in hybrid_gguf_tensors(hf, "qwen3next")
    ]
    path = write(directory / "qwen3next-q8_0.gguf", hf, "qwen3next", tensors=tensors)
    decoded = {
        name: torch.from_numpy(_decoded(w.detach().float().numpy())).view(w.shape)
        for name, w in hf.state_dict().items()
        if not _hf_float(name, w.numpy())
    }
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in decoded
    hf.load_state_dict(decoded, strict=False)
    return path, hf


@pytest.fixture(scope="module")
def q8_0_file(tmp_path_factory) -> tuple[Path, Any]:
    # every matrix's rows a whole number of 32-value Q8_0 blocks
    hf = random_hf_model(
        next_config(shared_expert_intermediate_size=64), seed=seed_of("qwen3-next-gguf", 44)
    )
    return write_q8_0(tmp_path_factory.mktemp("q8_0"), hf)


def test_q8_0_file_stays_quantized_and_matches_the_decoded_weights(q8_0_file):
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    path, hf = q8_0_file
    ckpt = GGUFFormat().load(str(path))
    types = ckpt.extra["gguf_tensor_types"]
    assert ckpt.quantization == "gguf"
    assert types["blk.0.attn_qkv.weight"] == types["blk.0.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.0.ssm_conv1d.weight"] == "F32"
    scheme = GGUFQuantScheme(None)
    _, model = load(path, Qwen3NextForCausalLM, quant=scheme)
    linear = model.model.layers[0].linear_attn
    # shards of one type are joined into one part
    assert [p.type_name for p in linear.in_proj_qkvz.quant_method.parts] == ["Q8_0"]
    assert linear.out_proj.quant_method.parts[0].type_name == "Q8_0"
    experts = model.model.layers[0].mlp.experts.quant_method
    assert {p.type_name for p in experts.stacked.values()} == {"Q8_0"}
    assert "Q8_0" in scheme.summary()
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="qwen3next Q8_0 GGUF")


def test_the_engine_serves_the_q8_0_file_in_prefill_chunks(q8_0_file):
    """The whole path of a ``.gguf`` source: the format plugin, the architecture found by
    ``qwen3next``, the config from the metadata, the blocks kept by tallow-quant-gguf, prompts
    prefilled in chunks of 5 with the state carried between them."""
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    from tallow import SamplingParams
    from tallow.plugin.testing.engine import offline_llm
    from tallow.plugin.testing.model import hf_greedy

    path, hf = q8_0_file
    prompts = [PROMPT, list(range(60, 83)), [5, 9, 2]]
    llm = offline_llm(
        str(path),
        plugins=["tallow-model-qwen3-next", "tallow-format-gguf", "tallow-quant-gguf"],
        config={
            "model": {"dtype": "float32", "max_model_len": 96},
            "cache": {"num_blocks": 64, "block_size": 4},
            "scheduler": {"max_num_batched_tokens": 5, "prefill_chunk_size": 5},
            "plugins": {"settings": {"tallow-quant-gguf": {"cpu": True}}},
        },
    )
    assert "Q8_0" in llm.engine.parts.loaded.quant.summary()
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params)
    assert [list(o.outputs[0].token_ids) for o in outs] == [
        hf_greedy(hf, p, 16)[0] for p in prompts
    ]


def _drop(tensors: list, name: str) -> list:
    kept = [t for t in tensors if t[0] != name]
    assert len(kept) == len(tensors) - 1, name
    return kept


def test_a_file_without_an_ssm_tensor_is_refused_naming_it(tmp_path):
    hf = random_hf_model(next_config(), seed=seed_of("qwen3-next-gguf", 45))
    tensors = _drop(hybrid_gguf_tensors(hf, "qwen3next"), "blk.1.ssm_a")
    path = write(tmp_path / "no-ssm-a.gguf", hf, "qwen3next", tensors=tensors)
    with pytest.raises(WeightLoadError, match=r"lacks 1 tensor.*blk\.1\.ssm_a"):
        load(path, Qwen3NextForCausalLM)
    # a projection missing in both its layouts names both
    tensors = _drop(hybrid_gguf_tensors(hf, "qwen3next"), "blk.3.attn_gate.weight")
    path = write(tmp_path / "no-gate.gguf", hf, "qwen3next", tensors=tensors)
    with pytest.raises(
        WeightLoadError, match=r"blk\.3\.ssm_in\.weight \| blk\.3\.attn_qkv\.weight \+ "
    ):
        load(path, Qwen3NextForCausalLM)


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35"])
def test_a_convolution_of_the_wrong_shape_is_refused_naming_it(tmp_path, arch):
    hf = random_hf_model(
        next_config() if arch == "qwen3next" else qwen3_5_config(),
        seed=seed_of("qwen3-next-gguf", 46),
    )
    cls = Qwen3NextForCausalLM if arch == "qwen3next" else Qwen3_5ForCausalLM
    tensors = [
        (name, array[:, :3] if name == "blk.0.ssm_conv1d.weight" else array)
        for name, array in hybrid_gguf_tensors(hf, arch)
    ]
    path = write(tmp_path / "conv.gguf", hf, arch, tensors=tensors)
    with pytest.raises(ValueError, match=r"blk\.0\.ssm_conv1d\.weight.*\[96, 3\].*\[96, 4\]"):
        load(path, cls)


def _metadata(arch: str, **changes: Any) -> dict[str, Any]:
    keys = {
        "block_count": 4,
        "embedding_length": 64,
        "attention.head_count": 4,
        "ssm.conv_kernel": 4,
        "ssm.state_size": 16,
        "ssm.group_count": 2,
        "ssm.time_step_rank": 4,
        "ssm.inner_size": 32,
        "full_attention_interval": 2,
        "expert_count": 8,
        "expert_used_count": 2,
        "expert_feed_forward_length": 32,
        "expert_shared_feed_forward_length": 48,
    }
    keys.update(changes)
    meta = {f"{arch}.{k}": v for k, v in keys.items() if v is not None}
    meta["general.architecture"] = arch
    return meta


def test_config_from_metadata():
    cfg = Qwen3NextForCausalLM.config_from_gguf(_metadata("qwen3next"), {"num_experts": 8})
    assert cfg["layer_types"] == ["linear_attention", "full_attention"] * 2
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and cfg["model_type"] == "qwen3_next"
    meta = _metadata("qwen3next", full_attention_interval=None, expert_weights_norm=False)
    cfg = Qwen3NextForCausalLM.config_from_gguf(meta, {})
    # llama.cpp's default interval
    assert cfg["layer_types"][3] == "full_attention" and cfg["norm_topk_prob"] is False
    with pytest.raises(ValueError, match=r"'qwen3next\.ssm\.state_size' is missing"):
        Qwen3NextForCausalLM.config_from_gguf(
            _metadata("qwen3next", **{"ssm.state_size": None}), {}
        )
    with pytest.raises(ValueError, match="ssm.inner_size 30 is not a multiple"):
        Qwen3NextForCausalLM.config_from_gguf(_metadata("qwen3next", **{"ssm.inner_size": 30}), {})
    with pytest.raises(ValueError, match="architecture qwen35moe, not qwen35"):
        Qwen3_5ForCausalLM.config_from_gguf(_metadata("qwen35"), {"intermediate_size": 96})
    with pytest.raises(ValueError, match="expert_count is missing"):
        Qwen3_5MoeForCausalLM.config_from_gguf(_metadata("qwen35moe", expert_count=None), {})
    with pytest.raises(ValueError, match="leaves no decoder layer"):
        Qwen3_5MoeForCausalLM.config_from_gguf(_metadata("qwen35moe", nextn_predict_layers=4), {})


def test_the_plugin_serves_the_three_gguf_architectures():
    from tallow.plugin.registry import Registries
    from tallow_model_qwen3_next.plugin import tallow_register_architectures

    registries = Registries()
    tallow_register_architectures(registries.architectures)
    assert {
        arch: registries.architectures.for_gguf(arch).name
        for arch in ("qwen3next", "qwen35", "qwen35moe")
    } == {
        "qwen3next": "Qwen3NextForCausalLM",
        "qwen35": "Qwen3_5ForCausalLM",
        "qwen35moe": "Qwen3_5MoeForCausalLM",
    }
