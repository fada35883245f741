"""Qwen3-Next's multi-token prediction layer (``mtp.*``) under ``speculative.method: mtp``, on
tiny checkpoints saved from transformers with the layer's tensors added under their real names:
one step equals the formula (transformers' full-attention decoder layer as the block's oracle),
greedy outputs equal those without speculation on a model of full-attention layers only (several
sequences, chunked prefill), and a hybrid model, whose recurrent state cannot take rejected
tokens back, loads its head but is refused speculation by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_format_safetensors", reason="the checkpoints are safetensors")

from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.mtp import assert_mtp_keeps_greedy_outputs  # noqa: E402
from tallow.plugin.testing.seeds import seed_of  # noqa: E402
from tallow.plugin.testing.tokenizer import save_tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

PLUGINS = ["tallow-model-qwen3-next", "tallow-format-safetensors"]
EPS = float(TINY["rms_norm_eps"])
ATOL = 2e-4  # float32: rounding only
LAYERS = int(TINY["num_hidden_layers"])
# full attention only: no recurrent state, so the engine may speculate
FULL = dict(TINY, layer_types=["full_attention"] * LAYERS)
PROMPT = [(37 * i + 11) % 128 for i in range(30)]


def save(path: Path, config: dict, seed: int):
    """A checkpoint of ``config`` whose ``mtp.layers.0`` is transformers' extra full-attention
    layer and whose ``mtp.fc`` / norms are random; returns that model and the head's own
    tensors."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    types = [*config["layer_types"], "full_attention"]
    big = dict(config, num_hidden_layers=LAYERS + 1, layer_types=types)
    hf = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**big)).eval()
    hf.save_pretrained(str(path), safe_serialization=True)
    weights = load_file(str(path / "model.safetensors"))
    prefix = f"model.layers.{LAYERS}."
    for name in [n for n in weights if n.startswith(prefix)]:
        weights["mtp.layers.0." + name[len(prefix) :]] = weights.pop(name)
    hidden = int(config["hidden_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    own = {
        "fc.weight": 0.1 * torch.randn(hidden, 2 * hidden, generator=gen),
        "pre_fc_norm_embedding.weight": 0.1 * torch.randn(hidden, generator=gen),
        "pre_fc_norm_hidden.weight": 0.1 * torch.randn(hidden, generator=gen),
        "norm.weight": 0.1 * torch.randn(hidden, generator=gen),
    }
    weights.update({f"mtp.{n}": t for n, t in own.items()})
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    saved = json.loads((path / "config.json").read_text())
    saved.update(num_hidden_layers=LAYERS, layer_types=config["layer_types"])
    (path / "config.json").write_text(json.dumps(saved))
    save_tokenizer(path)
    return hf, own


def rms1(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Qwen3-Next's RMSNorm: scale by ``1 + weight``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def reference(hf, own, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """The head's output at positions ``0 .. len(tokens) - 1`` from the formula."""
    embedded = hf.model.embed_tokens.weight.detach()[torch.tensor(tokens)]
    x = torch.cat(
        [
            rms1(embedded, own["pre_fc_norm_embedding.weight"]),
            rms1(hidden, own["pre_fc_norm_hidden.weight"]),
        ],
        -1,
    )
    x = x @ own["fc.weight"].T
    n = x.shape[0]
    pos = torch.arange(n)[None]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        pe = hf.model.rotary_emb(x[None], pos)
        out = hf.model.layers[LAYERS](
            x[None], attention_mask=mask, position_ids=pos, position_embeddings=pe
        )
    out = out[0] if isinstance(out, tuple) else out
    return rms1(out[0], own["norm.weight"])


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("qwen3-next-mtp")
    hf, own = save(path, FULL, seed_of("qwen3-next-mtp"))
    return path, hf, own


def make(path, method: str | None = "mtp"):
    config = {
        "model": {"dtype": "float32", "max_model_len": 64},
        "cache": {"block_size": 4, "num_blocks": 64},
        "scheduler": {"max_num_batched_tokens": 32, "prefill_chunk_size": 8, "max_num_seqs": 4},
    }
    if method:
        config["speculative"] = {"method": method, "num_speculative_tokens": 3}
    return offline_llm(str(path), plugins=PLUGINS, config=config)


def test_one_mtp_step_equals_the_formula(full):
    path, hf, own = full
    llm = make(path)
    mtp = llm.engine.core.spec.speculator.mtp
    gen = torch.Generator().manual_seed(seed_of("qwen3-next-mtp", "step"))
    tokens = PROMPT[:11]
    hidden = torch.randn(10, int(TINY["hidden_size"]), generator=gen)
    ((logits, out),) = mtp.sync([(("r", 0), tokens, hidden, 0, 1)])
    want = reference(hf, own, tokens[1:], hidden)
    torch.testing.assert_close(out, want[-1], atol=ATOL, rtol=0)
    head = hf.lm_head.weight.detach()
    torch.testing.assert_close(logits, want[-1] @ head.T, atol=ATOL, rtol=0)
    logits2, out2 = mtp.extend([(("r", 0), 9, out)])
    want = reference(hf, own, [*tokens[1:], 9], torch.cat([hidden, out[None]]))
    torch.testing.assert_close(out2[0], want[-1], atol=ATOL, rtol=0)
    mtp.free("r", 0)
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks


def test_greedy_outputs_equal_those_without_mtp(full):
    path, _, _ = full
    assert_mtp_keeps_greedy_outputs(
        make(path, None), make(path), [PROMPT[:11], PROMPT[4:25], PROMPT[:3]]
    )


def test_a_hybrid_model_is_refused_speculation(tmp_path):
    save(tmp_path, dict(TINY), seed_of("qwen3-next-mtp", "hybrid"))
    with pytest.raises(ValueError, match="recurrent state per sequence"):
        make(tmp_path)
