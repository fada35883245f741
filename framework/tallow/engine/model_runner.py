"""Runs one scheduled step on the model: flat batch in, sampled tokens out.

The runner owns the paged KV cache and persistent input buffers. A step is built on the host
(token ids, positions, slot mapping, block tables) and copied to the device in one transfer
per buffer (:class:`tallow.engine.batch_inputs.BatchInputs`), then run under the forward
context that :class:`tallow.layers.Attention` reads, and the rows that need logits go
through the sampler. Decode-only batches can replay CUDA graphs
(:mod:`tallow.engine.cuda_graphs`).
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol, Sequence

import torch

from tallow.kernels import argmax_rows
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.kernels.host import device_tensor
from tallow.kernels.token_bitmask import masked_argmax
from tallow.distributed.driver import StepPublisher
from tallow.layers import (
    Attention,
    AttentionMetadata,
    MultimodalStep,
    Pooler,
    forward_context,
    multimodal_step,
)
from tallow.types import AttentionBackend, KVCodec

from .batch_inputs import BatchInputs, DeviceBatch, logit_rows
from .cache_groups import GroupCaches
from .encoder_cache import MultimodalRunner
from .kv_manager import PagedGroupSize
from .outputs import Logprob
from .sampling import RowParams, Sampler, SamplingBatch, StepRows
from .sampling.grammar import StructuredOutputs
from .verify import child_seed, verify_scheduled
from .scheduler import ScheduledSeq, SchedulerOutput
from .step_result import PendingStep, SampledToken, StepResult, verified_result

log = logging.getLogger("tallow.engine")


def kv_layers(model: torch.nn.Module) -> list[Attention]:
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    layers.sort(key=lambda m: m.layer.layer_index)
    return layers


class GraphReplay(Protocol):
    """What the runner asks of its captured CUDA graphs
    (:class:`tallow.engine.cuda_graphs.CudaGraphRunner`, which sits above the runner)."""

    def run(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None: ...


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        attention_backend: AttentionBackend,
        vocab_size: int,
        max_num_seqs: int,
        max_model_len: int,
        eos_token_ids: set[int] | None = None,
        kv_codec: KVCodec | None = None,
        sampler: Sampler | None = None,
        pooler: Pooler | None = None,
        grammar: StructuredOutputs | None = None,
        group_sizes: list[PagedGroupSize] | None = None,
        sliding_groups: bool = True,
    ) -> None:
        self.model = model
        #: pools embedding requests' hidden states (a tallow.layers.Pooler; None: the engine
        #: only generates)
        self.pooler = pooler
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
        self.kv_codec = kv_codec if kv_codec is not None else AutoKVCodec()
        #: the engine's StructuredOutputs (grammar masks), None when it has none
        self.grammar = grammar
        #: the tensors of every cache group, bound to the model's layers
        self.caches = GroupCaches(
            model,
            self.kv_codec,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype,
            device=device,
            num_slots=max_num_seqs,
            group_sizes=group_sizes,
            sliding_groups=sliding_groups,
        )
        #: the paged cache groups (the first is the primary one), their pools, the state
        #: groups
        self.paged_groups = self.caches.paged_groups
        self.group_sizes = self.caches.group_sizes
        self.state_groups = self.caches.state_groups
        self.layers = kv_layers(model)
        self.kv_caches = [attn.kv_cache for attn in self.layers]
        self.graphs: GraphReplay | None = None  # a CudaGraphRunner once captured
        #: the driver of a tensor-parallel group (tallow.distributed.driver.StepPublisher):
        #: told each step's batch before it runs (``publish``) and its sampled token ids
        #: after (``share_tokens``), so that the workers run the same step. None: one process.
        self.step_publisher: StepPublisher | None = None
        #: images' encoder outputs and positions of a vision-language model's steps (None: the
        #: model takes text only)
        self.multimodal: MultimodalRunner | None = None
        #: keep each generating sequence's hidden states of a step in its result (a speculator
        #: that reads them is on: :attr:`tallow.plugin.Speculator.needs_hidden_states`)
        self.keep_hidden = False
        #: the staging buffers of the steps' inputs and their upload to the device
        self.inputs = BatchInputs(
            device=device,
            block_size=block_size,
            num_paged_groups=len(self.paged_groups),
            num_state_groups=len(self.state_groups),
            free_state_slot=max_num_seqs,
        )

    # -----------------------------------------------------------------------------------
    def copy_blocks(self, pairs: Sequence[tuple[int, ...]]) -> None:
        """Copy-on-write before the forward (:meth:`GroupCaches.copy_blocks`)."""
        if pairs:
            self.caches.copy_blocks(pairs)

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        meta: AttentionMetadata,
        mm: MultimodalStep | None = None,
    ) -> torch.Tensor:
        # A step with images or multi-axis positions runs eagerly: the captured graphs know
        # neither.
        if self.graphs is not None and meta.is_decode_only and mm is None:
            replayed = self.graphs.run(ids, pos, meta)
            if replayed is not None:
                return replayed
        with forward_context(meta, self.backend), multimodal_step(mm):
            hidden: torch.Tensor = self.model(ids, pos)
            return hidden

    # -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(
        self, out: SchedulerOutput, feed: PendingStep | None = None, constrained: bool = False
    ) -> PendingStep:
        """Queue one SchedulerOutput on the device (forward and sampling); nothing waits for
        the device here except prompt logprobs, so the host can do other work meanwhile.

        ``feed`` is the step still running when this one is planned ahead of it (async
        scheduling): sequences whose last token it sampled read that token from its device
        tensor of token ids.

        ``constrained`` says that some sequence of the engine has a grammar. When one of this
        step's sampled sequences does, only the forward and the logits are queued: the caller
        brings the grammars up to date (the tokens of the step before may still be on the
        device) and then calls :meth:`start_masks` and later :meth:`sample_constrained`, so
        the masks are computed while the device runs this step's forward.

        A ``feed`` still waiting for its masks is sampled here, once this step's batch is
        built on the host and before its forward is queued (which reads the feed's tokens):
        the grammar thread fills those masks while the host builds this batch.
        """
        pending = PendingStep()
        scheduled = out.scheduled
        host = None
        if scheduled:
            host = self.inputs.fill_host(
                scheduled, feed.rows_by_seq() if feed is not None else None
            )
        if feed is not None and feed.logits is not None:
            self.sample_constrained(feed)
        for item in scheduled:
            pending.targets.extend(item.sample_seqs)
        pending.sampled_rows = StepRows.of(pending.targets)
        publisher = self.step_publisher
        if publisher is not None:
            publisher.publish(
                out.blocks_to_copy,
                host,
                logit_rows(scheduled, host),
                pending.sampled_rows.plain_argmax,
            )
        self.copy_blocks(out.blocks_to_copy)
        if out.state_ops:
            self.caches.apply_state_ops(out.state_ops)
        if host is None:
            return pending
        batch = self.inputs.upload(host)
        mm = self.multimodal.step_inputs(scheduled) if self.multimodal is not None else None
        hidden = self.run_batch(batch, feed.token_ids if feed is not None else None, mm)
        qsl = batch.meta.query_start_loc_cpu
        for i, item in enumerate(scheduled):
            if item.prompt_logprobs:
                assert qsl is not None  # upload() fills the host offsets
                pending.result.prompt_logprobs[item.seq.seq_id] = self._prompt_logprobs(
                    hidden[qsl[i] : qsl[i + 1]], item
                )
            if item.pool:
                pending.pool_targets.append(item.seq)
        if pending.pool_targets:
            self._pool(pending, hidden, batch)
        # a verify step's tokens are decided on the host now, and constrained rows are
        # sampled once their masks are filled: neither queues a read-back here
        read_back = True
        if pending.targets:
            logits = self.compute_logits(hidden.index_select(0, batch.sample_rows))
            if any(item.draft_token_ids for item in scheduled):
                pending.verified = verify_scheduled(
                    logits, scheduled, self.vocab_size, self.eos_token_ids, self.grammar
                )
                read_back = False
            elif constrained and pending.sampled_rows.any_grammar:
                pending.logits = logits
                read_back = False
            else:
                self._sample(pending, logits)
                if publisher is not None:
                    assert pending.token_ids is not None  # set by _sample
                    publisher.share_tokens(pending.token_ids)
        if self.keep_hidden:
            self._keep_hidden(pending, scheduled, hidden, qsl)
        if read_back:
            self._queue_readback(pending)
        return pending

    @staticmethod
    def _keep_hidden(
        pending: PendingStep,
        scheduled: list[ScheduledSeq],
        hidden: torch.Tensor,
        qsl: Sequence[int] | None,
    ) -> None:
        """Each generating sequence's hidden rows into the step's result: all of a prefill
        chunk's, and of a verify step's those up to the last accepted token (the emitted
        tokens after the first are the accepted ones)."""
        assert qsl is not None  # upload() fills the host offsets
        emitted: dict[int, int] = {}
        if pending.verified is not None:
            emitted = {
                seq.seq_id: len(tokens)
                for seq, tokens in zip(pending.targets, pending.verified, strict=True)
            }
        for i, item in enumerate(scheduled):
            if item.pool:
                continue
            rows = int(qsl[i + 1]) - int(qsl[i])
            if item.draft_token_ids:
                rows = min(rows, emitted.get(item.seq.seq_id, 1))
            start = int(qsl[i])
            # a copy: a replayed CUDA graph's output buffer is overwritten by the next replay
            pending.result.hidden[item.seq.seq_id] = (
                item.start,
                hidden[start : start + rows].clone(),
            )

    def run_batch(
        self,
        batch: DeviceBatch,
        fed_token_ids: torch.Tensor | None,
        mm: MultimodalStep | None = None,
    ) -> torch.Tensor:
        """The forward of an uploaded batch: its hidden states. Rows whose input is a token of
        the step still running read it from ``fed_token_ids`` (that step's sampled ids) first,
        after the host→device copy and before the forward, so the eager model and the CUDA
        graphs (which copy ids into their static buffer) both read the patched ids."""
        if batch.fed_rows is not None:
            if fed_token_ids is None:
                raise RuntimeError("the step feeds on the sampled tokens of a step that has none")
            assert batch.fed_from is not None  # set together with fed_rows
            batch.ids.index_copy_(0, batch.fed_rows, fed_token_ids.index_select(0, batch.fed_from))
        return self.forward(batch.ids, batch.pos, batch.meta, mm)

    def start_masks(self, pending: PendingStep) -> None:
        """Start filling the token masks of a step :meth:`launch` left with its logits, on the
        grammar thread: each grammar first catches up with its sequence's known tokens (here,
        on the calling thread). A sequence finished by then, or whose grammar has ended, gets
        no mask (its token will be dropped). Until :meth:`sample_constrained` the step's
        matchers belong to the grammar thread."""
        assert pending.logits is not None and self.grammar is not None
        if pending.mask_fill is not None:
            return
        rows: list[int] = []
        states = []
        for j, seq in enumerate(pending.targets):
            state = seq.grammar
            if state is None or seq.status.is_finished:
                continue
            known = seq.num_output_tokens - seq.num_pending_tokens
            if state.sync(seq.output_token_ids, known) and not state.terminated:
                rows.append(j)
                states.append(state)
        pending.mask_rows = rows
        pending.mask_fill = self.grammar.start_fill(states) if states else False

    @torch.inference_mode()
    def sample_constrained(self, pending: PendingStep) -> None:
        """Sample a step :meth:`launch` left with its logits: wait for its masks
        (:meth:`start_masks`, started now if it was not), then sample and queue the
        read-back."""
        self.start_masks(pending)
        logits, pending.logits = pending.logits, None
        assert logits is not None  # kept by launch for this call
        fill, pending.mask_fill = pending.mask_fill, None
        if fill:
            assert self.grammar is not None  # a fill was started by it
            masks = self.grammar.take(fill)
            # rows are ascending targets: as many as the targets means every row has a mask
            rows = (
                None
                if len(pending.mask_rows) == len(pending.targets)
                else device_tensor(pending.mask_rows, torch.int64, logits.device)
            )
            self._sample(pending, logits, (masks, rows))
        else:
            self._sample(pending, logits)
        if self.step_publisher is not None:
            assert pending.token_ids is not None  # set by _sample
            self.step_publisher.share_tokens(pending.token_ids)
        self._queue_readback(pending)

    def _pool(self, pending: PendingStep, hidden: torch.Tensor, batch: DeviceBatch) -> None:
        """Pool every sequence of an embedding step (each one a whole input)."""
        if self.pooler is None:
            raise RuntimeError(
                "an embedding request reached a model runner without a pooler "
                "(the engine was built for generation)"
            )
        if len(pending.pool_targets) != batch.meta.num_seqs:
            raise RuntimeError(
                "an embedding step holds sequences that are not whole inputs to pool"
            )
        pending.pooled = self.pooler(hidden, batch.meta.query_start_loc)

    def _sample(
        self,
        pending: PendingStep,
        logits: torch.Tensor,
        grammar: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    ) -> None:
        """Sample ``logits`` [targets, V]; ``grammar`` is (masks, rows) of the rows a grammar
        constrains (rows None: every row, mask i for row i)."""
        targets = pending.targets
        if pending.sampled_rows.all_argmax:
            # Nothing to edit, filter or draw: the argmax of the logits as they are (widening
            # them to float32 first would not change it), masked where a grammar says so.
            pending.token_ids = (
                argmax_rows(logits) if grammar is None else masked_argmax(logits, *grammar)
            )
            return
        logits = logits.float()
        # Each row as it was at launch: its step (placeholders of earlier steps included) is the
        # index of the token drawn now, and its outputs are those before it (the step's own
        # placeholder, appended since when the draw waited for grammars, is not one).
        rows = []
        for seq, step in zip(targets, pending.sampled_rows.steps, strict=True):
            outputs = seq.output_token_ids
            rows.append(
                RowParams(
                    params=seq.params,
                    output_token_ids=outputs if len(outputs) == step else outputs[:step],
                    prompt_token_ids=seq.prompt_token_ids,
                    seed=child_seed(seq.params.seed, seq.index),
                    step=step,
                )
            )
        batch = SamplingBatch.build(
            rows, self.vocab_size, logits.device, eos_token_ids=self.eos_token_ids
        )
        if grammar is not None:
            batch.grammar_bitmask, batch.grammar_rows = grammar
        pending.sampled = self.sampler(logits, batch)
        pending.token_ids = pending.sampled.token_ids

    def _queue_readback(self, pending: PendingStep) -> None:
        """On a GPU, queue the copy of the token ids to pinned memory right behind the step
        and mark its end: collecting it then waits for this step only, not for the next one
        that async scheduling may have queued meanwhile."""
        if self.device.type != "cuda":
            return
        if pending.token_ids is not None:
            host = torch.empty(
                pending.token_ids.shape, dtype=pending.token_ids.dtype, pin_memory=True
            )
            host.copy_(pending.token_ids, non_blocking=True)
            pending.host_token_ids = host
        if pending.pooled is not None:
            host = torch.empty(pending.pooled.shape, dtype=pending.pooled.dtype, pin_memory=True)
            host.copy_(pending.pooled, non_blocking=True)
            pending.host_pooled = host
        pending.done = torch.cuda.Event()
        pending.done.record()

    def collect(self, pending: PendingStep) -> StepResult:
        """Wait for a launched step and read its tokens (and logprobs, pooled vectors)
        back."""
        result = pending.result
        if pending.verified is not None:
            return verified_result(pending.targets, pending.verified, result)
        if pending.token_ids is None and pending.pooled is None:
            return result
        if pending.done is not None:
            # Waits for this step only, with the GIL released, so the asyncio thread can turn
            # earlier tokens into text meanwhile.
            pending.done.synchronize()
        if pending.pooled is not None:
            pooled = pending.host_pooled if pending.host_pooled is not None else pending.pooled
            for seq, row in zip(pending.pool_targets, pooled.unbind(0)):
                result.pooled[seq.seq_id] = row
        if pending.token_ids is None:
            return result
        ids = pending.host_token_ids if pending.host_token_ids is not None else pending.token_ids
        tokens = ids.tolist()
        sampled = pending.sampled
        lps = ranks = top_ids = top_lps = None
        if sampled is not None and sampled.logprobs is not None:
            # Read directly: the engine collects a step with logprobs before it queues another.
            lps = sampled.logprobs.tolist()
            ranks = sampled.ranks.tolist() if sampled.ranks is not None else None
            top_ids = sampled.top_ids.tolist() if sampled.top_ids is not None else None
            top_lps = sampled.top_logprobs.tolist() if sampled.top_logprobs is not None else None
        for j, seq in enumerate(pending.targets):
            tok = SampledToken(tokens[j])
            want = seq.params.logprobs
            if want is not None and lps is not None:
                tok.logprob = lps[j]
                tok.rank = ranks[j] if ranks is not None else None
                if want and top_ids is not None and top_lps is not None:
                    tok.top = list(zip(top_ids[j][:want], top_lps[j][:want]))
            result.sampled[seq.seq_id] = tok
        return result

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's ``compute_logits`` (a CausalLM's or an encoder's; ``self.model`` is
        typed as the nn.Module it is)."""
        compute: Callable[[torch.Tensor], torch.Tensor] = getattr(self.model, "compute_logits")
        return compute(hidden)

    def _prompt_logprobs(
        self, hidden: torch.Tensor, item: ScheduledSeq
    ) -> list[dict[int, Logprob] | None]:
        """Logprobs of prompt tokens start+1 .. start+n given their prefixes (the first prompt
        token has no prefix: None)."""
        seq, start, n = item.seq, item.start, item.num_tokens
        k = seq.params.prompt_logprobs or 0
        logits = self.compute_logits(hidden).float()
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
