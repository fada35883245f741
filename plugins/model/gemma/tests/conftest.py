"""Tiny random transformers twins of Gemma 2, 3 and 4, their GGUF files as llama.cpp writes
them, and the model-test helpers of :mod:`tallow.plugin.testing` as one ``kit``."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.layers import ArchConfig, BuildContext
from tallow.plugin.testing.model import assert_close_logits, hf_greedy
from tallow.plugin.testing.paged_runner import PagedRunner, randomize_

# the prompt is longer than the windows of the tiny configs, so the windows matter
PROMPT = [
    3,
    17,
    250,
    9,
    64,
    128,
    5,
    77,
    31,
    200,
    1,
    42,
    99,
    150,
    7,
    21,
    8,
    190,
    66,
    13,
    240,
    35,
    102,
    4,
]
STEPS = 20


def build_hf(
    config: Any, seed: int = 0, path: Path | None = None, cls_name: str = "AutoModelForCausalLM"
) -> Any:
    """A transformers model of ``config`` with random weights (saved as safetensors at
    ``path`` if given)."""
    import transformers

    torch.manual_seed(seed)
    factory = getattr(transformers, cls_name)
    build = getattr(factory, "from_config", None) or factory._from_config  # Auto* or a class
    model = build(config, attn_implementation="eager", dtype=torch.float32)
    randomize_(model, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    if path is not None:
        model.save_pretrained(str(path), safe_serialization=True)
    return model


def load_tallow(
    path: Path, dtype: torch.dtype = torch.float32, device: str = "cpu", **overrides: Any
) -> tuple[Any, Any]:
    """(model, checkpoint) of a safetensors directory through the tallow-format-safetensors format and
    the architecture class it names; ``overrides`` replace config keys."""
    from tallow_format_safetensors.format import SafetensorsFormat

    from tallow_model_gemma import gemma4
    from tallow_model_gemma import model as gemma_models

    ckpt = SafetensorsFormat().load(str(path))
    cls = getattr(gemma_models, ckpt.architecture, None) or getattr(gemma4, ckpt.architecture)
    config = {**cls.config_from_hf(dict(ckpt.config)), **overrides}
    model = cls(ArchConfig(config), BuildContext(dtype=dtype, device=torch.device(device)))
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    return model.eval(), ckpt


def hf_generate(
    model: Any, prompt: list[int], steps: int = STEPS
) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
    """transformers' greedy tokens, the logits of each step, and the prompt's logits (only
    those for ``steps=0``)."""
    if steps:
        return hf_greedy(model, prompt, steps)
    with torch.no_grad():
        return [], [], model(torch.tensor([prompt])).logits[0]


def check_two_sequences(hf: Any, model: Any, name: str, steps: int = 8) -> None:
    """Two sequences share each step: one prefilled in chunks that straddle the window while
    the other prefills whole and decodes; then both decode together. Every row's logits must
    be transformers' over the whole sequence."""
    a, b = PROMPT[:17], PROMPT[3:]
    ref_a = hf_generate(hf, a, steps)[0]
    ref_b = hf_generate(hf, b, steps)[0]
    with torch.no_grad():
        want_a = hf(torch.tensor([a + ref_a])).logits[0]
        want_b = hf(torch.tensor([b + ref_b])).logits[0]
    runner = PagedRunner(model)
    runner.add(0)
    runner.add(1)
    got_a, got_b = [], []
    for chunk_a, chunk_b in ((a[:5], b), (a[5:13], [ref_b[0]]), (a[13:], [ref_b[1]])):
        out_a, out_b = runner.step([(0, chunk_a), (1, chunk_b)])
        got_a.append(out_a)
        got_b.append(out_b)
    for i in range(steps - 2):
        out_a, out_b = runner.step([(0, [ref_a[i]]), (1, [ref_b[i + 2]])])
        got_a.append(out_a)
        got_b.append(out_b)
    ours_a, ours_b = torch.cat(got_a), torch.cat(got_b)
    assert_close_logits(ours_a, want_a[: ours_a.shape[0]], f"{name}: sequence a")
    assert_close_logits(ours_b, want_b[: ours_b.shape[0]], f"{name}: sequence b")


def bf16_error_of_transformers(hf: Any, prompt: list[int]) -> float:
    """How far transformers' own bfloat16 copy of ``hf`` is from its float32 prompt logits:
    random weights amplify rounding, so this is the yardstick for ours."""
    import copy

    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = hf(ids).logits[0]
        low = copy.deepcopy(hf).to(torch.bfloat16)(ids).logits[0].float()
    return float((low - ref).abs().max())


# llama.cpp's names for the per-layer tensors of gemma2 / gemma3
GGUF_LAYER_NAMES = {
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
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
GGUF_TOP_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}


def write_gguf(
    path: Path, hf: Any, arch: str, *, norm_shift: float = 1.0, extra: dict[str, Any] | None = None
) -> None:
    """``hf`` as llama.cpp's converter writes a ``gemma2`` / ``gemma3`` file: its tensor names,
    every norm weight stored plus ``norm_shift`` (1), no ``output.weight`` when tied, and the
    metadata keys it writes (``extra``: more ``<arch>.<key>`` values)."""
    import gguf
    import numpy as np

    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    else:
        w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    for key, value in (extra or {}).items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_token_scores([0.0] * cfg.vocab_size)
    w.add_token_types([1] * cfg.vocab_size)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.float().numpy()
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if m:
            layer, module, kind = m.groups()
            gname = f"blk.{layer}.{GGUF_LAYER_NAMES[module]}.{kind}"
        else:
            module, _, kind = name.rpartition(".")
            gname = f"{GGUF_TOP_NAMES[module]}.{kind}"
        if gname.endswith("norm.weight"):
            a = a + norm_shift
        w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(
        PagedRunner=PagedRunner,
        build_hf=build_hf,
        load_tallow=load_tallow,
        randomize_=randomize_,
        assert_close_logits=assert_close_logits,
        hf_generate=hf_generate,
        write_gguf=write_gguf,
        check_two_sequences=check_two_sequences,
        bf16_error_of_transformers=bf16_error_of_transformers,
        PROMPT=PROMPT,
        STEPS=STEPS,
    )
