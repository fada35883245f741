"""Mixtral as llama.cpp writes it: GGUF architecture ``llama`` with ``llama.expert_count``,
Q/K rows interleaved, stacked ``ffn_*_exps`` experts (or the per-expert tensors of older
files), written by the ``gguf`` package in float32. The engine resolves such a file to
MixtralForCausalLM (tallow-model-llama's ``config_from_gguf`` names it), and the model matches
transformers on the same weights."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("gguf", reason="the gguf package writes the files")
pytest.importorskip("tallow_format_gguf", reason="tallow-format-gguf reads the files")

from tallow.engine.loader import resolve_architecture  # noqa: E402
from tallow.plugin import SelectionError  # noqa: E402
from tallow.plugin.registry import Registries  # noqa: E402
from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors, write_gguf  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow_format_gguf.format import GGUFFormat  # noqa: E402
from tallow_model_llama.plugin import tallow_register_architectures as register_llama  # noqa: E402

from tallow_model_mixtral.model import MixtralForCausalLM  # noqa: E402
from tallow_model_mixtral.plugin import (  # noqa: E402
    tallow_register_architectures as register_mixtral,
)

BASE = dict(
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=160,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]
STEPS = 32


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q and K rows of ``llama`` models."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_mixtral(path, hf, *, per_expert: bool = False) -> None:
    cfg = hf.config

    def permute(name, array):
        if name.endswith("self_attn.q_proj.weight"):
            return llama_cpp_permute(array, cfg.num_attention_heads)
        if name.endswith("self_attn.k_proj.weight"):
            return llama_cpp_permute(array, cfg.num_key_value_heads)
        return array

    tensors = list(gguf_tensors(hf.state_dict(), "llama", cfg.num_hidden_layers, transform=permute))
    if per_expert:  # older files: one tensor per expert, blk.i.ffn_gate.{e}.weight
        split = []
        for name, array in tensors:
            if "_exps." in name:
                base = name.replace("_exps.weight", "")
                split += [
                    (f"{base}.{e}.weight", np.ascontiguousarray(array[e]))
                    for e in range(array.shape[0])
                ]
            else:
                split.append((name, array))
        tensors = split
    metadata = gguf_metadata(
        cfg, expert_count=cfg.num_local_experts, expert_used_count=cfg.num_experts_per_tok
    )
    write_gguf(path, "llama", metadata, tensors, cfg.vocab_size)


def registries(with_mixtral: bool = True) -> Registries:
    regs = Registries()
    register_llama(regs.architectures)
    if with_mixtral:
        register_mixtral(regs.architectures)
    return regs


@pytest.mark.parametrize("per_expert", [False, True])
def test_a_llama_file_with_experts_is_a_mixtral(tmp_path, per_expert):
    config = transformers.MixtralConfig(**BASE, num_local_experts=8, num_experts_per_tok=2)
    hf = random_hf_model(config, seed=21)
    path = tmp_path / "mixtral.gguf"
    write_mixtral(path, hf, per_expert=per_expert)
    ckpt = GGUFFormat().load(str(path))
    assert ckpt.architecture == "gguf:llama"
    entry, resolved = resolve_architecture(registries(), ckpt)
    assert entry.name == "MixtralForCausalLM"
    assert resolved["architectures"] == ["MixtralForCausalLM"]
    assert (
        resolved["num_local_experts"],
        resolved["num_experts_per_tok"],
        resolved["intermediate_size"],
    ) == (8, 2, 48)
    model = load_model(MixtralForCausalLM, ckpt, config=resolved)
    assert type(model.model.layers[0].mlp).__name__ == "FusedMoE"
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="mixtral GGUF")


def test_a_dense_llama_file_stays_llama(tmp_path):
    config = transformers.LlamaConfig(**BASE)
    hf = random_hf_model(config, seed=22)
    path = tmp_path / "llama.gguf"
    write_gguf(
        path,
        "llama",
        gguf_metadata(config),
        gguf_tensors(hf.state_dict(), "llama", config.num_hidden_layers),
        config.vocab_size,
    )
    entry, resolved = resolve_architecture(registries(), GGUFFormat().load(str(path)))
    assert entry.name == "LlamaForCausalLM" and "num_local_experts" not in resolved


def test_without_the_mixtral_plugin_the_file_is_refused_by_name(tmp_path):
    config = transformers.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2)
    path = tmp_path / "mixtral.gguf"
    write_mixtral(path, random_hf_model(config, seed=23))
    with pytest.raises(SelectionError, match="served by MixtralForCausalLM"):
        resolve_architecture(registries(with_mixtral=False), GGUFFormat().load(str(path)))
