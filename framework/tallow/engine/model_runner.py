"""Runs one scheduled step on the model: flat batch in, sampled tokens out.

The runner owns the paged KV cache and persistent input buffers. A step is built on the host
(token ids, positions, slot mapping, block tables), copied to the device in one transfer per
buffer, run under the forward context that :class:`tallow.layers.Attention` reads, and the rows
that need logits go through the sampler. Decode-only batches can replay CUDA graphs
(:mod:`tallow.engine.cuda_graphs`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from tallow.layers import Attention, AttentionMetadata, forward_context

from .outputs import Logprob
from .sampler import RowParams, Sampler, SamplingBatch

log = logging.getLogger("tallow.engine")


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None = None
    rank: int | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class StepResult:
    #: seq_id → the token sampled for it this step
    sampled: dict[int, SampledToken] = field(default_factory=dict)
    #: seq_id → logprobs of the prompt positions computed this step (first prompt token: None)
    prompt_logprobs: dict[int, list[dict[int, Logprob] | None]] = field(default_factory=dict)


def kv_layers(model: torch.nn.Module) -> list[Attention]:
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    layers.sort(key=lambda m: m.layer.layer_index)
    return layers


def kv_bytes_per_block(model: torch.nn.Module, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(2 * block_size * a.layer.num_kv_heads * a.layer.head_dim * elem
               for a in kv_layers(model))


def child_seed(seed: int | None, index: int) -> int | None:
    """The seed of completion ``index`` of a request: distinct streams for n > 1."""
    if seed is None:
        return None
    return seed if index == 0 else (seed * 1_000_003 + index * 7_919) & 0x7FFF_FFFF_FFFF


class ModelRunner:
    def __init__(self, model: torch.nn.Module, *, device: torch.device, dtype: torch.dtype,
                 num_blocks: int, block_size: int, attention_backend: Any, vocab_size: int,
                 max_num_seqs: int, max_model_len: int, eos_token_ids: set[int] | None = None,
                 kv_dtype: torch.dtype | None = None, sampler: Sampler | None = None) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.backend = attention_backend
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.eos_token_ids = set(eos_token_ids or ())
        self.sampler = sampler or Sampler()
        self.kv_dtype = kv_dtype or dtype
        self.layers = kv_layers(model)
        self.kv_caches: list[torch.Tensor] = []
        for attn in self.layers:
            spec = attn.layer
            cache = torch.zeros(2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim,
                                dtype=self.kv_dtype, device=device)
            attn.kv_cache = cache
            self.kv_caches.append(cache)
        self.graphs = None  # set by enable_cuda_graphs()

    # -----------------------------------------------------------------------------------
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers) before they diverge."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]

    def _block_table_rows(self, seqs: list[Any], width: int) -> torch.Tensor:
        table = torch.zeros(len(seqs), max(width, 1), dtype=torch.int32)
        for i, seq in enumerate(seqs):
            ids = seq.block_ids
            if ids:
                table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        return table

    def prepare(self, scheduled: list[Any]) -> tuple[torch.Tensor, torch.Tensor,
                                                    AttentionMetadata]:
        """Host-side flat batch for ``scheduled`` (list of ScheduledSeq)."""
        bs = self.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        for item in scheduled:
            seq, start, n = item.seq, item.start, item.num_tokens
            token_ids.extend(seq.all_token_ids[start:start + n])
            positions.extend(range(start, start + n))
            blocks = seq.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, start + n))
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
        width = max(-(-L // bs) for L in seq_lens)
        table = self._block_table_rows([it.seq for it in scheduled], width)
        dev = self.device
        meta = AttentionMetadata(
            num_seqs=len(scheduled), num_tokens=len(token_ids),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(dev, non_blocking=True),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(dev, non_blocking=True),
            block_tables=table.to(dev, non_blocking=True),
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            max_query_len=max(b - a for a, b in zip(qsl, qsl[1:])),
            max_seq_len=max(seq_lens), block_size=bs,
            query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        )
        ids = torch.tensor(token_ids, dtype=torch.int64).to(dev, non_blocking=True)
        pos = torch.tensor(positions, dtype=torch.int64).to(dev, non_blocking=True)
        return ids, pos, meta

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        if self.graphs is not None and meta.is_decode_only:
            hidden = self.graphs.run(ids, pos, meta)
            if hidden is not None:
                return hidden
        with forward_context(meta, self.backend):
            return self.model(ids, pos)

    # -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: Any) -> StepResult:
        """Run one SchedulerOutput; return the sampled tokens and requested logprobs."""
        self.copy_blocks(out.blocks_to_copy)
        result = StepResult()
        scheduled = out.scheduled
        if not scheduled:
            return result
        ids, pos, meta = self.prepare(scheduled)
        hidden = self.forward(ids, pos, meta)

        qsl = meta.query_start_loc_cpu
        sample_rows: list[int] = []
        rows: list[RowParams] = []
        targets: list[Any] = []
        for i, item in enumerate(scheduled):
            last = qsl[i + 1] - 1
            for seq in item.sample_seqs:
                sample_rows.append(last)
                rows.append(RowParams(params=seq.params, output_token_ids=seq.output_token_ids,
                                      prompt_token_ids=seq.prompt_token_ids,
                                      seed=child_seed(seq.params.seed, seq.index),
                                      step=seq.num_output_tokens))
                targets.append(seq)
            if item.prompt_logprobs:
                result.prompt_logprobs[item.seq.seq_id] = self._prompt_logprobs(
                    hidden[qsl[i]:qsl[i + 1]], item)
        if not rows:
            return result
        row_index = torch.tensor(sample_rows, dtype=torch.int64, device=hidden.device)
        logits = self.model.compute_logits(hidden.index_select(0, row_index)).float()
        batch = SamplingBatch.build(rows, self.vocab_size, logits.device,
                                    eos_token_ids=self.eos_token_ids)
        sampled = self.sampler(logits, batch)
        tokens = sampled.token_ids.tolist()
        lps = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        ranks = sampled.ranks.tolist() if sampled.ranks is not None else None
        top_ids = sampled.top_ids.tolist() if sampled.top_ids is not None else None
        top_lps = sampled.top_logprobs.tolist() if sampled.top_logprobs is not None else None
        for j, seq in enumerate(targets):
            tok = SampledToken(tokens[j])
            want = seq.params.logprobs
            if want is not None and lps is not None:
                tok.logprob = lps[j]
                tok.rank = ranks[j] if ranks is not None else None
                if want and top_ids is not None:
                    tok.top = list(zip(top_ids[j][:want], top_lps[j][:want]))
            result.sampled[seq.seq_id] = tok
        return result

    def _prompt_logprobs(self, hidden: torch.Tensor, item: Any) -> list[dict[int, Logprob] | None]:
        """Logprobs of prompt tokens start+1 .. start+n given their prefixes (the first prompt
        token has no prefix: None)."""
        seq, start, n = item.seq, item.start, item.num_tokens
        k = seq.params.prompt_logprobs or 0
        logits = self.model.compute_logits(hidden).float()
        logprobs = torch.log_softmax(logits, dim=-1)
        out: list[dict[int, Logprob] | None] = [None] if start == 0 else []
        prompt = seq.prompt_token_ids
        for r in range(n):
            p = start + r + 1  # the token this row predicts
            if p >= len(prompt):
                break
            row = logprobs[r]
            token = prompt[p]
            lp = float(row[token])
            rank = int((row > row[token]).sum()) + 1
            entry = {token: Logprob(lp, rank)}
            if k:
                vals, idx = torch.topk(row, k)
                for rnk, (v, t) in enumerate(zip(vals.tolist(), idx.tolist()), start=1):
                    entry.setdefault(t, Logprob(v, rnk))
            out.append(entry)
        return out
