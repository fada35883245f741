"""Helpers to run a tallow model without the engine, and tiny transformers twins to check it.

``PagedRunner`` plays the model runner's part: contiguous block tables, one paged KV cache per
``Attention`` module, and the step's ``AttentionMetadata`` in the forward context of the torch
reference backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.kernels.kv_cache import allocate_layer
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import Attention, AttentionMetadata, BuildContext, forward_context
from tallow.layers.torch_attention import TorchAttentionBackend


@dataclass
class _Seq:
    blocks: list[int]
    length: int = 0  # tokens already in the cache


@dataclass
class PagedRunner:
    """Runs steps of a flat batch through ``model`` with a paged KV cache."""

    model: Any
    block_size: int = 4
    blocks_per_seq: int = 16
    max_seqs: int = 4
    seqs: dict[int, _Seq] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.backend = TorchAttentionBackend()
        num_blocks = self.blocks_per_seq * self.max_seqs
        p = next(self.model.parameters())
        for m in self.model.modules():
            if isinstance(m, Attention):
                m.kv_cache = allocate_layer(AutoKVCodec(), num_kv_heads=m.layer.num_kv_heads,
                                            head_dim=m.layer.head_dim,
                                            block_size=self.block_size, num_blocks=num_blocks,
                                            model_dtype=p.dtype, device=p.device,
                                            layer=m.layer)

    def add(self, seq_id: int) -> None:
        first = len(self.seqs) * self.blocks_per_seq
        self.seqs[seq_id] = _Seq(list(range(first, first + self.blocks_per_seq)))

    @torch.no_grad()
    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Run one step: ``chunks`` = [(seq id, its next tokens)]; returns each chunk's
        float32 logits ``[len(tokens), vocab]``."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for seq_id, tokens in chunks:
            seq = self.seqs[seq_id]
            for j, tok in enumerate(tokens):
                pos = seq.length + j
                ids.append(tok)
                positions.append(pos)
                slots.append(seq.blocks[pos // self.block_size] * self.block_size
                             + pos % self.block_size)
            seq.length += len(tokens)
            if seq.length > self.blocks_per_seq * self.block_size:
                raise ValueError("sequence longer than the test cache")
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(seq.length)
            tables.append(seq.blocks)
        device = next(self.model.parameters()).device
        meta = AttentionMetadata(
            num_seqs=len(chunks), num_tokens=len(ids),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            max_query_len=max(len(t) for _, t in chunks), max_seq_len=max(seq_lens),
            block_size=self.block_size, query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
        )
        with forward_context(meta, self.backend):
            hidden = self.model(torch.tensor(ids, device=device),
                                torch.tensor(positions, device=device))
        logits = self.model.compute_logits(hidden).float()
        return [logits[starts[i]:starts[i + 1]] for i in range(len(chunks))]

    def greedy(self, seq_id: int, prompt: list[int], steps: int
               ) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
        """Prefill ``prompt`` then decode ``steps`` tokens greedily: (tokens, per-step logits of
        the token chosen at each step [vocab], prompt logits [P, vocab])."""
        self.add(seq_id)
        prompt_logits = self.step([(seq_id, prompt)])[0]
        last = prompt_logits[-1]
        tokens, step_logits = [], []
        for _ in range(steps):
            step_logits.append(last)
            tok = int(last.argmax())
            tokens.append(tok)
            last = self.step([(seq_id, [tok])])[0][-1]
        return tokens, step_logits, prompt_logits


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
    """Give every parameter of a transformers model random values (biases and norm weights too,
    which transformers initialises to constants that would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(std * noise)


def build_hf(config: Any, path: Path, seed: int = 0) -> Any:
    """A transformers model of ``config`` with random weights, saved as safetensors at ``path``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                             dtype=torch.float32)
    randomize_(model, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def load_tallow(path: Path, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> tuple[Any, Any]:
    """(model, checkpoint) of the directory through the safetensors format and the registered
    architecture class."""
    from tallow.layers import ArchConfig
    from tallow_safetensors.format import SafetensorsFormat

    from tallow_llama import model as llama_models

    fmt = SafetensorsFormat()
    assert fmt.claims(str(path))
    ckpt = fmt.load(str(path))
    cls = getattr(llama_models, ckpt.architecture)
    model = cls(ArchConfig(ckpt.config), BuildContext(dtype=dtype, device=torch.device(device)))
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    model.eval()
    return model, ckpt


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, what: str,
                        rel: float = 1e-4) -> None:
    """Logits agree to ``rel`` of their scale."""
    ref = ref.float()
    scale = max(1.0, float(ref.abs().max()))
    err = float((ours.float() - ref).abs().max())
    assert err <= rel * scale, f"{what}: max |diff| {err:.3e} > {rel:.0e} * scale {scale:.2f}"


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(PagedRunner=PagedRunner, build_hf=build_hf, load_tallow=load_tallow,
                           randomize_=randomize_, assert_close_logits=assert_close_logits)
