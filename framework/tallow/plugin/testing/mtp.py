"""Tiny checkpoints that ship a DeepSeek-V3-style multi-token prediction layer (DeepSeek-V3,
GLM-4.5) and the formula of one MTP step, for model plugins' tests of their MTP heads.

:func:`save_mtp_checkpoint` saves a transformers model built with one decoder layer more than
the config it writes declares: that last layer, ``model.layers.{num_hidden_layers}``, is the MTP
layer's decoder block; the layer's own tensors (``enorm``, ``hnorm``, ``eh_proj``,
``embed_tokens``, ``shared_head.norm`` / ``.head``) are added under their real names and
``num_nextn_predict_layers`` is 1. :func:`reference_mtp_step` computes the layer's output from
the formula, with transformers' decoder layer as the block's oracle.
:func:`assert_mtp_keeps_greedy_outputs` checks a model under ``speculative.method: mtp``
against the same checkpoint without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .tokenizer import save_tokenizer

__all__ = [
    "assert_mtp_keeps_greedy_outputs",
    "save_mtp_checkpoint",
    "reference_mtp_step",
    "reference_mtp_logits",
]


def save_mtp_checkpoint(
    path: str | Path, config_cls: Any, model_cls: Any, config: dict[str, Any], seed: int
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Save at ``path`` (with a tiny tokenizer) a checkpoint of ``config`` (transformers'
    keywords; ``num_hidden_layers`` the model's) plus its MTP layer; returns transformers'
    ``model_cls`` of one layer more (its last is the MTP block) and the MTP layer's own
    tensors by their names inside the layer."""
    from safetensors.torch import load_file, save_file

    root = Path(path)
    layers = int(config["num_hidden_layers"])
    torch.manual_seed(seed)
    hf = model_cls(config_cls(**{**config, "num_hidden_layers": layers + 1})).eval()
    hf.save_pretrained(str(root), safe_serialization=True)
    weights = load_file(str(root / "model.safetensors"))
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    own = {
        "enorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "hnorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "eh_proj.weight": 0.1 * torch.randn(hidden, 2 * hidden, generator=gen),
        "embed_tokens.weight": 0.5 * torch.randn(vocab, hidden, generator=gen),
        "shared_head.norm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "shared_head.head.weight": 0.5 * torch.randn(vocab, hidden, generator=gen),
    }
    for name, tensor in own.items():
        weights[f"model.layers.{layers}.{name}"] = tensor
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    saved = json.loads((root / "config.json").read_text())
    saved["num_hidden_layers"] = layers
    saved["num_nextn_predict_layers"] = 1
    (root / "config.json").write_text(json.dumps(saved))
    save_tokenizer(root)
    return hf, own


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_mtp_step(
    hf: Any, own: dict[str, torch.Tensor], tokens: list[int], hidden: torch.Tensor, eps: float
) -> torch.Tensor:
    """The MTP layer's output hidden states at positions ``0 .. len(tokens) - 1`` (position
    ``p`` combines ``tokens[p]``, the token after it, with ``hidden[p]``)::

        e   = embed_tokens(t)                    (zeros at position 0)
        x   = eh_proj(concat(enorm(e), hnorm(h)))
        out = block(x) with its residual added   (transformers' last decoder layer of ``hf``)
    """
    ids = torch.tensor(tokens)
    embedded = own["embed_tokens.weight"][ids].clone()
    embedded[0] = 0.0
    x = torch.cat(
        [_rms(embedded, own["enorm.weight"], eps), _rms(hidden, own["hnorm.weight"], eps)], -1
    )
    x = x @ own["eh_proj.weight"].T
    n = x.shape[0]
    pos = torch.arange(n)[None]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        pe = hf.model.rotary_emb(x[None], pos)
        out = hf.model.layers[-1](
            x[None], attention_mask=mask, position_ids=pos, position_embeddings=pe
        )
    out = out[0] if isinstance(out, tuple) else out
    rows: torch.Tensor = out[0]
    return rows


def reference_mtp_logits(
    own: dict[str, torch.Tensor], out: torch.Tensor, eps: float
) -> torch.Tensor:
    """``shared_head.head(shared_head.norm(out))``."""
    return _rms(out, own["shared_head.norm.weight"], eps) @ own["shared_head.head.weight"].T


def assert_mtp_keeps_greedy_outputs(
    plain: Any, with_mtp: Any, prompts: list[list[int]], max_tokens: int = 16
) -> None:
    """``with_mtp`` (an offline LLM under ``speculative.method: mtp``) gives the greedy
    outputs of ``plain`` (the same checkpoint without it, whose model loads no head) for
    ``prompts``, having proposed guesses, and its head keeps no sequence and no block after."""
    from tallow import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    assert plain.engine.core.runner.model.mtp_head() is None  # skipped without mtp
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in with_mtp.generate(prompts, params)]
    assert got == want
    core = with_mtp.engine.core
    assert core.stats()["spec_num_proposed_tokens"] > 0
    mtp = core.spec.speculator.mtp
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
