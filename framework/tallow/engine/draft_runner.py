"""The draft model of speculative decoding (``speculative.method: draft``), as the engine runs it:
built by the engine's own builder on the target's device, with a paged KV cache of its own,
and one draft sequence per target completion.

A draft sequence holds the tokens the draft has seen and how many of them have their K/V in
the draft's cache. :meth:`DraftRunner.sync` brings it up to a target completion's tokens: it
rolls back to the longest common prefix of what it computed and those tokens (the target
rejected the rest: the blocks past it go back to the draft's pool, the slots inside a kept
block are overwritten later), then feeds the tokens it has not seen (the whole prompt on the
first call, in chunks of at most the step budget; afterwards the tokens the target kept and
its own token) and returns the logits after the last one. :meth:`DraftRunner.extend` then feeds
one guessed token per sequence. Both take the sequences of a whole step at once, which share
the draft's forwards. Nothing is evicted: when the pool cannot hold a sequence's next
tokens, ``sync`` says so and the speculator proposes nothing for it this step.
"""

from __future__ import annotations

import logging
from typing import Literal, Sequence, TypeVar

import torch

from tallow.config import SpeculativeConfig, TallowConfig
from tallow.plugin import SelectionError, SpeculatorHost

from .builder import BuiltRunner, build_runner
from .kv_manager import KVCacheManager, PagedGroupSize
from .model_runner import ModelRunner
from .sampling.params import SamplingParams
from .scheduler import ScheduledSeq
from .sequence import Sequence as EngineSequence
from .sequence import SequenceStatus
from .tokenizer import Tokenizer

log = logging.getLogger("tallow.engine")

__all__ = ["DraftRunner", "draft_config", "forward_rows", "pack_round", "tokenizer_mismatch"]

#: the draft's share of the device memory left after its weights when no budget is set (GPU)
DEFAULT_GPU_KV_FRACTION = 0.5


_DTYPE_NAMES: dict[torch.dtype, Literal["float32", "bfloat16", "float16"]] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def draft_config(config: TallowConfig, host: SpeculatorHost) -> TallowConfig:
    """The configuration the draft model is built from: the engine's, with the model section
    taken from ``speculative.draft_*`` (on the target's device, its dtype unless
    ``draft_dtype`` says otherwise, the engine's ``max_model_len``), a cache of the draft's
    own budget without prefix caching, and no speculation of its own."""
    spec = config.speculative
    out = config.model_copy(deep=True)
    out.speculative = SpeculativeConfig()
    model = out.model
    model.source = spec.draft_model
    model.revision = None
    model.device = str(host.device)
    dtype = spec.draft_dtype
    model.dtype = _DTYPE_NAMES.get(host.dtype, "auto") if dtype in (None, "auto") else dtype
    model.max_model_len = host.max_model_len
    model.served_model_name = None
    model.weight_format = "auto"
    model.tokenizer = None
    model.isq = spec.draft_quantization
    model.quant_scheme = "auto"
    model.task = "generate"
    cache = out.cache
    cache.enable_prefix_caching = False
    cache.num_blocks = None
    cache.mem_mb = spec.draft_kv_cache_mb
    if spec.draft_kv_cache_mb is None:
        cache.kv_fraction = DEFAULT_GPU_KV_FRACTION
    return out


def tokenizer_mismatch(target: Tokenizer, draft: Tokenizer) -> str | None:
    """Why ``draft`` cannot propose tokens for a model of tokenizer ``target`` (None when the
    two have the same vocabulary, token for id, and the same special tokens)."""
    if target.vocab_size != draft.vocab_size:
        return f"{draft.vocab_size} tokens against the model's {target.vocab_size}"
    mine, theirs = target.get_vocab(), draft.get_vocab()
    if mine != theirs:
        differ = sorted((i, t) for t, i in theirs.items() if mine.get(t) != i) or sorted(
            (i, t) for t, i in mine.items() if theirs.get(t) != i
        )
        i, t = differ[0]
        return f"token {t!r} has id {theirs.get(t)} in the draft's vocabulary, {mine.get(t)} in the model's"
    if sorted(target.all_special_ids) != sorted(draft.all_special_ids):
        return (
            f"special token ids {sorted(draft.all_special_ids)} against the model's "
            f"{sorted(target.all_special_ids)}"
        )
    return None


def build_draft(config: TallowConfig, host: SpeculatorHost) -> BuiltRunner:
    """The draft model's runner for ``config`` (the engine's), checked against the target:
    a ValueError names ``speculative.draft_model`` and says what is wrong."""
    source = config.speculative.draft_model
    where = f"speculative.draft_model {source!r}"
    try:
        built = build_runner(draft_config(config, host), host.registries)
    except (ValueError, SelectionError, OSError, KeyError) as exc:
        raise ValueError(f"{where}: the draft model cannot be built: {exc}") from exc
    if built.loaded.task != "generate":
        raise ValueError(f"{where}: the draft model embeds; a draft model must generate")
    if built.runner.state_groups:
        raise ValueError(
            f"{where}: the draft model keeps a recurrent state per sequence, which cannot "
            "take rejected guesses back"
        )
    problem = tokenizer_mismatch(host.tokenizer, built.tokenizer)
    if problem is not None:
        raise ValueError(
            f"{where}: the draft model's tokenizer differs from that of {host.model_name} "
            f"({problem}); a draft model must share the model's tokenizer"
        )
    log.info(
        "draft model: %s (%s), KV cache of %d blocks", source, built.loaded.dtype, built.num_blocks
    )
    return built


T = TypeVar("T")


def pack_round(
    pending: list[tuple[T, int, int]], budget: int
) -> tuple[list[tuple[T, int, int]], list[tuple[T, int, int]]]:
    """One forward's share of ``pending`` runs ``(item, start, count)`` (``count`` rows from
    position ``start``): the runs taken in order while ``budget`` rows last, a run cut at the
    budget taking its first rows, and the runs left for later forwards."""
    taken: list[tuple[T, int, int]] = []
    later: list[tuple[T, int, int]] = []
    for item, start, count in pending:
        if budget <= 0:
            later.append((item, start, count))
            continue
        n = min(budget, count)
        taken.append((item, start, n))
        budget -= n
        if n < count:
            later.append((item, start + n, count - n))
    return taken, later


def forward_rows(runner: ModelRunner, rows: list[tuple[EngineSequence, int, int]]) -> torch.Tensor:
    """One forward of ``(seq, start, n)`` row groups of a speculator's own sequences: the
    output hidden states after the groups that end their sequence's tokens, in order (each
    sequence's computed count moves to ``start + n``)."""
    items = [
        ScheduledSeq(seq, start, n, sample_seqs=[seq] if start + n == seq.num_tokens else [])
        for seq, start, n in rows
    ]
    batch = runner.inputs.prepare(items)
    hidden = runner.run_batch(batch, None)
    for seq, start, n in rows:
        seq.num_computed_tokens = start + n
    return hidden.index_select(0, batch.sample_rows)


class DraftRunner:
    """The draft model's runner, its block pool and its sequences (see the module
    docstring). ``chunk`` is the most tokens one draft forward computes."""

    def __init__(self, built: BuiltRunner, chunk: int) -> None:
        self.runner = built.runner
        self.max_model_len = built.max_model_len
        self.chunk = max(1, int(chunk))
        self.blocks = KVCacheManager(
            built.group_sizes or [PagedGroupSize(built.num_blocks)],
            block_size=self.runner.block_size,
            enable_prefix_caching=False,
            max_step_tokens=self.chunk,
        )
        self._seqs: dict[tuple[str, int], EngineSequence] = {}
        self._params = SamplingParams(temperature=0.0)

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def sequence(self, request_id: str, index: int) -> EngineSequence | None:
        return self._seqs.get((request_id, index))

    def sync(
        self, requests: list[tuple[tuple[str, int], Sequence[int], int]]
    ) -> list[torch.Tensor | None]:
        """For each ``(key, token_ids, room)`` of ``requests`` (``key`` is ``(request_id,
        index)``, one request per key): the draft's logits ([vocab], float32) after
        ``token_ids``, with blocks for ``room`` more tokens reserved (the guesses
        :meth:`extend` feeds); None when the pool cannot hold them (the sequence keeps what it
        has computed). All sequences' tokens go through shared forwards of at most ``chunk``
        tokens."""
        # ((request, seq), next token, tokens unseen)
        pending: list[tuple[tuple[int, EngineSequence], int, int]] = []
        for i, (key, token_ids, room) in enumerate(requests):
            seq = self._prepare(key, token_ids, room)
            if seq is not None:
                start = seq.num_computed_tokens
                pending.append(((i, seq), start, seq.num_tokens - start))
        out: list[torch.Tensor | None] = [None] * len(requests)
        # rounds: each sequence's next chunk of its unseen tokens, packed into forwards
        while pending:
            rows, pending = pack_round(pending, self.chunk)
            logits = self._forward([(seq, start, n) for (_, seq), start, n in rows])
            ended = [i for (i, seq), start, n in rows if start + n == seq.num_tokens]
            for row, i in enumerate(ended):
                out[i] = logits[row]
        return out

    def _prepare(
        self, key: tuple[str, int], token_ids: Sequence[int], room: int
    ) -> EngineSequence | None:
        """``key``'s draft sequence rolled back to what it shares with ``token_ids`` and
        extended by the rest, its blocks reserved; None when they do not fit."""
        seq = self._seqs.get(key)
        if seq is None:
            seq = EngineSequence(key[0], key[1], [], self._params, status=SequenceStatus.RUNNING)
            self._seqs[key] = seq
        computed = seq.all_token_ids[: seq.num_computed_tokens]
        keep = 0
        limit = min(len(computed), len(token_ids) - 1)  # the last token is always fed
        while keep < limit and computed[keep] == token_ids[keep]:
            keep += 1
        seq.rewind(keep)
        self.blocks.trim(seq, keep)
        for t in token_ids[keep:]:
            seq.append_token(int(t))
        new = len(token_ids) - keep + room
        if not self.blocks.can_allocate(seq, new):
            return None
        copies = self.blocks.append_slots(seq, new)
        assert not copies  # no block is shared: no prefix caching, no forks
        return seq

    def extend(self, guesses: list[tuple[tuple[str, int], int]]) -> torch.Tensor:
        """Feed one guessed token to each of several sequences (``(key, token)``; slots
        reserved by :meth:`sync`) in one forward; the logits after each, in order."""
        rows = []
        for key, token in guesses:
            seq = self._seqs[key]
            seq.append_token(int(token))
            rows.append((seq, seq.num_tokens - 1, 1))
        return self._forward(rows)

    def _forward(self, rows: list[tuple[EngineSequence, int, int]]) -> torch.Tensor:
        """One forward of ``(seq, start, n)`` row groups; the logits after the groups that
        end their sequence's tokens, in order."""
        return self.runner.compute_logits(forward_rows(self.runner, rows)).float()

    def free(self, request_id: str, index: int) -> None:
        """Drop the draft sequence of a completion and give its blocks back."""
        seq = self._seqs.pop((request_id, index), None)
        if seq is not None:
            self.blocks.free(seq)
