"""Run a model plugin's class without the engine: :class:`PagedRunner` plays the model
runner's part (contiguous block tables, a paged KV cache per ``Attention`` module allocated by
:mod:`tallow.kernels.kv_cache` for a KV codec, a latent cache per ``MLAAttention`` module, one
state slot per sequence for the layers that declare a :class:`~tallow.layers.RecurrentStateSpec`,
the step's ``AttentionMetadata`` in the forward context of the core's torch attention backend)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tallow.kernels import kv_cache
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import (
    Attention,
    AttentionMetadata,
    CausalLM,
    MLAAttention,
    RecurrentStateSpec,
    StateCache,
    cache_layers,
    forward_context,
)
from tallow.layers.torch_attention import TorchAttentionBackend

from ..components import KVCodec


@dataclass
class _Seq:
    blocks: list[int]
    length: int = 0  # tokens already in the cache
    slot: int = 0  # its state slot (in every state group)


@dataclass
class PagedRunner:
    """Runs steps of a flat batch through ``model`` with a paged KV cache of ``kv_codec``
    (a :class:`tallow.plugin.KVCodec`; default: ``auto``, the model's dtype)."""

    model: CausalLM
    block_size: int = 4
    blocks_per_seq: int = 16
    max_seqs: int = 4
    seqs: dict[int, _Seq] = field(default_factory=dict)
    kv_codec: KVCodec | None = None

    def __post_init__(self) -> None:
        self.backend = TorchAttentionBackend()
        codec = self.kv_codec if self.kv_codec is not None else AutoKVCodec()
        # the model's float dtype: a quantized layer's first parameter may be a uint8 one
        p = next(
            (q for q in self.model.parameters() if q.is_floating_point()),
            next(self.model.parameters()),
        )
        dtype = getattr(getattr(self.model, "build", None), "dtype", None) or p.dtype
        attns = [m for m in self.model.modules() if isinstance(m, Attention)]
        caches = kv_cache.allocate(
            codec,
            [m.layer for m in attns],
            num_blocks=self.blocks_per_seq * self.max_seqs,
            block_size=self.block_size,
            model_dtype=dtype,
            device=p.device,
        )
        for m, cache in zip(attns, caches):
            m.kv_cache = cache
        # latent attention (MLA) layers: one latent row per token, in the codec's latent dtype
        latent_dtype = codec.latent_dtype(dtype)
        for mla in self.model.modules():
            if isinstance(mla, MLAAttention):
                if latent_dtype is None:
                    raise ValueError(f"kv codec {codec.name!r} cannot keep a latent cache")
                mla.bind_cache(
                    torch.zeros(
                        self.blocks_per_seq * self.max_seqs,
                        self.block_size,
                        mla.layer.latent_width,
                        dtype=latent_dtype,
                        device=p.device,
                    ),
                    0,
                )
        self.state_caches = self._bind_states(dtype, p.device)

    def _bind_states(self, dtype: torch.dtype, device: torch.device) -> list[list[StateCache]]:
        """Zeroed state tensors (``max_seqs`` slots and the dummy) for each group of layers
        whose recurrent-state specs are equal, bound to them."""
        groups: dict[object, list[object]] = {}
        for layer in cache_layers(self.model):
            spec = layer.cache_spec()
            if isinstance(spec, RecurrentStateSpec):
                groups.setdefault(spec.group_key, []).append(layer)
        bound: list[list[StateCache]] = []
        for index, layers in enumerate(groups.values()):
            spec = layers[0].cache_spec()  # type: ignore[attr-defined]
            caches = []
            for layer in layers:
                cache = StateCache(
                    {
                        t.name: torch.zeros(
                            (self.max_seqs + 1, *t.shape), dtype=t.dtype or dtype, device=device
                        )
                        for t in spec.tensors
                    },
                    index,
                    self.max_seqs,
                )
                layer.bind_cache(cache, index)  # type: ignore[attr-defined]
                caches.append(cache)
            bound.append(caches)
        return bound

    @classmethod
    def holding(
        cls,
        model: CausalLM,
        tokens: int,
        *,
        block_size: int = 4,
        max_seqs: int = 4,
        kv_codec: KVCodec | None = None,
    ) -> PagedRunner:
        """A runner whose sequences each hold ``tokens`` tokens (prompt and generated), and
        at least the default ``blocks_per_seq``."""
        blocks = max(cls.blocks_per_seq, -(-tokens // block_size))
        return cls(
            model,
            block_size=block_size,
            blocks_per_seq=blocks,
            max_seqs=max_seqs,
            kv_codec=kv_codec,
        )

    def add(self, seq_id: int) -> None:
        first = len(self.seqs) * self.blocks_per_seq
        self.seqs[seq_id] = _Seq(
            list(range(first, first + self.blocks_per_seq)), slot=len(self.seqs)
        )

    @torch.no_grad()
    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Run one step: ``chunks`` = [(seq id, its next tokens)]; returns each chunk's
        float32 logits ``[len(tokens), vocab]``."""
        hidden, starts = self._forward(chunks)
        logits = self.model.compute_logits(hidden).float()
        return [logits[starts[i] : starts[i + 1]] for i in range(len(chunks))]

    @torch.no_grad()
    def hidden_states(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Like :meth:`step`, but each chunk's hidden states ``[len(tokens), H]`` as the model
        returns them (an encoder, which has no logits; embeddings)."""
        hidden, starts = self._forward(chunks)
        return [hidden[starts[i] : starts[i + 1]] for i in range(len(chunks))]

    def _forward(self, chunks: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, list[int]]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for seq_id, tokens in chunks:
            seq = self.seqs[seq_id]
            # before any slot is looked up: past the last block there is none to look up
            if seq.length + len(tokens) > self.blocks_per_seq * self.block_size:
                raise ValueError(
                    f"sequence {seq_id} would hold {seq.length + len(tokens)} tokens, more than "
                    f"the {self.blocks_per_seq * self.block_size} of the runner's cache "
                    f"(blocks_per_seq {self.blocks_per_seq} x block_size {self.block_size}); "
                    "build it with PagedRunner.holding(model, tokens)"
                )
            for j, tok in enumerate(tokens):
                pos = seq.length + j
                ids.append(tok)
                positions.append(pos)
                slots.append(
                    seq.blocks[pos // self.block_size] * self.block_size + pos % self.block_size
                )
            seq.length += len(tokens)
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(seq.length)
            tables.append(seq.blocks)
        device = next(self.model.parameters()).device
        meta = AttentionMetadata(
            num_seqs=len(chunks),
            num_tokens=len(ids),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            max_query_len=max(len(t) for _, t in chunks),
            max_seq_len=max(seq_lens),
            block_size=self.block_size,
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
        )
        state_slots = torch.tensor(
            [self.seqs[seq_id].slot for seq_id, _ in chunks], dtype=torch.int64, device=device
        )
        meta.state_slots = [state_slots for _ in self.state_caches]
        with forward_context(meta, self.backend):
            hidden = self.model(
                torch.tensor(ids, device=device), torch.tensor(positions, device=device)
            )
        return hidden, starts

    def greedy(
        self, seq_id: int, prompt: list[int], steps: int
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


def prefill_logits(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    """The logits ``[len(tokens), vocab]`` of one prefill of ``tokens`` by ``model``, through a
    :class:`PagedRunner` that holds them (forward hooks on the model see that one prefill)."""
    return PagedRunner.holding(model, len(tokens)).greedy(0, tokens, 0)[2]


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
    """Give every parameter of a transformers model random values (biases and norm weights too,
    which transformers initialises to constants that would hide mistakes): norm weights
    ``1 + 0.2 N(0, 1)``, everything else, norm biases included, ``std N(0, 1)`` (a LayerNorm
    bias near 1 everywhere would add the same vector to every token's state)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and not name.endswith("bias"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(std * noise)
